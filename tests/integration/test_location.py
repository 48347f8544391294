"""METADATA served by workers and the three-level location hierarchy (§5.1), in process.

A master, two workers and a client share an in-memory coordinator and store through the
in-process transport — the cluster's code paths without sockets. METADATA is pre-split so a
lookup genuinely walks coordinator → root tablet → METADATA tablet → user tablet.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import pytest

from tabletstore.client.client import AsyncClient
from tabletstore.client.location import LocationCache
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import SetCell
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.errors import AlreadyExists, Fenced, InvalidArgument, NotServing, Unavailable
from tabletstore.master.master import Master
from tabletstore.metadata import rows as mt
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import TabletRecord, metadata_row_key
from tabletstore.options import IN_PROCESS_LEASE, WorkerOptions
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.messages import LoadTabletRequest, UnloadTabletRequest
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Method
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.worker.tablet_server import TabletServer

pytestmark = pytest.mark.timeout(120)

#: METADATA split so that tables named a... and z... have their rows in different tablets.
META_SPLIT = metadata_row_key("m", b"")


@dataclass
class Stack:
    coord: MemoryCoordinator
    store: MemoryObjectStore
    transport: InProcessTransport
    workers: list[TabletServer]
    master: Master
    client: AsyncClient

    def worker_at(self, address: str | None) -> TabletServer:
        return next(w for w in self.workers if w.address == address)

    def other(self, address: str | None) -> TabletServer:
        return next(w for w in self.workers if w.address != address)

    async def move(self, rec: TabletRecord, to: TabletServer | None = None) -> TabletServer:
        """Unload a tablet where it is served and load it on another worker."""
        src = self.worker_at(rec.location)
        dst = to or self.other(rec.location)
        await TABLET.client(self.transport, src.address).unload_tablet(
            UnloadTabletRequest(rec.table_id, rec.tablet_id)
        )
        await TABLET.client(self.transport, dst.address).load_tablet(
            LoadTabletRequest(rec.table_id, rec.tablet_id)
        )
        return dst


async def _stack(
    coord: MemoryCoordinator, store: MemoryObjectStore, splits: tuple[bytes, ...] = (META_SPLIT,)
) -> Stack:
    transport = InProcessTransport()
    workers = []
    for i in range(2):
        w = TabletServer(
            f"w{i}",
            f"inproc://w{i}",
            store=store,
            coordinator=coord,
            transport=transport,
            options=WorkerOptions(lease=IN_PROCESS_LEASE),
        )
        await w.start()
        transport.register(w.address, TABLET.handlers(w.services))
        workers.append(w)
    master = Master(coordinator=coord, transport=transport, metadata_splits=splits)
    await master.assign()
    client = AsyncClient(catalog=master.catalog, transport=transport, admin=master)
    return Stack(coord, store, transport, workers, master, client)


@pytest.fixture
async def stack() -> AsyncIterator[Stack]:
    coord = MemoryCoordinator()
    store = MemoryObjectStore()
    s = await _stack(coord, store)
    yield s
    await _stop(s)
    await coord.close()


async def _stop(s: Stack) -> None:
    # Without flushing: a worker's last record updates would otherwise wait for METADATA
    # tablets the other worker has already stopped serving (no master reassigns them here).
    for w in s.workers:
        await w.stop(flush=False)


def fresh_client(s: Stack, **kw: int) -> AsyncClient:
    return AsyncClient(
        catalog=s.master.catalog,
        transport=s.transport,
        admin=s.master,
        locations=LocationCache(s.coord, s.transport, **kw),
    )


async def test_bootstrap_creates_root_and_metadata_tablets_served_by_workers(
    stack: Stack,
) -> None:
    meta = await stack.master.catalog.list_tablets(mt.METADATA_TABLE_ID)
    assert [r.tablet_id for r in meta] == ["root", "m00000", "m00001"]
    assert [(r.start_row, r.end_row) for r in meta[1:]] == [
        (mt.ROOT_END, META_SPLIT),
        (META_SPLIT, None),
    ]
    assert all(r.location is not None and r.epoch > 0 for r in meta)
    root_kv = await stack.coord.get(paths.ROOT_TABLET)
    assert root_kv is not None and TabletRecord.from_bytes(root_kv.value) == meta[0]
    served = {k for w in stack.workers for k in w.tablets}
    assert {(r.table_id, r.tablet_id) for r in meta} <= served
    # The system table is hidden and reserved.
    assert await stack.client.list_tables() == []
    with pytest.raises(InvalidArgument, match="reserved"):
        await stack.client.create_table(mt.METADATA_TABLE, ["f"])
    with pytest.raises(InvalidArgument):
        await stack.client.delete_table(mt.METADATA_TABLE)
    # A second assignment round changes nothing.
    assert await stack.master.assign() == 0


async def test_lookups_walk_three_levels_once_then_hit_the_cache(stack: Stack) -> None:
    a = await stack.client.create_table("alpha", ["f"], split_keys=[b"g", b"p"])
    z = await stack.client.create_table("zulu", ["f"], split_keys=[b"g"])
    client = fresh_client(stack)
    stats = client.locations.stats
    for t in (client.table("alpha"), client.table("zulu")):
        for row in (b"a", b"h", b"q"):
            await t.mutate_row(row, [SetCell("f", b"q", row)])
    # alpha's and zulu's rows are in different METADATA tablets: two level-3 reads; one
    # level-2 read (it prefetched both METADATA tablets' rows); one coordinator read.
    assert stats.reads == {1: 1, 2: 1, 3: 2}
    before = stats.hits
    for t in (a, z):
        assert [r.key async for r in t.read_rows()] == [b"a", b"h", b"q"]
    assert (await client.table("zulu").read_row(b"q")) is not None
    assert stats.reads == {1: 1, 2: 1, 3: 2} and stats.hits > before


async def test_a_lookup_prefetches_the_following_metadata_rows(stack: Stack) -> None:
    splits = [b"%03d" % i for i in range(1, 40)]
    await stack.client.create_table("wide", ["f"], split_keys=splits)
    client = fresh_client(stack, prefetch=8)
    t = client.table("wide")
    await t.mutate_row(b"000", [SetCell("f", b"q", b"v")])
    reads = client.locations.stats.reads[3]
    for i in range(1, 8):  # tablets 1..7 were prefetched with tablet 0
        await t.mutate_row(b"%03d" % i, [SetCell("f", b"q", b"v")])
    assert client.locations.stats.reads[3] == reads
    await t.mutate_row(b"030", [SetCell("f", b"q", b"v")])
    assert client.locations.stats.reads[3] == reads + 1


async def test_concurrent_misses_of_a_table_share_one_metadata_read(stack: Stack) -> None:
    """Requests of a table all missing the cache at once (a new client, 32 reads in flight)
    wait for the first one's METADATA read, which prefetched their tablets, instead of each
    reading METADATA (§5.1); a row that read did not cover is read by its own request."""
    splits = [b"%03d" % i for i in range(1, 40)]
    await stack.client.create_table("busy", ["f"], split_keys=splits)
    client = fresh_client(stack, prefetch=8)
    t = client.table("busy")
    rows = [b"%03d" % (i % 8) for i in range(32)] + [b"030"]
    got = await asyncio.gather(*(t.read_row(row) for row in rows))
    assert got == [None] * len(rows)
    # One read for tablets 0..7 (prefetched together), one for tablet 30.
    assert client.locations.stats.reads[3] == 2


async def test_stale_locations_walk_up_the_hierarchy_transparently(stack: Stack) -> None:
    t = await stack.client.create_table("zeta", ["f"], split_keys=[b"m"])
    info = await stack.client._info("zeta")
    client = fresh_client(stack)
    table = client.table("zeta")
    for row in (b"a", b"x"):
        await table.mutate_row(row, [SetCell("f", b"q", row)])
    stats = client.locations.stats
    assert stats.reads == {1: 1, 2: 1, 3: 1}
    catalog = stack.master.catalog

    # Level 3 stale: the user tablet moved; the client re-reads its METADATA row.
    user = (await catalog.list_tablets(info.table_id))[0]
    await stack.move(user)
    assert (await table.read_row(b"a")) is not None
    assert stats.reads[3] == 2 and stats.invalidations >= 1

    # Level 2 stale too: the METADATA tablet holding zeta's rows moved as well.
    meta = next(
        r
        for r in await catalog.list_tablets(mt.METADATA_TABLE_ID)
        if r.contains(metadata_row_key(info.table_id, b"a"))
    )
    assert meta.tablet_id == "m00001"
    await stack.move(meta)
    user = (await catalog.list_tablets(info.table_id))[0]
    await stack.move(user)
    await table.mutate_row(b"b", [SetCell("f", b"q", b"b")])
    assert stats.reads[2] == 2

    # Level 1 stale: the root tablet moved, then everything below it.
    root = await catalog.get_tablet(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID)
    await stack.move(root)
    meta = await catalog.get_tablet(mt.METADATA_TABLE_ID, "m00001")
    await stack.move(meta)
    user = (await catalog.list_tablets(info.table_id))[0]
    await stack.move(user)
    await table.mutate_row(b"c", [SetCell("f", b"q", b"c")])
    assert stats.reads[1] == 2
    assert [r.key async for r in t.read_rows()] == [b"a", b"b", b"c", b"x"]


async def test_a_zombie_record_update_is_fenced_by_the_metadata_row_epoch(stack: Stack) -> None:
    await stack.client.create_table("fence", ["f"])
    info = await stack.client._info("fence")
    catalog = stack.master.catalog
    old = (await catalog.list_tablets(info.table_id))[0]
    await stack.move(old)
    new = (await catalog.list_tablets(info.table_id))[0]
    assert new.epoch > old.epoch and new.location != old.location
    with pytest.raises(Fenced):
        await catalog.update(old, replace(old, redo_seq=99))
    # The METADATA tablets' own records (rows of the root) and the root's (etcd) too.
    meta = await catalog.get_tablet(mt.METADATA_TABLE_ID, "m00000")
    with pytest.raises(Fenced):
        await catalog.update(replace(meta, epoch=meta.epoch - 1), meta)
    root = await catalog.get_tablet(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID)
    with pytest.raises(Fenced):
        await catalog.update(replace(root, epoch=root.epoch - 1), root)
    with pytest.raises(InvalidArgument, match="end row"):
        await catalog.update(new, replace(new, end_row=b"q"))


async def test_split_commit_and_a_half_done_split_is_finished_by_the_next_listing(
    stack: Stack,
) -> None:
    t = await stack.client.create_table("split", ["f"])
    info = await stack.client._info("split")
    catalog = stack.master.catalog
    parent = (await catalog.list_tablets(info.table_id))[0]
    await TABLET.client(stack.transport, parent.location or "").unload_tablet(
        UnloadTabletRequest(info.table_id, "t00000")
    )
    parent = (await catalog.list_tablets(info.table_id))[0]
    left = replace(parent, tablet_id="L", end_row=b"k", location=None)
    right = replace(parent, tablet_id="R", start_row=b"k", location=None)
    with pytest.raises(InvalidArgument, match="tile"):
        await catalog.replace_tablets([parent], [left, replace(right, start_row=b"j")])
    with pytest.raises(Fenced):
        await catalog.replace_tablets([replace(parent, epoch=parent.epoch + 5)], [left, right])
    await catalog.replace_tablets([parent], [left, right])
    assert [
        (r.tablet_id, r.start_row, r.end_row) for r in await catalog.list_tablets(info.table_id)
    ] == [
        ("L", b"", b"k"),
        ("R", b"k", None),
    ]
    # A crash after step 1 (the parent's row shrank and records the intent): the next listing
    # inserts the missing row and clears the intent.
    md = stack.master.locations
    r_now = (await catalog.list_tablets(info.table_id))[1]
    rl = replace(r_now, tablet_id="RL", end_row=b"s")
    rr = replace(r_now, tablet_id="RR", start_row=b"s")
    await md.check_and_mutate(
        r_now.row_key,
        mt.epoch_is(r_now.epoch),
        mt.record_mutations(rr) + mt.split_mutations([rl]),
        (),
    )
    assert [r.tablet_id for r in await catalog.list_tablets(info.table_id)] == ["L", "RL", "RR"]
    rows = await md.read_rows(*mt.table_range(info.table_id), start_inclusive=False)
    decoded = [mt.decode_row(r) for r in rows]
    assert [d.record.tablet_id for d in decoded if d] == ["L", "RL", "RR"]
    assert all(d is not None and not d.pending for d in decoded)
    # The master serves the new tablets and the data is all there.
    assert await stack.master.assign() == 3
    await t.mutate_row(b"a", [SetCell("f", b"q", b"1")])
    await t.mutate_row(b"z", [SetCell("f", b"q", b"2")])
    assert [r.key async for r in t.read_rows()] == [b"a", b"z"]


async def test_table_lifecycle_rows_in_metadata(stack: Stack) -> None:
    await stack.client.create_table("life", ["f"], split_keys=[b"k"])
    info = await stack.client._info("life")
    with pytest.raises(AlreadyExists):
        await stack.client.create_table("life", ["f"])
    assert len(await stack.master.catalog.list_tablets(info.table_id)) == 2
    await stack.client.delete_table("life")
    assert await stack.master.catalog.list_tablets(info.table_id) == []
    assert await stack.client.list_tables() == []


async def test_restart_recovers_metadata_from_the_logs_and_migrates_old_records() -> None:
    coord = MemoryCoordinator()
    store = MemoryObjectStore()
    # A table whose records an older version kept in the coordinator.
    legacy = Catalog(coord)
    schema = TableSchema(name="old", families={"f": ColumnFamily(name="f")})
    await legacy.create_table(schema, [TabletRecord("old-1", "t0", b"", None)])
    s = await _stack(coord, store)
    assert await coord.get_prefix(paths.TABLETS) == []
    t = await s.client.create_table(f"n{uuid.uuid4().hex[:6]}", ["f"])
    await s.client.table("old").mutate_row(b"r", [SetCell("f", b"q", b"v")])
    await t.mutate_row(b"r", [SetCell("f", b"q", b"w")])
    # Crash: no flush, so METADATA's own writes are only in the commit logs.
    await _stop(s)
    s2 = await _stack(coord, store)
    try:
        row = await s2.client.table("old").read_row(b"r")
        assert row is not None and row.cells[0].value == b"v"
        row = await s2.client.table(t.name).read_row(b"r")
        assert row is not None and row.cells[0].value == b"w"
    finally:
        await _stop(s2)
        await coord.close()


async def test_metadata_splits_apply_when_metadata_is_made_and_a_half_made_one_is_kept(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    coord = MemoryCoordinator()
    store = MemoryObjectStore()
    split = mt.metadata_split_keys(["m"])[0]
    real = Catalog._insert

    async def first_only(self: Catalog, rec: TabletRecord) -> None:
        if rec.tablet_id != "m00000":
            raise Unavailable("the bootstrap cut short on purpose")
        await real(self, rec)

    # A master made METADATA's first tablet, [ROOT_END, "m"), and stopped.
    monkeypatch.setattr(Catalog, "_insert", first_only)
    s = await _stack(coord, store, splits=(split,))
    monkeypatch.undo()

    def bounds() -> Any:
        return s.master.catalog.list_tablets(mt.METADATA_TABLE_ID)

    try:
        assert [(r.start_row, r.end_row) for r in (await bounds())[1:]] == [(mt.ROOT_END, split)]
        # Another master told to split elsewhere refuses to finish it: overlapping tablets.
        other = mt.metadata_split_keys(["q"])
        with caplog.at_level("ERROR", logger="tabletstore.master.master"):
            await Master(coordinator=coord, transport=s.transport, metadata_splits=other).assign()
        assert "begun with other split keys" in caplog.text
        assert len(await bounds()) == 2
        # One with the same splits finishes it.
        await Master(coordinator=coord, transport=s.transport, metadata_splits=[split]).assign()
        assert [(r.start_row, r.end_row) for r in (await bounds())[1:]] == [
            (mt.ROOT_END, split),
            (split, None),
        ]
        # Once it exists, other splits are reported, not applied.
        caplog.clear()
        with caplog.at_level("WARNING", logger="tabletstore.master.master"):
            await Master(coordinator=coord, transport=s.transport, metadata_splits=other).assign()
        assert "apply only when it is created" in caplog.text
        assert len(await bounds()) == 3
        # A table named from "m" on has its rows in the second METADATA tablet.
        await s.client.create_table("zeta", ["f"])
        zeta = (await s.client._info("zeta")).table_id
        assert mt.table_range(zeta)[0] > split
    finally:
        await _stop(s)
        await coord.close()


def test_metadata_split_prefixes_are_table_names() -> None:
    assert mt.metadata_split_keys(["q", "g"]) == [b"g", b"q"]
    with pytest.raises(InvalidArgument, match="table name"):
        mt.metadata_split_keys(["a b"])
    with pytest.raises(InvalidArgument, match="repeat"):
        mt.metadata_split_keys(["g", "g"])


class RefuseFirstWrite:
    """A transport that refuses the first mutate_rows (as a worker that is not serving the
    tablet would), then passes everything to ``inner``."""

    def __init__(self, inner: InProcessTransport) -> None:
        self.inner = inner
        self.refused = 0

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        if method is MUTATE and self.refused == 0:
            self.refused += 1
            raise NotServing("refused on purpose")
        return await self.inner.call(address, method, request, timeout=timeout)

    def stream(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[Any]:
        return self.inner.stream(address, method, request, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


MUTATE = TABLET.method(TabletService.mutate_rows)


async def test_a_failed_refresh_keeps_the_cached_location(stack: Stack) -> None:
    """One tablet's error makes the client read its location again; if the METADATA tablet
    holding it is down just then (being recovered), the cached location is kept and used, so
    writes to a tablet that never moved do not wait for METADATA."""
    await stack.client.create_table("alpha", ["f"], split_keys=[b"g"])
    transport = RefuseFirstWrite(stack.transport)
    client = AsyncClient(
        catalog=stack.master.catalog,
        transport=transport,  # type: ignore[arg-type]
        admin=stack.master,
        locations=LocationCache(stack.coord, stack.transport),
        retry_deadline=3.0,
    )
    info = await client._info("alpha")
    cached = await client.locations.locate(info.table_id, b"a")
    meta = await stack.master.catalog.get_tablet(mt.METADATA_TABLE_ID, "m00000")
    await TABLET.client(stack.transport, meta.location or "").unload_tablet(
        UnloadTabletRequest(mt.METADATA_TABLE_ID, "m00000")
    )
    assert await client.locations.locate(info.table_id, b"a", refresh=True) == cached
    assert client.locations.stats.stale == 1
    # A write refused once (refresh needed) still lands while METADATA is down.
    await client.table("alpha").mutate_row(b"a", [SetCell("f", b"q", b"1")])
    assert transport.refused == 1
    row = await client.table("alpha").read_row(b"a")
    assert row is not None and row.latest("f", b"q") == b"1"


async def test_a_failed_whole_table_refresh_keeps_the_cached_locations(stack: Stack) -> None:
    """A whole-table listing (``tablets(refresh=True)``: scans, flushes, a poller) that fails
    because the METADATA tablet holding the table's rows is being recovered keeps the cached
    entries: writes to the table's healthy tablets go on without reading METADATA. (Dropping
    them first stalled every writer of the chaos run until METADATA was served again, ~10 s
    per kill of its worker.)"""
    await stack.client.create_table("alpha", ["f"], split_keys=[b"g"])
    client = fresh_client(stack)
    info = await client._info("alpha")
    before = await client.locations.tablets(info.table_id, refresh=True)
    assert len(before) == 2
    meta = await stack.master.catalog.get_tablet(mt.METADATA_TABLE_ID, "m00000")
    await TABLET.client(stack.transport, meta.location or "").unload_tablet(
        UnloadTabletRequest(mt.METADATA_TABLE_ID, "m00000")
    )
    with pytest.raises(NotServing):
        await client.locations.tablets(info.table_id, refresh=True)
    reads = dict(client.locations.stats.reads)
    assert await client.locations.tablets(info.table_id) == before
    for row in (b"a", b"h"):
        await client.table("alpha").mutate_row(row, [SetCell("f", b"q", b"1")])
    assert client.locations.stats.reads == reads  # answered from the cache, no METADATA read


READ_ROWS = TABLET.method(TabletService.read_rows)


class RefuseFirstScan(RefuseFirstWrite):
    """Refuses the first read_rows stream (a tablet that moved), passes the rest on."""

    def stream(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[Any]:
        if method is READ_ROWS and self.refused == 0:
            self.refused += 1
            return self._refused()
        return self.inner.stream(address, method, request, timeout=timeout)

    async def _refused(self) -> AsyncIterator[Any]:
        raise NotServing("refused on purpose")
        yield  # an async generator


async def test_a_scan_refused_while_metadata_is_down_keeps_the_other_locations(
    stack: Stack,
) -> None:
    """A scan refused by one tablet reads the table's locations again; if METADATA is down
    just then, the scan waits for it, but the cache keeps the other tablets' locations: writes
    to them need no METADATA read (the scan used to drop the whole table's entries, stalling
    every writer of the chaos run until METADATA was back)."""
    await stack.client.create_table("alpha", ["f"], split_keys=[b"g"])
    transport = RefuseFirstScan(stack.transport)
    client = AsyncClient(
        catalog=stack.master.catalog,
        transport=transport,  # type: ignore[arg-type]
        admin=stack.master,
        locations=LocationCache(stack.coord, stack.transport),
        retry_deadline=1.0,
    )
    info = await client._info("alpha")
    assert len(await client.locations.tablets(info.table_id)) == 2
    meta = await stack.master.catalog.get_tablet(mt.METADATA_TABLE_ID, "m00000")
    await TABLET.client(stack.transport, meta.location or "").unload_tablet(
        UnloadTabletRequest(mt.METADATA_TABLE_ID, "m00000")
    )
    with pytest.raises(NotServing):
        async for _ in client.table("alpha").read_rows(start=b"a", end=b"c"):
            pass
    assert transport.refused == 1
    reads = dict(client.locations.stats.reads)
    for row in (b"a", b"h"):
        await client.table("alpha").mutate_row(row, [SetCell("f", b"q", b"1")])
    assert client.locations.stats.reads == reads  # answered from the cache
