"""Splits, merges and balancing through the client (§5, §5.2), in one process.

* a table written past a tiny split size splits (the worker commits the split in METADATA and
  serves both children), and every row reads back through the client, which follows
  ``NotServing`` to the children; writes go on to the children;
* a second worker is added: the master's balancing rounds move tablets to it, with nothing
  lost (moved tablets are flushed first, so the new owner replays nothing);
* two small adjacent tablets are merged by the master into one;
* merging and major compactions run in a process pool when the worker has one;
* (slow) the same split with real processes: a master and two workers over etcd and S3.

The cluster in the fast tests is the embedded stack's pieces wired by hand (memory store and
coordinator, in-process transport) with one or two workers, so master rounds are driven by
the test; tests/integration/test_cluster.py has balancing with real processes.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import itertools
import os
import pickle
import random
import signal
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest

from tabletstore import connect_async
from tabletstore.client.client import AsyncClient
from tabletstore.client.table import AsyncTable
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import DeleteRow, RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.engine.split_key import owns_its_sstables
from tabletstore.errors import TabletStoreError, Unavailable
from tabletstore.master.master import Master
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import TabletRecord
from tabletstore.options import IN_PROCESS_LEASE, MasterOptions, TabletOptions, WorkerOptions
from tabletstore.process_pool import ProcessPool
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.messages import LoadTabletRequest, UnloadTabletRequest
from tabletstore.rpc.services import TABLET
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.worker.splits import TabletSplits
from tabletstore.worker.tablet_server import TabletServer
from tests.integration.cluster_harness import Cluster, placement, table_id_of
from tests.integration.cluster_harness import eventually as harness_eventually
from tests.plugins.s3_server import boto3_client

pytestmark = pytest.mark.timeout(120)

SPLIT = TabletOptions(split_bytes=24 * 1024, memtable_flush_bytes=64 * 1024)


async def eventually(check: Callable[[], Awaitable[bool]], *, deadline: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        await asyncio.sleep(0.05)


async def read_all(table: AsyncTable) -> dict[bytes, bytes]:
    return {r.key: r.cells[0].value async for r in table.read_rows()}


async def write(table: AsyncTable, rows: dict[bytes, bytes]) -> None:
    items = list(rows.items())
    for i in range(0, len(items), 200):
        await table.mutate_rows(
            [RowMutation(k, (SetCell("f", b"c", v),)) for k, v in items[i : i + 200]]
        )


def user_tablets(server: TabletServer) -> list[tuple[str, str]]:
    return [k for k in server.tablets if not k[0].startswith("!")]


@dataclass
class SplitWorkload:
    """Writers (single-row and batched, none idempotent: no explicit timestamps) and a scanner
    with point reads, run against a table while it splits. A split is never
    the caller's problem: any error that reaches them fails the test. Every row is written
    once, with a random value, so every value read can be checked."""

    table: AsyncTable
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    #: Every row sent, with its value (sent, so it may be read before it is acknowledged).
    sent: dict[bytes, bytes] = field(default_factory=dict)
    acked: dict[bytes, bytes] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    scans: int = 0

    def _row(self, rnd: random.Random, who: str, seq: int) -> tuple[bytes, bytes]:
        # A random prefix spreads the rows over the key space (every tablet gets writes).
        row = b"%08x-%s-%06d" % (rnd.getrandbits(32), who.encode(), seq)
        value = rnd.randbytes(150)  # incompressible: SSTable bytes grow with the data
        self.sent[row] = value
        return row, value

    async def _guard(self, body: Awaitable[None]) -> None:
        try:
            await body
        except BaseException as exc:
            self.errors.append(exc)
            self.stop.set()
            raise

    async def single(self, n: int) -> None:
        rnd = random.Random(n)
        for seq in itertools.count():
            if self.stop.is_set():
                return
            row, value = self._row(rnd, f"s{n}", seq)
            await self.table.mutate_row(row, [SetCell("f", b"c", value)])
            self.acked[row] = value

    async def batched(self, n: int, size: int = 20) -> None:
        rnd = random.Random(1000 + n)
        for seq in itertools.count():
            if self.stop.is_set():
                return
            batch = [self._row(rnd, f"b{n}", seq * size + i) for i in range(size)]
            await self.table.mutate_rows(
                [RowMutation(r, (SetCell("f", b"c", v),)) for r, v in batch]
            )
            self.acked.update(batch)

    async def scanner(self) -> None:
        rnd = random.Random(7)
        while not self.stop.is_set():
            before = dict(self.acked)
            seen = set()
            async for row in self.table.read_rows():
                assert row.cells[0].value == self.sent[row.key], f"wrong value read: {row.key!r}"
                seen.add(row.key)
            missing = before.keys() - seen
            assert not missing, f"{len(missing)} acknowledged rows missing from a scan"
            self.scans += 1
            await asyncio.sleep(0.01)  # in-process calls may never suspend: let writers run
            if before:
                key = rnd.choice(sorted(before))
                got = await self.table.read_row(key)
                assert got is not None and got.cells[0].value == before[key]

    def start(self, *, singles: int = 3, batches: int = 2) -> list[asyncio.Task[None]]:
        bodies = [self.single(n) for n in range(singles)]
        bodies += [self.batched(n) for n in range(batches)]
        bodies.append(self.scanner())
        return [asyncio.ensure_future(self._guard(b)) for b in bodies]

    async def finish(self, tasks: list[asyncio.Task[None]]) -> None:
        """Stop the writers; raise the first error any of them met."""
        self.stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.errors:
            raise AssertionError(f"an error reached the caller: {self.errors[0]!r}") from (
                self.errors[0]
            )


async def run_while_splitting(
    workload: SplitWorkload, tablets: Callable[[], Awaitable[int]], *, splits: int, deadline: float
) -> None:
    """Run ``workload`` until the table has split into ``splits`` tablets (and a few more
    writes went to the children), then stop it; any error fails the test."""
    tasks = workload.start()
    try:

        async def split_enough() -> bool:
            return bool(workload.errors) or await tablets() >= splits

        await eventually(split_enough, deadline=deadline, what=f"{splits} tablets")
        target = len(workload.acked) + 100

        async def more_writes() -> bool:
            return bool(workload.errors) or len(workload.acked) >= target

        await eventually(more_writes, deadline=deadline, what="100 more writes after the splits")
    finally:
        await workload.finish(tasks)
    assert workload.scans > 0


async def test_a_table_written_past_the_split_size_splits(tmp_path: Path) -> None:
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, split_cooldown=0.2)
    db = await Database.open(f"file://{tmp_path}", tablet_options=SPLIT, worker_options=wopts)
    try:
        table = await db.create_table("t", ["f"])
        rnd = random.Random(1)  # incompressible values: SSTable bytes grow with the data
        rows = {b"r%05d" % i: rnd.randbytes(150) for i in range(1200)}
        await write(table, rows)
        rows[b"r00003"] = b"deleted"
        await table.mutate_rows([RowMutation(b"r00003", (DeleteRow(),))])
        del rows[b"r00003"]
        await db.flush("t")
        table_id = (await db.master.catalog.get_table("t")).table_id

        async def split() -> bool:
            tablets = await db.master.catalog.list_tablets(table_id)
            splits = db.worker.splits
            return len(tablets) >= 3 and not splits.running and not splits.compactions

        await eventually(split, deadline=60, what="the table splits into >= 3 tablets")
        tablets = await db.master.catalog.list_tablets(table_id)
        assert tablets[0].start_row == b"" and tablets[-1].end_row is None
        for a, b in itertools.pairwise(tablets):
            assert a.end_row == b.start_row, "children tile the table"
        assert any(e.kind == "split" for t in tablets for e in t.events)
        assert await read_all(table) == rows
        row = await table.read_row(b"r00700")
        assert row is not None and row.cells[0].value == rows[b"r00700"]
        # Writes go on, to the children.
        more = {b"r%05d" % i: b"new" for i in range(0, 1200, 97)}
        await write(table, more)
        rows |= more
        assert await read_all(table) == rows
    finally:
        await db.close()
    # Reopened (a new worker incarnation recovers every child): still every row.
    async with await Database.open(db.url) as again:
        assert await read_all(again.table("t")) == rows


async def test_a_load_of_a_child_sent_while_the_split_serves_it_finds_it_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A master round that read the claims before a split and the tablets after it sees a
    child unclaimed and may send its load to the splitting worker while the split is still
    opening that child. The load waits for the split (it holds the children's tablet locks
    until they are served) and finds the child served: one copy of it, its claim kept, every
    row readable and writable. (Without the locks, the load opened a second copy beside the
    split's, and released the claim when it failed.)"""
    # No flush before the test's own (the memtable holds every row, the log is never
    # trimmed), so the one split comes after it: a split while the rows are being written
    # would hold the writes to its paused child.
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, split_cooldown=60, log_trim_interval=None)
    topts = replace(SPLIT, memtable_flush_bytes=4 * 1024 * 1024)
    db = await Database.open(f"file://{tmp_path}", tablet_options=topts, worker_options=wopts)
    server = db.worker
    gate = asyncio.Event()
    armed = False
    paused: asyncio.Future[TabletRecord] = asyncio.get_running_loop().create_future()
    opened: list[str] = []
    real_open = server.open_and_serve

    async def open_and_serve(record: TabletRecord, *args: Any, **kwargs: Any) -> Any:
        opened.append(record.tablet_id)
        if armed and kwargs.get("before_serving") is not None and not paused.done():
            paused.set_result(record)  # the split's first child: hold it here
            await gate.wait()
        return await real_open(record, *args, **kwargs)

    monkeypatch.setattr(server, "open_and_serve", open_and_serve)
    try:
        table = await db.create_table("t", ["f"])
        rnd = random.Random(3)
        rows = {b"r%05d" % i: rnd.randbytes(150) for i in range(1200)}
        await write(table, rows)
        user_tablets = [k for k in server.tablets if not k[0].startswith("!")]
        assert len(user_tablets) == 1 and not server.splits.running, "no split yet"
        armed = True
        await db.flush("t")
        child = await asyncio.wait_for(paused, timeout=60)
        key = (child.table_id, child.tablet_id)
        assert server.tablet_lock(key).locked(), "the split holds the child's lock while serving it"
        load = asyncio.ensure_future(server.load(LoadTabletRequest(*key)))
        await asyncio.sleep(0.05)  # let the load run as far as it can
        assert not load.done()
        gate.set()
        await asyncio.wait_for(load, timeout=60)
        assert opened.count(child.tablet_id) == 1, "the child was opened once"
        assert key in server.tablets
        claim = await db.coordinator.get(paths.claim(*key))
        assert claim is not None and claim.value == server.worker_id.encode()

        async def split_done() -> bool:
            return not server.splits.running

        await eventually(split_done, deadline=60, what="the split finishes")
        assert await read_all(table) == rows
        more = {k: b"new" for k in sorted(rows)[::50]}
        await write(table, more)
        rows |= more
        assert await read_all(table) == rows
    finally:
        gate.set()
        await db.close()
    async with await Database.open(db.url) as again:
        assert await read_all(again.table("t")) == rows


