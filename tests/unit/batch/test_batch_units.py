"""Pure pieces of the batch work: snapshot TTLs in the GC plan, the manifest's
format and checks, the Arrow SSTable writer's bytes, the new wire messages."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest

from tabletstore.batch import load_files as lf
from tabletstore.data.schema import TableSchema
from tabletstore.errors import Corruption, InvalidArgument, PermissionDenied
from tabletstore.keys import Cell, cell_sort_key
from tabletstore.master import gc_plan as gc
from tabletstore.master.bulk_load import source_prefix
from tabletstore.metadata.record import SSTableRef
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot
from tabletstore.rpc import messages as m
from tabletstore.rpc.codec import Codec
from tabletstore.rpc.wire import register_all
from tabletstore.sstable import SSTable
from tabletstore.sstable.format import SCHEMA
from tabletstore.sstable.writer import write_sstable, write_sstable_table
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo
from tabletstore.storage_s3.memory import MemoryObjectStore

SST = layout.sstable_key("t1", "t00000", "default", "a" * 32)
MANIFEST = layout.snapshot_key("t1", "s1")


def _plan(expiry: dict[str, float], now: float) -> gc.GcPlan:
    live = gc.LiveSet(
        tables=frozenset({"t1"}), snapshots={MANIFEST: frozenset({SST})}, snapshot_expiry=expiry
    )
    listed = [ObjectInfo(SST, 10, 0.0), ObjectInfo(MANIFEST, 10, 0.0)]
    return gc.plan(live, listed, now=now, grace=60.0)


def test_a_snapshot_pins_its_sstables_until_its_ttl_passes() -> None:
    kept = _plan({MANIFEST: 500.0}, now=400.0)
    assert kept.reasons[SST] == gc.Reason.KEEP_SNAPSHOT
    assert kept.reasons[MANIFEST] == gc.Reason.KEEP_LIVE_TABLE_SNAPSHOT
    expired = _plan({MANIFEST: 500.0}, now=500.0)
    # The manifest goes first; its SSTables stay pinned this round, then follow.
    assert expired.delete == (MANIFEST,)
    assert expired.reasons[MANIFEST] == gc.Reason.DELETE_EXPIRED_SNAPSHOT
    assert _plan({}, now=10_000.0).delete == ()


def _manifest(tablets: tuple[TabletSnapshot, ...]) -> SnapshotManifest:
    return SnapshotManifest("s1", "t", "t1", 1.5, None, TableSchema(name="t"), tablets)


def test_manifest_round_trips_and_refuses_gaps() -> None:
    ref = SSTableRef(SST, 10, 1, 1, 1, b"a", b"a", 5)
    good = _manifest(
        (
            TabletSnapshot("t0", b"", b"m", 7, {"default": (ref,)}),
            TabletSnapshot("t1", b"m", None, 9, {}),
        )
    )
    assert SnapshotManifest.from_bytes(good.to_bytes()) == good
    assert good.sstable_keys() == [SST]
    gap = _manifest(
        (TabletSnapshot("t0", b"", b"m", 7, {}), TabletSnapshot("t1", b"n", None, 9, {}))
    )
    with pytest.raises(Corruption, match="does not continue"):
        SnapshotManifest.from_bytes(gap.to_bytes(), name="x.json")
    with pytest.raises(Corruption, match=r"x\.json is malformed"):
        SnapshotManifest.from_bytes(b"{}", name="x.json")


def test_the_arrow_writer_writes_the_same_bytes() -> None:
    cells = sorted(
        (
            Cell(b"r%04d" % i, "cf", b"q%d" % j, 1000 - k, 10 + k, 0, b"v" * (i % 40))
            for i in range(800)
            for j in range(2)
            for k in range(2)
        ),
        key=cell_sort_key,
    )
    table = pa.Table.from_pylist([c._asdict() for c in cells], schema=SCHEMA)
    assert write_sstable_table(table, block_size=2048) == write_sstable(cells, block_size=2048)
    with pytest.raises(Exception, match="not sorted"):
        write_sstable_table(table.take(pa.array(range(len(cells) - 1, -1, -1))))


@pytest.mark.parametrize(
    "msg",
    [
        m.SnapshotHoldRequest("s1", "t1", ("t00000",), 5.0),
        m.SnapshotWriteRequest("s1", abort=True),
        m.SnapshotWriteResponse(True, (m.SnapshotTablet("t00000", b"{}", 7),)),
        m.BulkLoadTabletRequest("t1", "t00000", "file:///x", ("a.sst",)),
        m.BulkLoadTabletResponse(3),
        m.CreateSnapshotRequest("web", 60.0),
        m.ListSnapshotsResponse((m.SnapshotInfoMessage(b"{}"),)),
        m.DeleteSnapshotRequest("s1"),
        m.BulkLoadRequest("web", "s3://b/p"),
        m.BulkLoadResponse(2, 10),
    ],
)
def test_batch_messages_cross_the_wire(msg: object) -> None:
    codec = register_all(Codec())
    assert codec.decode(codec.encode(msg)) == msg


@pytest.mark.parametrize(
    ("start", "end"),
    [(b"", None), (b"r0100", b"r0300"), (b"r0100\x00", b"r0101"), (b"r0799", None), (b"s", None)],
)
async def test_read_arrow_reads_what_a_scan_reads(start: bytes, end: bytes | None) -> None:
    cells = sorted(
        (
            Cell(b"r%04d" % i, "cf", b"q%d" % j, 1000, 10 + j, 0, b"v" * (i % 40))
            for i in range(800)
            for j in range(3)
        ),
        key=cell_sort_key,
    )
    data, _ = write_sstable(cells, block_size=1024)
    store = MemoryObjectStore(f"memory://read-arrow-{start!r}-{end!r}")
    await store.create("x", data)
    table = await SSTable.open(store, "x", size=len(data))
    assert table.block_count > 10
    arrow = await table.read_arrow(start, end)
    scanned = [c async for c in table.scan(start, end)]
    assert [Cell(*r.values()) for r in arrow.to_pylist()] == scanned
    # Column projection: the same cells, those columns only.
    some = await table.read_arrow(start, end, ("row", "ts", "value"))
    assert some.column_names == ["row", "ts", "value"]
    assert some.to_pylist() == [{"row": c.row, "ts": c.ts, "value": c.value} for c in scanned]
    with pytest.raises(InvalidArgument, match="start with 'row'"):
        await table.read_arrow(start, end, ("value",))


async def test_staging_sstables_match_every_row_and_read_the_same() -> None:
    """A bulk-load staging file gets a row filter that matches every row (no per-row
    hashing); its cells read as any SSTable's."""
    from tabletstore.batch.load_files import awrite_sstables

    rows = [b"r%04d" % i for i in range(300)]
    store = MemoryObjectStore("memory://staging-bloom")
    data = {"row": rows, "family": ["cf"] * 300, "qualifier": [b"q"] * 300, "value": rows}
    (key,) = await awrite_sstables(data, "memory://staging-bloom", store=store, now_micros=5)
    size = len(await store.get(key) or b"")
    table = await SSTable.open(store, key, size=size)
    assert all(table.footer.row_bloom.may_contain(r) for r in (*rows, b"absent", b""))
    assert [c.row async for c in table.scan()] == rows