async def test_a_workers_splits_run_one_at_a_time_and_refuse_writes_only_for_their_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tablets written evenly reach the split size together. Their splits run one after the
    other (side by side, each one's pause of writes grew with the others'); each claims its
    children while the parent still takes writes, and releases the parent's claim only once
    both children are served."""
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, split_cooldown=60, log_trim_interval=None)
    topts = replace(SPLIT, memtable_flush_bytes=4 * 1024 * 1024)
    db = await Database.open(f"file://{tmp_path}", tablet_options=topts, worker_options=wopts)
    server = db.worker
    events: list[tuple[str, tuple[str, str], bool | frozenset[tuple[str, str]]]] = []
    committing = 0
    most = 0
    real_claim, real_release = server.claim_new, server.release_claim
    real_replace = server.catalog.replace_tablets

    async def claim_new(key: tuple[str, str]) -> int:
        refusing = any(t.writes_refused_since is not None for t in server.tablets.values())
        events.append(("claim", key, refusing))
        return await real_claim(key)

    async def release_claim(key: tuple[str, str]) -> None:
        events.append(("release", key, frozenset(server.tablets)))
        await real_release(key)

    async def replace_tablets(old: list[TabletRecord], new: list[TabletRecord]) -> None:
        nonlocal committing, most
        committing += 1
        most = max(most, committing)
        try:
            await asyncio.sleep(0.05)  # side by side, two splits would both be in here
            await real_replace(old, new)
        finally:
            committing -= 1

    monkeypatch.setattr(server, "claim_new", claim_new)
    monkeypatch.setattr(server, "release_claim", release_claim)
    monkeypatch.setattr(server.catalog, "replace_tablets", replace_tablets)
    try:
        table = await db.create_table("t", ["f"], split_keys=[b"r1", b"r2", b"r3"])
        rnd = random.Random(5)
        rows = {b"r%d%04d" % (i % 4, i): rnd.randbytes(150) for i in range(2400)}
        await write(table, rows)
        assert len(user_tablets(server)) == 4 and not server.splits.running, "no split yet"
        await db.flush("t")  # every tablet past the split size at once

        async def split() -> bool:
            return len(user_tablets(server)) == 8 and not server.splits.running

        await eventually(split, deadline=60, what="four splits")
        assert most == 1, "splits of one worker commit one at a time"
        claims = [e for e in events if e[0] == "claim"]
        assert len(claims) == 8
        assert not any(refusing for _, _, refusing in claims), (
            "children are claimed while no tablet refuses writes"
        )
        parents = [e for e in events if e[0] == "release"]
        assert len(parents) == 4
        for n, (_, parent, served) in enumerate(parents):
            children = {claims[2 * n][1], claims[2 * n + 1][1]}
            assert parent not in served and isinstance(served, frozenset)
            assert children <= served, "the parent's claim goes once its children serve"
        assert await read_all(table) == rows
    finally:
        await db.close()


async def test_writes_reads_and_scans_go_on_while_a_table_splits(tmp_path: Path) -> None:
    """Writing past split_bytes into the embedded default while writers and
    a scanner run. A write refused because its tablet is splitting (NotServing for its entry
    of a MutateRows response) is sent again to the children; no error reaches the caller and
    every acknowledged write reads back, before and after a reopen."""
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, split_cooldown=0.05)
    topts = TabletOptions(split_bytes=24 * 1024, memtable_flush_bytes=16 * 1024)
    db = await Database.open(f"file://{tmp_path}", tablet_options=topts, worker_options=wopts)
    try:
        table = await db.create_table("t", ["f"])
        table_id = (await db.master.catalog.get_table("t")).table_id
        workload = SplitWorkload(table)

        async def tablets() -> int:
            return len(await db.master.catalog.list_tablets(table_id))

        await run_while_splitting(workload, tablets, splits=5, deadline=90)
        assert await read_all(table) == workload.acked
    finally:
        await db.close()
    async with await Database.open(db.url) as again:
        assert await read_all(again.table("t")) == workload.acked


@dataclass
class InProcessCluster:
    """A master and workers sharing a memory store and coordinator over in-process calls."""

    master_options: MasterOptions
    tablet_options: TabletOptions | None = None
    store: MemoryObjectStore = field(default_factory=MemoryObjectStore)
    coordinator: MemoryCoordinator = field(default_factory=MemoryCoordinator)
    transport: InProcessTransport = field(default_factory=InProcessTransport)
    workers: list[TabletServer] = field(default_factory=list)
    master: Master | None = None

    async def add_worker(self) -> TabletServer:
        n = len(self.workers)
        server = TabletServer(
            f"w{n}",
            f"inproc://w{n}",
            store=self.store,
            coordinator=self.coordinator,
            transport=self.transport,
            options=WorkerOptions(lease=IN_PROCESS_LEASE),
            tablet_options=self.tablet_options,
        )
        await server.start()
        self.transport.register(server.address, TABLET.handlers(server.services))
        self.workers.append(server)
        return server

    async def start(self) -> AsyncClient:
        await self.add_worker()
        self.master = Master(
            coordinator=self.coordinator, transport=self.transport, options=self.master_options
        )
        await self.master.assign()
        return AsyncClient(catalog=self.master.catalog, transport=self.transport, admin=self.master)

    async def close(self) -> None:
        for server in reversed(self.workers):
            await server.stop(flush=True)
        await self.coordinator.close()


@asynccontextmanager
async def cluster(options: MasterOptions) -> AsyncIterator[tuple[InProcessCluster, AsyncClient]]:
    c = InProcessCluster(options)
    client = await c.start()
    try:
        yield c, client
    finally:
        await c.close()


async def test_an_added_worker_gets_tablets() -> None:
    opts = MasterOptions(balance_cooldown=0.0, merge_after=None)
    async with cluster(opts) as (c, client):
        assert c.master is not None
        table = await client.create_table("grow", ["f"], split_keys=[b"c", b"f", b"i", b"l", b"o"])
        rows = {f"{p}{i:02d}".encode(): b"x" * (i + 1) for p in "abdegjmpz" for i in range(20)}
        await write(table, rows)
        await client.flush("grow")
        first = c.workers[0]
        assert len(user_tablets(first)) == 6
        added = await c.add_worker()
        for _ in range(5):
            await c.master.assign()
            await c.master.balancer.run_round()
        assert len(user_tablets(added)) >= 2
        assert len(user_tablets(first)) + len(user_tablets(added)) == 6
        # METADATA stays put; moved tablets were flushed, so they list no log to replay.
        assert all(k[0].startswith("!") for k in first.tablets if k not in user_tablets(first))
        for key in user_tablets(added):
            record = added.tablets[key].record
            assert record.events[-1].kind == "loaded"
            assert any(e.kind == "unloaded" for e in record.events)
        assert await read_all(table) == rows
        # Balanced: the next rounds move nothing more.
        moved, _ = await c.master.balancer.run_round()
        assert moved == 0


async def test_two_small_adjacent_tablets_are_merged() -> None:
    opts = MasterOptions(merge_after=0.0, split_bytes=1 << 20)
    async with cluster(opts) as (c, client):
        assert c.master is not None
        table = await client.create_table("m", ["f"], split_keys=[b"m"])
        rows = {b"a1": b"1", b"b2": b"2", b"n3": b"3", b"z4": b"4"}
        await write(table, rows)
        await table.mutate_rows([RowMutation(b"b2", (DeleteRow(),))])
        del rows[b"b2"]
        table_id = (await client.catalog.get_table("m")).table_id
        assert len(await c.master.catalog.list_tablets(table_id)) == 2
        _, merged = await c.master.balancer.run_round()
        assert merged == 1
        tablets = await c.master.catalog.list_tablets(table_id)
        assert len(tablets) == 1
        assert (tablets[0].start_row, tablets[0].end_row) == (b"", None)
        assert tablets[0].events[-1].kind in ("merged", "loaded", "assigned")
        assert await read_all(table) == rows
        await write(table, {b"c5": b"5"})
        rows[b"c5"] = b"5"
        assert await read_all(table) == rows
        # One tablet left: nothing more to merge.
        assert (await c.master.balancer.run_round())[1] == 0


async def test_compactions_run_in_a_process_pool() -> None:
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, compaction_processes=1)
    db = await Database.open(f"memory://pool-{uuid.uuid4().hex}", worker_options=wopts)
    try:
        assert db.worker._executor is not None
        table = await db.create_table("p", ["f"])
        rows: dict[bytes, bytes] = {}
        for round_ in range(3):
            batch = {b"k%03d" % i: b"v%d" % round_ for i in range(50)}
            await write(table, batch)
            rows |= batch
            await db.flush("p")
        await db.compact("p")
        table_id = (await db.master.catalog.get_table("p")).table_id
        (record,) = await db.master.catalog.list_tablets(table_id)
        assert sum(len(v) for v in record.sstables.values()) == 1
        assert any(e.kind == "major_compaction" for e in record.events)
        assert await read_all(table) == rows
    finally:
        await db.close()


async def test_compactions_go_on_after_their_process_is_killed() -> None:
    """A compaction process killed (the OOM killer) breaks its pool for good: the worker
    replaces the pool, and the compactions, direct and background, go on in the new one."""
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, compaction_processes=1)
    db = await Database.open(f"memory://killed-{uuid.uuid4().hex}", worker_options=wopts)
    try:
        pool = db.worker._executor
        assert isinstance(pool, ProcessPool)
        # Below the worker's CPU priority: its requests get a busy host's cores first.
        niceness = await pool.run(functools.partial(os.nice, 0))
        assert niceness == min(19, os.nice(0) + wopts.compaction_nice)
        table = await db.create_table("p", ["f"])
        rows: dict[bytes, bytes] = {}
        for round_ in range(6):
            batch = {b"k%03d" % i: b"v%d" % round_ for i in range(50)}
            await write(table, batch)
            rows |= batch
            await db.flush("p")
            if round_ in (1, 3):
                await db.compact("p")
                for pid in list(pool.pool._processes or {}):
                    os.kill(pid, signal.SIGKILL)
        await db.compact("p")
        assert pool.renewals >= 1
        table_id = (await db.master.catalog.get_table("p")).table_id
        (record,) = await db.master.catalog.list_tablets(table_id)
        assert sum(len(v) for v in record.sstables.values()) == 1
        assert await read_all(table) == rows
    finally:
        await db.close()


async def test_compactions_send_their_processes_no_sstable_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SSTables a merge or a major compaction rewrites in the compaction processes travel
    as parcels (engine/parcel.py), not in the pickled call: pickling holds the event loop."""
    sent: list[int] = []
    submit = concurrent.futures.ProcessPoolExecutor.submit

    def measured(self: Any, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        sent.append(len(pickle.dumps((fn, args, kwargs))))
        return submit(self, fn, *args, **kwargs)

    monkeypatch.setattr(concurrent.futures.ProcessPoolExecutor, "submit", measured)
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, compaction_processes=1)
    db = await Database.open(f"memory://parcels-{uuid.uuid4().hex}", worker_options=wopts)
    try:
        table = await db.create_table("p", ["f"])
        rows: dict[bytes, bytes] = {}
        for _ in range(3):  # three SSTables of 500 KB of random values
            batch = {b"k%03d" % i: random.randbytes(10_000) for i in range(50)}
            await write(table, batch)
            rows |= batch
            await db.flush("p")
        await db.compact("p")
        assert await read_all(table) == rows
    finally:
        await db.close()
    assert sent and max(sent) < 16_384, sent