async def test_a_bulk_load_follows_a_tablet_that_split_under_it() -> None:
    """The worker refuses a tablet that split (NotServing: nothing of it committed); the
    master looks its range up again and loads exactly that range into the children."""
    from tabletstore.batch.load_files import SourceFile
    from tabletstore.errors import NotServing
    from tabletstore.master.bulk_load import _load_range
    from tabletstore.metadata.catalog import TableInfo
    from tabletstore.metadata.record import TabletRecord

    parent = [TabletRecord("t1", "a", b"", b"m"), TabletRecord("t1", "b", b"m", None)]
    children = [
        TabletRecord("t1", "a", b"", b"m"),
        TabletRecord("t1", "b1", b"m", b"s"),
        TabletRecord("t1", "b2", b"s", None),
    ]
    calls: list[tuple[str, bytes, bytes | None]] = []

    class Catalog:
        rounds = 0

        async def list_tablets(self, table_id: str) -> list[TabletRecord]:
            self.rounds += 1
            return parent if self.rounds == 1 else children

    class Worker:  # the TabletService stub the master hands to _load_range
        async def bulk_load_tablet(self, req: m.BulkLoadTabletRequest) -> object:
            calls.append((req.tablet_id, req.start_row, req.end_row))
            if req.tablet_id == "b":
                raise NotServing("split")
            return m.BulkLoadTabletResponse(10)

    async def locate(records: list[TabletRecord]) -> dict[str, str]:
        return {r.tablet_id: "w" for r in records}

    files = [SourceFile("f", 1, b"c", b"x", 30)]
    info = TableInfo("t1", TableSchema(name="t"))
    done = await _load_range(info, "file:///x", files, "L1", Catalog(), lambda _: Worker(), locate)  # type: ignore[arg-type]
    assert done == (3, 30)
    assert sorted(calls) == sorted(
        [("a", b"", b"m"), ("b", b"m", None), ("b1", b"m", b"s"), ("b2", b"s", None)]
    )


def test_bulk_load_marks_cover_rows_through_splits_and_merges() -> None:
    from tabletstore.engine.split_key import split_records
    from tabletstore.master.tablet_merges import MergePair, merged_record
    from tabletstore.metadata.record import BulkLoadMark, TabletRecord, uncovered

    rec = TabletRecord("t1", "a", b"c", b"x").with_bulk_loads((BulkLoadMark("L", b"c", b"x"),))
    assert TabletRecord.from_bytes(rec.to_bytes()) == rec
    assert uncovered(rec.bulk_loads, "L", b"c", b"x") == []
    assert uncovered(rec.bulk_loads, "M", b"c", b"x") == [(b"c", b"x")]
    left, right = split_records(
        rec, b"m", left_id="a1", right_id="a2", left_epoch=1, right_epoch=2, location=None, at=0
    )
    assert uncovered(left.bulk_loads, "L", b"c", b"m") == []
    assert uncovered(right.bulk_loads, "L", b"m", b"x") == []
    # A merge of a tablet that got load L with one that did not: only the first's rows are.
    other = TabletRecord("t1", "b", b"x", None)
    merged = merged_record(MergePair(right, other), tablet_id="c", at=0)
    assert uncovered(merged.bulk_loads, "L", b"m", None) == [(b"x", None)]
    spans = (
        BulkLoadMark("L", b"", b"d"),
        BulkLoadMark("L", b"f", b"h"),
        BulkLoadMark("X", b"", None),
    )
    assert uncovered(spans, "L", b"b", b"z") == [(b"d", b"f"), (b"h", b"z")]
    assert uncovered(spans, "L", b"", None) == [(b"d", b"f"), (b"h", None)]
    # A record keeps the newest marks only.
    many = rec.with_bulk_loads(tuple(BulkLoadMark(f"J{i}", b"", None) for i in range(100)))
    assert len(many.bulk_loads) == 64 and many.bulk_loads[-1].load_id == "J99"


def test_bulk_load_records_and_ids() -> None:
    from tabletstore.coordination import paths
    from tabletstore.errors import Corruption
    from tabletstore.master.bulk_load import LoadRecord, check_load_id

    rec = LoadRecord("job-1", "t1", "file:///x", "loading", 1.0)
    assert LoadRecord.from_bytes(rec.to_bytes()) == rec
    with pytest.raises(Corruption):
        LoadRecord.from_bytes(b'{"load_id": "x"}')
    assert paths.parse_bulk_load(paths.bulk_load("t1", "job-1")) == ("t1", "job-1")
    for bad in ("", "a/b", "-x", "x" * 129, "a b"):
        with pytest.raises(InvalidArgument, match="bad bulk load id"):
            check_load_id(bad)


class _ListedOnly:
    """A store that lists objects of given sizes and must never be read."""

    url = "memory://listed-only"

    def __init__(self, sizes: list[int]) -> None:
        self.sizes = sizes
        self.gets = 0

    async def list(self, prefix: str, *, start_after: str | None = None) -> Any:
        for i, size in enumerate(self.sizes):
            yield ObjectInfo(f"{prefix}f{i:05d}", size, 0.0)

    async def get(self, key: str) -> bytes | None:
        self.gets += 1
        raise AssertionError(f"{key} was fetched")


@pytest.mark.parametrize(
    ("sizes", "limit"),
    [
        ([10, lf.MAX_LOAD_FILE_BYTES + 1], f"MAX_LOAD_FILE_BYTES={lf.MAX_LOAD_FILE_BYTES}"),
        ([10] * (lf.MAX_LOAD_FILES + 1), f"MAX_LOAD_FILES={lf.MAX_LOAD_FILES}"),
    ],
)
async def test_a_load_over_its_limits_is_refused_from_the_listing(
    sizes: list[int], limit: str
) -> None:
    store = _ListedOnly(sizes)
    with pytest.raises(InvalidArgument, match=limit):
        await lf.inspect_sources(store, TableSchema(name="t"), prefix="staging/u/job/")  # type: ignore[arg-type]
    assert store.gets == 0


@pytest.mark.parametrize(
    "source",
    [
        "file:///etc",
        "s3://bucket/db/tables/t1?endpoint_url=http://127.0.0.1:1",
        "s3://bucket/db/staging/alice/job?endpoint_url=http://127.0.0.1:1",
        "s3://bucket/db/staging/bob/job?endpoint_url=http://s3:9000",
        "s3://other/db/staging/alice/job?endpoint_url=http://s3:9000",
        "s3://bucket/db/staging/alice/a/b?endpoint_url=http://s3:9000",
        "s3://bucket/db/staging/alice/?endpoint_url=http://s3:9000",
    ],
)
def test_a_load_source_outside_the_callers_staging_area_is_refused(source: str) -> None:
    with pytest.raises(PermissionDenied, match="staging/alice/LOAD-NAME"):
        source_prefix("s3://bucket/db?endpoint_url=http://s3:9000", "alice", source)


def test_a_load_source_names_the_callers_staging_area() -> None:
    store = "s3://bucket/db?endpoint_url=http://s3:9000"
    assert source_prefix(store, "alice", "job") == "staging/alice/job/"
    assert source_prefix(store, "a/b%", "job") == "staging/a%2Fb%25/job/"
    url = layout.staging_url(store, "alice", "job")
    assert url == "s3://bucket/db/staging/alice/job?endpoint_url=http://s3:9000"
    assert source_prefix(store, "alice", url) == "staging/alice/job/"
    with pytest.raises(InvalidArgument):
        source_prefix(store, "alice", "..")