async def test_a_merge_cut_short_is_finished_by_the_next_listing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A crash between the merge's two METADATA steps (the right row rewritten, the left row
    not yet deleted) leaves a row inside the merged range: listing deletes it, so it is never
    assigned, and every row reads back from the merged tablet."""
    opts = MasterOptions(merge_after=0.0, split_bytes=1 << 20)
    async with cluster(opts) as (c, client):
        assert c.master is not None
        table = await client.create_table("cut", ["f"], split_keys=[b"m"])
        rows = {b"a": b"1", b"z": b"2"}
        await write(table, rows)
        table_id = (await client.catalog.get_table("cut")).table_id

        async def crash(self: Catalog, rec: TabletRecord) -> None:
            raise Unavailable("the master died between the merge's steps")

        with monkeypatch.context() as m:
            m.setattr(Catalog, "_delete_leftover", crash)
            assert (await c.master.balancer.run_round())[1] == 0
        listed = await c.master.catalog.list_tablets(table_id)
        assert len(listed) == 1 and (listed[0].start_row, listed[0].end_row) == (b"", None)
        assert any(e.kind == "merged" for e in listed[0].events)
        await c.master.assign()
        assert await read_all(table) == rows


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_a_process_cluster_splits_and_reads_everything_back(
    etcd_server: str, s3_server: str, tmp_path: Path
) -> None:
    """Real processes (master and two workers with compaction process pools, etcd, moto's S3):
    a table written past a 32 KiB split size splits, the children are served (possibly moved
    by balancing), and every row reads back through a cluster client."""
    name = f"splits-{uuid.uuid4().hex[:12]}"
    boto3_client(s3_server).create_bucket(Bucket=name)
    cluster = Cluster(
        url=f"etcd://{etcd_server}/{name}",
        store_url=f"s3://{name}/data?endpoint_url={s3_server}&region=us-east-1",
        directory=tmp_path,
        lease_ttl=5.0,
    )
    try:
        cluster.start_master()
        for _ in range(2):
            await asyncio.to_thread(cluster.start_worker, split_bytes=32 * 1024)
        client = await connect_async(cluster.url)
        try:
            table = await client.create_table("s", ["f"])
            rnd = random.Random(2)
            rows = {b"r%05d" % i: rnd.randbytes(200) for i in range(1500)}
            items = list(rows.items())
            for i in range(0, len(items), 250):
                await write(table, dict(items[i : i + 250]))
                await client.flush("s")
            table_id = await table_id_of(client, "s")

            async def split() -> int | None:
                n = sum(len(t) for t in placement(await client.status(), table_id).values())
                return n if n >= 3 else None

            await harness_eventually(split, deadline=60, what="the table splits into >= 3")
            assert await read_all(table) == rows
        finally:
            await client.close()
    finally:
        cluster.close()
    assert not cluster.alive()


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_process_cluster_splits_under_writers_and_a_scanner(
    etcd_server: str, s3_server: str, tmp_path: Path
) -> None:
    """The same on real processes (a master and two workers over etcd and S3): single
    and batched writers and a scanner run while the table splits past a 32 KiB split size
    (the workers may also move the children by balancing). No error reaches them and every
    acknowledged write reads back."""
    name = f"splitw-{uuid.uuid4().hex[:12]}"
    boto3_client(s3_server).create_bucket(Bucket=name)
    cluster = Cluster(
        url=f"etcd://{etcd_server}/{name}",
        store_url=f"s3://{name}/data?endpoint_url={s3_server}&region=us-east-1",
        directory=tmp_path,
        lease_ttl=5.0,
    )
    try:
        cluster.start_master()
        for _ in range(2):
            await asyncio.to_thread(cluster.start_worker, split_bytes=32 * 1024)
        client = await connect_async(cluster.url)
        try:
            table = await client.create_table("w", ["f"])
            table_id = await table_id_of(client, "w")
            workload = SplitWorkload(table)

            async def flusher() -> None:
                # The workers' memtables are far below their flush size: flush (an admin
                # call, not part of the workload) so SSTables grow and tablets split.
                while not workload.stop.is_set():
                    with contextlib.suppress(TabletStoreError):
                        await client.flush("w")
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(workload.stop.wait(), 0.5)

            async def tablets() -> int:
                return len(await client.catalog.list_tablets(table_id))

            flushing = asyncio.ensure_future(flusher())
            try:
                await run_while_splitting(workload, tablets, splits=4, deadline=150)
            finally:
                workload.stop.set()
                await flushing
            assert await read_all(table) == workload.acked
        finally:
            await client.close()
    finally:
        cluster.close()
    assert not cluster.alive()


async def test_a_child_moved_before_its_major_compaction_is_compacted_by_its_new_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A split's child shares its parent's SSTables until its major compaction, and cannot
    split again before it. Moved before it (balancing, a worker stopping), it was never
    compacted where it landed: it grew without splitting. Its new owner compacts it now."""
    wopts = WorkerOptions(lease=IN_PROCESS_LEASE, split_cooldown=0.2)
    db = await Database.open(f"file://{tmp_path}", tablet_options=SPLIT, worker_options=wopts)
    try:
        real = TabletSplits._compact_child

        async def not_yet(self: TabletSplits, tablet: object) -> None:
            return None  # the split's own compaction of its children does not happen

        monkeypatch.setattr(TabletSplits, "_compact_child", not_yet)
        table = await db.create_table("t", ["f"])
        rnd = random.Random(2)
        rows = {b"r%05d" % i: rnd.randbytes(150) for i in range(1200)}
        await write(table, rows)
        await db.flush("t")
        table_id = (await db.master.catalog.get_table("t")).table_id

        async def split() -> bool:
            tablets = await db.master.catalog.list_tablets(table_id)
            return len(tablets) >= 2 and not db.worker.splits.running

        await eventually(split, deadline=60, what="the table splits")
        child = next(
            t for t in await db.master.catalog.list_tablets(table_id) if not owns_its_sstables(t)
        )
        key = (child.table_id, child.tablet_id)
        # Moved: unloaded with a flush, then loaded (here: the only worker) by the master.
        await db.worker.services.unload_tablet(UnloadTabletRequest(*key, flush=True))
        monkeypatch.setattr(TabletSplits, "_compact_child", real)
        await db.master.assign()
        assert key in db.worker.tablets

        async def compacted() -> bool:
            return owns_its_sstables(await db.master.catalog.get_tablet(*key))

        await eventually(compacted, deadline=60, what="the moved child's major compaction")
        assert await read_all(table) == rows
    finally:
        await db.close()
