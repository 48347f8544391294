"""The cluster with real processes: etcd, moto's S3 server, a master (and a
standby) and workers started as ``python -m tabletstore.cli.main`` processes, used through
``tabletstore.connect_async("etcd://...")``.

* many tablets: writes, point reads, scans across tablet boundaries, filters, transactions,
  flush and compact on a table pre-split into 8 tablets served by 3 workers;
* SIGKILL a worker during concurrent writes: every acknowledged write is read back (a history
  checker treats ``Indeterminate`` as "may have happened"), its tablets move and are replayed;
* SIGTERM a worker: its tablets are minor-compacted and released, the next owner replays
  nothing, and they move without waiting for the lease to expire;
* SIGKILL the elected master with a standby running: writes keep flowing (data never goes
  through the master) and admin calls succeed again once the standby leads;
* adding a worker moves tablets to it (balancing), a tablet grows past the split size and
  splits, and garbage collection deletes only garbage.

Leases are 3 s in the fault tests (``--lease-ttl``) so a crash is noticed quickly; the shared
cluster keeps the default 5 s so a loaded machine does not expire a healthy worker's lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import random
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tabletstore import connect_async
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.client import AsyncClient
from tabletstore.client.cluster import ClusterClient
from tabletstore.client.mutate_rows import MutationsFailed
from tabletstore.client.table import AsyncTable
from tabletstore.commitlog.sorting import load_plan, task_done
from tabletstore.coordination import open_coordinator
from tabletstore.data.filters import (
    CellsPerColumnLimit,
    Chain,
    ColumnQualifierRegex,
    FamilyNameRegex,
    RowKeyRegex,
    StripValue,
    ValueRegex,
)
from tabletstore.data.model import DeleteRow, IncrementValue, RowMutation, SetCell
from tabletstore.errors import Indeterminate, TabletStoreError
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.rpc.tcp import TcpTransport
from tabletstore.storage_s3 import open_store
from tests.integration.cluster_harness import (
    PROCESS_ENV,
    Cluster,
    WriteHistory,
    eventually,
    placement,
    rejoined_or_gone,
    table_id_of,
)
from tests.plugins.s3_server import boto3_client

pytestmark = pytest.mark.timeout(240)

#: Fault tests' lease: failover within seconds, yet well above keep-alive jitter.
FAST_LEASE = 3.0
#: How long the cluster may take to notice a failure and reassign (lease + a few rounds).
REASSIGN_DEADLINE = 30.0


def _start(
    cluster: Cluster,
    *,
    masters: int,
    workers: int,
    split_bytes: int | None = None,
    master_args: tuple[str, ...] = (),
) -> Cluster:
    """Start the masters one by one (the first leads), then the workers concurrently (each
    start waits for its port: a few seconds of interpreter start-up on a loaded machine), and
    wait until the cluster serves METADATA."""
    try:
        for _ in range(masters):
            cluster.start_master(extra_args=master_args)
        with ThreadPoolExecutor(max(workers, 1)) as pool:
            list(pool.map(lambda _: cluster.start_worker(split_bytes=split_bytes), range(workers)))
        if workers:
            cluster.wait_serving()
    except BaseException:
        cluster.close()
        raise
    return cluster


@pytest.fixture(scope="module")
def shared_cluster(
    etcd_server: str, s3_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """A master and 3 workers for the tests that kill nothing, with METADATA pre-split at
    table names from "m" on (so lookups reach two METADATA tablets)."""
    cluster = Cluster.on(
        etcd_server, s3_server, tmp_path_factory.mktemp("cluster"), "cluster", lease_ttl=5.0
    )
    try:
        yield _start(cluster, masters=1, workers=3, master_args=("--metadata-split-at", "m"))
    finally:
        cluster.close()


@pytest.fixture
def make_cluster(
    etcd_server: str, s3_server: str, tmp_path: Path
) -> Iterator[Callable[..., Cluster]]:
    """A factory of private clusters for tests that kill or add processes; all are stopped
    at teardown."""
    made: list[Cluster] = []

    def make(
        *,
        masters: int = 1,
        workers: int = 2,
        lease_ttl: float = FAST_LEASE,
        split_bytes: int | None = None,
    ) -> Cluster:
        cluster = Cluster.on(
            etcd_server, s3_server, tmp_path / f"c{len(made)}", "cluster", lease_ttl=lease_ttl
        )
        made.append(cluster)
        return _start(cluster, masters=masters, workers=workers, split_bytes=split_bytes)

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()
        for cluster in made:
            assert not cluster.alive(), f"left running: {cluster.alive()}"


@contextlib.asynccontextmanager
async def client_of(cluster: Cluster) -> AsyncIterator[AsyncClient]:
    client = await connect_async(cluster.url)
    try:
        yield client
    finally:
        await client.close()


async def read_all(table: AsyncTable, **kw: object) -> dict[bytes, bytes]:
    """row -> newest value of f:c over the whole table (or the given selection)."""
    out = {}
    async for row in table.read_rows(filter=CellsPerColumnLimit(1), **kw):  # type: ignore[arg-type]
        for cell in row.cells:
            if (cell.family, cell.qualifier) == ("f", b"c"):
                out[row.key] = cell.value
    return out


async def served(client: AsyncClient, table_id: str, tablets: int) -> dict[str, set[str]] | None:
    """The placement once exactly ``tablets`` tablets of the table are served, else None."""
    where = placement(await client.status(), table_id)
    return where if sum(len(t) for t in where.values()) == tablets else None


async def wait_served(client: AsyncClient, table: str, tablets: int) -> dict[str, set[str]]:
    table_id = await table_id_of(client, table)
    return await eventually(
        lambda: served(client, table_id, tablets),
        deadline=REASSIGN_DEADLINE,
        what=f"{tablets} tablets of {table} served",
    )


def worker_id_of(cluster: Cluster, record_url: str, status_workers: dict[str, object]) -> str:
    for worker_id, ws in status_workers.items():
        if getattr(ws, "address", None) == record_url:
            return worker_id
    raise AssertionError(f"no live worker at {record_url}: {status_workers}")


# ------------------------------------------------------------------------------ many tablets

SPLITS = [b"b", b"d", b"f", b"h", b"j", b"l", b"n"]  # 8 tablets


def _key(i: int) -> bytes:
    # 26 letters x 20: rows on every side of every split key (and exactly on "d", "h"...).
    return f"{chr(ord('a') + i % 26)}{i // 26:03d}".encode()


async def test_metadata_pre_split_by_the_master_flag_serves_tables_on_both_sides(
    shared_cluster: Cluster,
) -> None:
    async with client_of(shared_cluster) as client:
        meta = await client.catalog.list_tablets(METADATA_TABLE_ID)
        assert [(r.tablet_id, r.end_row) for r in meta[1:]] == [("m00000", b"m"), ("m00001", None)]
        for name in ("apple", "zebra"):  # one table's rows in each METADATA tablet
            table = await client.create_table(name, ["f"], split_keys=[b"k"])
            await table.mutate_row(b"r", [SetCell("f", b"c", name.encode())])
            row = await table.read_row(b"r")
            assert row is not None and row.cells[0].value == name.encode()
            await client.delete_table(name)


async def test_many_tablets_write_read_scan_filter(shared_cluster: Cluster) -> None:
    async with client_of(shared_cluster) as client:
        table = await client.create_table("many", ["f", "g"], split_keys=SPLITS)
        where = await wait_served(client, "many", 8)
        # spread (workers may also hold METADATA tablets, so not necessarily over all three)
        assert sum(1 for t in where.values() if t) >= 2, f"spread over the workers: {where}"

        keys = [_key(i) for i in range(520)]
        await table.mutate_rows(
            [
                RowMutation(k, (SetCell("f", b"c", b"v-" + k), SetCell("g", b"n", str(i).encode())))
                for i, k in enumerate(keys)
            ]
        )
        for split in SPLITS:  # rows exactly on tablet boundaries
            await table.mutate_row(split, [SetCell("f", b"c", b"edge-" + split)])
        expected = {k: b"v-" + k for k in keys} | {s: b"edge-" + s for s in SPLITS}

        # point reads on both sides of each boundary
        for k in [b"a019", b"b000", b"c019", b"d000", b"n000", b"z019", *SPLITS]:
            row = await table.read_row(k, families=["f"])
            assert row is not None and row.cells[0].value == expected[k]
        assert await table.read_row(b"zz-missing") is None

        # a full scan is complete and in key order across all 8 tablets
        rows = [r async for r in table.read_rows()]
        assert [r.key for r in rows] == sorted(expected)
        assert await read_all(table) == expected

        # ranges crossing boundaries, prefixes, limits and key sets spanning tablets
        got = await read_all(table, start=b"c010", end=b"k005")
        assert got == {k: v for k, v in expected.items() if b"c010" <= k < b"k005"}
        assert list(await read_all(table, prefix=b"h")) == sorted(
            k for k in expected if k.startswith(b"h")
        )
        limited = [r.key async for r in table.read_rows(start=b"a015", limit=30)]
        assert limited == sorted(k for k in expected if k >= b"a015")[:30]
        picks = [b"y004", b"a001", b"m003", b"nope", b"e002"]
        assert [r.key async for r in table.read_rows(keys=picks)] == [
            b"a001",
            b"e002",
            b"m003",
            b"y004",
        ]

        # filters applied by every tablet's worker
        regex = [r.key async for r in table.read_rows(filter=RowKeyRegex(rb"[aeiou]00[0-3]"))]
        assert regex == sorted(k for k in keys if k[:1] in b"aeiou" and k[1:] <= b"003")
        fam_g = [r async for r in table.read_rows(filter=FamilyNameRegex("g"), prefix=b"m")]
        assert fam_g and all(c.family == "g" for r in fam_g for c in r.cells)
        hits = [
            r.key
            async for r in table.read_rows(
                filter=Chain([ColumnQualifierRegex(rb"c"), ValueRegex(rb"v-[bkx]01.")])
            )
        ]
        assert hits == sorted(k for k in keys if k[:1] in b"bkx" and k[1:3] == b"01")
        stripped = [r async for r in table.read_rows(filter=StripValue(), prefix=b"q")]
        assert stripped and all(c.value == b"" for r in stripped for c in r.cells)

        # single-row transactions in different tablets
        for row in (b"a000", b"g007", b"z001"):
            matched = await table.check_and_mutate_row(
                row, ValueRegex(rb"v-.*"), true_mutations=[SetCell("f", b"t", b"yes")]
            )
            assert matched
            result = await table.read_modify_write_row(row, [IncrementValue("g", b"ctr", 5)])
            assert struct.unpack(">q", result.cells[0].value) == (5,)

        # flush and compact every tablet, then everything reads back the same; deletes hold
        await client.flush("many")
        await table.mutate_row(b"e000", [DeleteRow()])
        await client.compact("many")
        del expected[b"e000"]
        assert await read_all(table) == expected
        await client.delete_table("many")


@pytest.mark.slow
async def test_concurrent_point_reads_across_tablets_see_every_acknowledged_write(
    shared_cluster: Cluster,
) -> None:
    """Concurrent point reads of one worker's tablets leave as one ``read_points``
    request; each reader still gets its own row, as written before its read began (never a
    value older than its own acknowledged write), with writes to the same rows interleaved."""
    async with client_of(shared_cluster) as client:
        table = await client.create_table("coalesced", ["f"], split_keys=SPLITS)
        await wait_served(client, "coalesced", 8)
        keys = [bytes([c]) + b"%03d" % i for c in b"acegikmo" for i in range(6)]  # 8 tablets

        async def reader_writer(key: bytes) -> None:
            for round_ in range(6):
                value = key + b"/%d" % round_
                await table.mutate_row(key, [SetCell("f", b"c", value, timestamp=round_ + 1)])
                got = await table.read_row(key)
                assert got is not None and got.cells[0].value == value, (key, round_, got)
                assert await table.read_row(key + b"-absent") is None

        await asyncio.gather(*(reader_writer(k) for k in keys))
        found = await asyncio.gather(*(table.read_row(k) for k in keys))
        assert [r.cells[0].value if r else None for r in found] == [k + b"/5" for k in keys]
        assert client._point_reads is not None and client._point_reads.in_flight == 0


async def test_backtracking_regex_leaves_every_worker_alive_and_serving(
    make_cluster: Callable[..., Cluster],
) -> None:
    # On Python's re this pattern backtracked for hours in a worker's read
    # path; the worker lost its 3 s lease, the client retried on each new owner, and every
    # worker died. On RE2 the read just answers.
    cluster = make_cluster(workers=3)
    hostile, evil, good = rb"(a+)+$", b"a" * 31 + b"b", b"a" * 31
    async with client_of(cluster) as client:
        table = await client.create_table("regex", ["f"], split_keys=[b"h", b"p"])
        await wait_served(client, "regex", 3)
        rows = {b"a-evil": evil, b"h-evil": evil, b"p-evil": evil, b"z-good": good}
        await table.mutate_rows([RowMutation(k, (SetCell("f", b"c", v),)) for k, v in rows.items()])
        workers = [r for r in cluster.records if r.role.startswith("worker")]
        before = await client.status()

        f = ValueRegex(hostile)
        async with asyncio.timeout(60):
            assert await table.read_row(b"a-evil", filter=f) is None
            hits = [(r.key, [c.value for c in r.cells]) async for r in table.read_rows(filter=f)]
            assert not await table.check_and_mutate_row(
                b"h-evil", f, true_mutations=[SetCell("f", b"t", b"matched")]
            )
        assert hits == [(b"z-good", [good])]

        # Every worker is the same process, answering under the same identity: none lost its
        # lease. And every tablet still serves writes and reads.
        assert [r for r in workers if r not in cluster.alive()] == [], cluster.logs()
        after = await client.status()
        assert set(after.workers) == set(before.workers), cluster.logs()
        assert all(not isinstance(s, str) for s in after.workers.values()), after.workers
        for key in rows:
            await table.mutate_row(key, [SetCell("f", b"c", b"after-" + key)])
        assert await read_all(table) == {k: b"after-" + k for k in rows}


async def test_batch_across_tablets_reports_failures_per_entry(shared_cluster: Cluster) -> None:
    async with client_of(shared_cluster) as client:
        table = await client.create_table("batch", ["f"], split_keys=[b"m"])
        await wait_served(client, "batch", 2)
        entries = [
            RowMutation(b"a", (SetCell("f", b"c", b"1"),)),
            RowMutation(b"b", (SetCell("nofamily", b"c", b"2"),)),
            RowMutation(b"x", (SetCell("f", b"c", b"3"),)),
        ]
        with pytest.raises(MutationsFailed) as info:
            await table.mutate_rows(entries)
        assert [f.index for f in info.value.failures] == [1]
        assert await read_all(table) == {b"a": b"1", b"x": b"3"}
        await client.delete_table("batch")


# ------------------------------------------------------------------------------ worker crash


class Writers:
    """Concurrent writers recording every outcome in a :class:`WriteHistory`."""

    def __init__(self, table: AsyncTable, history: WriteHistory) -> None:
        self.table = table
        self.history = history
        self.stop = asyncio.Event()
        self.counter_acked = 0
        self.counter_maybe = 0

    async def single(self, n: int) -> None:
        """Row-at-a-time writes; odd writers use server timestamps (not idempotent, so a lost
        reply is Indeterminate), even ones explicit timestamps (retried by the client)."""
        for i in itertools.count():
            if self.stop.is_set():
                return
            row = f"{'acegikmoqsuw'[(n * 5 + i) % 12]}-{n:02d}-{i:05d}".encode()
            value = f"v{n}.{i}".encode()
            ts = None if n % 2 else 1_000_000 + i
            self.history.begin(row, value)
            try:
                await self.table.mutate_row(row, [SetCell("f", b"c", value, timestamp=ts)])
            except TabletStoreError as exc:
                self.history.fail(row, exc)
                await asyncio.sleep(0.05)  # a failing client must not spin the CPU
            else:
                self.history.ack(row)

    async def batches(self, n: int) -> None:
        """mutate_rows of 6 rows spread over every tablet; failures come per entry."""
        for i in itertools.count():
            if self.stop.is_set():
                return
            rows = [f"{p}-b{n}-{i:05d}".encode() for p in "bfjnrv"]
            for row in rows:
                self.history.begin(row, b"b" + row)
            try:
                await self.table.mutate_rows(
                    [RowMutation(r, (SetCell("f", b"c", b"b" + r),)) for r in rows]
                )
                failed: dict[int, BaseException] = {}
            except MutationsFailed as exc:
                failed = {f.index: f.error for f in exc.failures}
            for j, row in enumerate(rows):
                if j in failed:
                    self.history.fail(row, failed[j])
                else:
                    self.history.ack(row)

    async def counter(self) -> None:
        """Increments of one counter (never retried by the client after an ambiguous failure)."""
        while not self.stop.is_set():
            try:
                await self.table.read_modify_write_row(b"counter", [IncrementValue("g", b"n", 1)])
            except TabletStoreError as exc:
                if exc.may_have_applied:
                    self.counter_maybe += 1
                await asyncio.sleep(0.05)
            else:
                self.counter_acked += 1

    def run(self, singles: int = 6, batches: int = 2) -> list[asyncio.Task[None]]:
        tasks = [asyncio.create_task(self.single(n)) for n in range(singles)]
        tasks += [asyncio.create_task(self.batches(n)) for n in range(batches)]
        tasks.append(asyncio.create_task(self.counter()))
        return tasks


async def check_history(table: AsyncTable, writers: Writers, cluster: Cluster) -> None:
    h = writers.history
    print(  # shown with the failure report (pytest captures it otherwise)
        f"writes: {len(h.values)} begun, {len(h.acked)} acked, {len(h.maybe)} maybe, "
        f"{len(h.rejected)} rejected, errors {h.errors}; counter {writers.counter_acked} acked "
        f"+ {writers.counter_maybe} maybe"
    )
    seen = await read_all(table)
    seen.pop(b"counter", None)
    problems = writers.history.check(seen)
    assert not problems, "\n".join(problems[:20]) + f"\nerrors: {writers.history.errors}"
    # each acknowledged row also reads back alone (the point-read path, not only scans)
    for row in list(writers.history.acked)[::25]:
        got = await table.read_row(row, families=["f"])
        assert got is not None and got.cells[0].value == writers.history.values[row]
    counter = await table.read_row(b"counter")
    value = struct.unpack(">q", counter.cells[0].value)[0] if counter else 0
    low, high = writers.counter_acked, writers.counter_acked + writers.counter_maybe
    assert low <= value <= high, f"counter {value} outside [{low}, {high}]"


@pytest.mark.slow
async def test_sigkill_worker_during_writes_keeps_every_acknowledged_write(
    make_cluster: Callable[..., Cluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = make_cluster(workers=3)
    async with client_of(cluster) as client:
        table = await client.create_table("crash", ["f", "g"], split_keys=[b"e", b"i", b"o", b"t"])
        before = await wait_served(client, "crash", 5)
        status = await client.status()
        # The victim is a worker serving user tablets (one may hold only METADATA tablets).
        workers = [r for r in cluster.records if r.role.startswith("worker")]
        ids = {
            r.url: worker_id_of(cluster, r.url, status.workers)  # type: ignore[arg-type]
            for r in workers
        }
        victim = max(workers, key=lambda r: len(before.get(ids[r.url], ())))
        victim_id = ids[victim.url]
        moved = before[victim_id]
        assert moved, f"the victim serves a tablet: {before}"

        writers = Writers(table, WriteHistory())
        tasks = writers.run()
        try:
            await eventually(
                lambda: _at_least(len(writers.history.acked), 150), deadline=60, what="150 acks"
            )
            await asyncio.to_thread(cluster.kill, victim)
            killed_at = len(writers.history.acked)
            table_id = await table_id_of(client, "crash")
            after = await eventually(
                lambda: _moved_off(client, table_id, victim_id, 5),
                deadline=REASSIGN_DEADLINE,
                what=f"the victim's tablets {moved} reassigned",
            )
            # writes go on against the new owners
            await eventually(
                lambda: _at_least(len(writers.history.acked), killed_at + 150),
                deadline=60,
                what="150 more acks after the failover",
            )
        finally:
            writers.stop.set()
            await asyncio.gather(*tasks)
        assert victim_id not in after
        await check_history(table, writers, cluster)

        # the new owners replayed the dead worker's commit log (§5.3)
        events = (await client.status(events=10_000)).events
        loads = [
            d for _, where, kind, d in events if kind == "loaded" and where.split("/")[1] in moved
        ]
        assert any(not d.startswith("replayed 0 ") for d in loads), loads
        # ...sorted first by the live workers (§6): the plan exists and every task is done.
        for name, value in PROCESS_ENV.items():
            monkeypatch.setenv(name, value)  # this process reads the bucket too
        await _check_sorted(cluster, client, victim_id)


async def _check_sorted(cluster: Cluster, client: AsyncClient, worker_id: str) -> None:
    assert isinstance(client, ClusterClient)
    kv = await client.coordinator.get(f"settings/incarnation.{worker_id}")
    assert kv is not None
    store = open_store(cluster.store_url)
    try:
        plan = await load_plan(store, worker_id, int(kv.value))
        assert plan is not None, "the dead worker's log was not sorted"
        assert plan.tasks and any(t.table_id != METADATA_TABLE_ID for t in plan.tablets)

        async def sorted_all() -> bool:
            return all([await task_done(store, plan, t) for t in plan.tasks])

        await eventually(sorted_all, deadline=60, what="every sort task done")
    finally:
        await store.close()


async def _at_least(n: int, target: int) -> bool:
    return n >= target


async def _moved_off(
    client: AsyncClient, table_id: str, victim_id: str, tablets: int
) -> dict[str, set[str]] | None:
    where = await served(client, table_id, tablets)
    return where if where is not None and victim_id not in where else None


@pytest.mark.slow
async def test_two_crashes_in_a_row_replay_both_logs(make_cluster: Callable[..., Cluster]) -> None:
    """The second owner dies before minor-compacting what it replayed: the third owner must
    replay the first owner's log and the second's (the record lists both, §5.3)."""
    cluster = make_cluster(workers=3)
    async with client_of(cluster) as client:
        table = await client.create_table("chain", ["f", "g"])
        first = await wait_served(client, "chain", 1)
        table_id = await table_id_of(client, "chain")
        writers = Writers(table, WriteHistory())
        tasks = writers.run(singles=4, batches=1)
        try:
            for round_ in range(2):
                owner_id = next(w for w, t in first.items() if t)
                owner = _record_of(cluster, (await client.status()).workers[owner_id])
                target = len(writers.history.acked) + 100
                await eventually(
                    lambda t=target: _at_least(len(writers.history.acked), t),  # type: ignore[misc]
                    deadline=60,
                    what=f"100 more acks before crash {round_ + 1}",
                )
                await asyncio.to_thread(cluster.kill, owner)
                first = await eventually(
                    lambda o=owner_id: _moved_off(client, table_id, o, 1),  # type: ignore[misc]
                    deadline=REASSIGN_DEADLINE,
                    what=f"the tablet reassigned after crash {round_ + 1}",
                )
            target = len(writers.history.acked) + 50
            await eventually(
                lambda: _at_least(len(writers.history.acked), target),
                deadline=60,
                what="50 acks on the third owner",
            )
        finally:
            writers.stop.set()
            await asyncio.gather(*tasks)
        await check_history(table, writers, cluster)


@pytest.mark.slow
async def test_paused_worker_loses_its_tablets_and_acknowledges_nothing_after(
    make_cluster: Callable[..., Cluster],
) -> None:
    """SIGSTOP a worker past its lease (a zombie), let its tablet move, SIGCONT it: no write
    it acknowledges after waking may be lost, and it must stop serving (fencing rule 1)."""
    cluster = make_cluster(workers=2)
    async with client_of(cluster) as client:
        table = await client.create_table("zombie", ["f", "g"])
        where = await wait_served(client, "zombie", 1)
        table_id = await table_id_of(client, "zombie")
        owner_id = next(w for w, t in where.items() if t)
        owner = _record_of(cluster, (await client.status()).workers[owner_id])
        writers = Writers(table, WriteHistory())
        tasks = writers.run(singles=4, batches=1)
        try:
            await eventually(
                lambda: _at_least(len(writers.history.acked), 100), deadline=60, what="100 acks"
            )
            cluster.pause(owner)
            try:
                # (not status(): its call to the paused worker waits for the RPC timeout)
                await eventually(
                    lambda: _located_off(client, table_id, owner.url),
                    deadline=REASSIGN_DEADLINE,
                    what="the paused worker's tablet reassigned",
                )
            finally:
                cluster.resume(owner)
            target = len(writers.history.acked) + 100
            await eventually(
                lambda: _at_least(len(writers.history.acked), target),
                deadline=60,
                what="100 acks after the zombie woke",
            )
        finally:
            writers.stop.set()
            await asyncio.gather(*tasks)
        await check_history(table, writers, cluster)
        _reap_quietly(owner.pid)
        await eventually(
            lambda: rejoined_or_gone(client, owner, owner_id),
            deadline=REASSIGN_DEADLINE,
            what="the zombie stops serving as its old identity (it rejoins or exits)",
        )


async def _located_off(client: AsyncClient, table_id: str, address: str) -> bool:
    records = await client.locations.tablets(table_id, refresh=True)
    return all(r.location is not None and r.location != address for r in records)


def _record_of(cluster: Cluster, ws: object) -> ProcessRecord:
    address = getattr(ws, "address", None)
    return next(r for r in cluster.records if r.url == address)


def _reap_quietly(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


@pytest.mark.slow
async def test_client_recovers_from_a_dead_owner_for_non_idempotent_writes(
    make_cluster: Callable[..., Cluster],
) -> None:
    """A client whose cached location names a crashed worker: the first non-idempotent write
    may be Indeterminate, but later ones must find the tablet's new owner (found: the client
    raises Indeterminate without refreshing the location, so it fails forever)."""
    cluster = make_cluster(workers=2)
    async with client_of(cluster) as client, client_of(cluster) as observer:
        table = await client.create_table("stale", ["f", "g"])
        where = await wait_served(client, "stale", 1)
        owner_id = next(w for w, t in where.items() if t)
        owner = _record_of(cluster, (await client.status()).workers[owner_id])
        await table.mutate_row(b"r", [SetCell("f", b"c", b"0")])  # caches the location
        await asyncio.to_thread(cluster.kill, owner)
        table_id = await table_id_of(observer, "stale")
        await eventually(
            lambda: _moved_off(observer, table_id, owner_id, 1),
            deadline=REASSIGN_DEADLINE,
            what="the tablet reassigned",
        )
        outcomes = []
        for i in range(4):
            try:
                await table.mutate_row(b"r", [SetCell("f", b"c", b"%d" % i)])
                outcomes.append("ok")
            except Indeterminate:
                outcomes.append("indeterminate")
        for _ in range(3):
            try:
                await table.read_modify_write_row(b"r", [IncrementValue("g", b"n", 1)])
                outcomes.append("ok")
            except Indeterminate:
                outcomes.append("indeterminate")
        assert outcomes[1:] == ["ok"] * 6, outcomes


@pytest.mark.slow
async def test_retried_write_that_was_sent_is_indeterminate_not_unavailable(
    make_cluster: Callable[..., Cluster],
) -> None:
    """errors.py: every error but Indeterminate means "not applied". A retried (idempotent)
    write whose first attempt reached a worker that then stopped answering may have been
    logged; when the retry deadline passes the client must say Indeterminate (found: it
    raises Unavailable, and a fault run read such a write back)."""
    cluster = make_cluster(workers=1, lease_ttl=30.0)
    async with client_of(cluster) as setup:
        table = await setup.create_table("sent", ["f"])
        await wait_served(setup, "sent", 1)
    coordinator = open_coordinator(cluster.url)
    client = ClusterClient(cluster.url, coordinator, TcpTransport(timeout=1.0))
    client.retry_deadline = 2.0
    table = client.table("sent")
    try:
        await table.mutate_row(b"r", [SetCell("f", b"c", b"0", timestamp=1)])  # locate it
        worker = next(r for r in cluster.records if r.role.startswith("worker"))
        cluster.pause(worker)
        try:
            with pytest.raises(TabletStoreError) as info:
                await table.mutate_row(b"r", [SetCell("f", b"c", b"1", timestamp=2)])
        finally:
            cluster.resume(worker)
        assert info.value.may_have_applied, repr(info.value)
    finally:
        await client.close()


# ------------------------------------------------------------------------------ clean stop


@pytest.mark.slow
async def test_sigterm_worker_compacts_releases_and_moves_before_lease_expiry(
    make_cluster: Callable[..., Cluster],
) -> None:
    # A 60 s lease: the tablets must move because the worker released them, not because its
    # lease ran out.
    cluster = make_cluster(workers=2, lease_ttl=60.0)
    async with client_of(cluster) as client:
        table = await client.create_table("term", ["f"], split_keys=[b"g", b"p"])
        before = await wait_served(client, "term", 3)
        rows = {f"{p}{i:03d}".encode(): f"v{i}".encode() for p in "cjsx" for i in range(50)}
        await table.mutate_rows([RowMutation(k, (SetCell("f", b"c", v),)) for k, v in rows.items()])

        status = await client.status()
        # The victim is a worker serving user tablets (one may hold only METADATA tablets).
        workers = [r for r in cluster.records if r.role.startswith("worker")]
        ids = {
            r.url: worker_id_of(cluster, r.url, status.workers)  # type: ignore[arg-type]
            for r in workers
        }
        victim = max(workers, key=lambda r: len(before.get(ids[r.url], ())))
        victim_id = ids[victim.url]
        moved = before[victim_id]
        assert moved, f"the victim serves a tablet: {before}"
        exited = await asyncio.to_thread(cluster.terminate, victim, deadline=30.0)
        assert exited, "the worker did not exit on SIGTERM\n" + cluster.logs()

        table_id = await table_id_of(client, "term")
        await eventually(
            lambda: _moved_off(client, table_id, victim_id, 3),
            deadline=REASSIGN_DEADLINE,
            what="tablets released on SIGTERM reassigned before the 60 s lease expired",
        )
        assert await read_all(table) == rows

        events = (await client.status(events=10_000)).events
        for tablet in moved:
            mine = [(k, d) for _, where, k, d in events if where == f"term/{tablet}"]
            kinds = [k for k, _ in mine]
            # the old owner minor-compacted on the way out, the new one replayed nothing
            last_assign = max(i for i, k in enumerate(kinds) if k == "assigned")
            assert "minor_compaction" in kinds[:last_assign], mine
            assert mine[-1] == ("loaded", "replayed 0 cells"), mine


# ------------------------------------------------------------------------------ master failover


@pytest.mark.slow
async def test_standby_master_takes_over_while_data_keeps_flowing(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(masters=2, workers=2)
    leader, standby = (r for r in cluster.records if r.role.startswith("master"))
    async with client_of(cluster) as client:
        assert (await client.status()).master == leader.url
        table = await client.create_table("flow", ["f", "g"], split_keys=[b"k"])
        await wait_served(client, "flow", 2)

        writers = Writers(table, WriteHistory())
        tasks = writers.run(singles=4, batches=1)
        try:
            await eventually(
                lambda: _at_least(len(writers.history.acked), 50), deadline=60, what="50 acks"
            )
            await asyncio.to_thread(cluster.kill, leader)
            acks_at_kill = len(writers.history.acked)
            # admin calls fail over to the standby (the client re-finds the master)
            async with asyncio.timeout(REASSIGN_DEADLINE):
                second = await client.create_table("after", ["f"], split_keys=[b"m"])
            acks_during = len(writers.history.acked) - acks_at_kill
        finally:
            writers.stop.set()
            await asyncio.gather(*tasks)
        assert acks_during > 0, "no write was acknowledged while there was no master"
        assert not writers.history.errors, writers.history.errors
        await check_history(table, writers, cluster)

        assert (await client.status()).master == standby.url
        await wait_served(client, "after", 2)
        await second.mutate_rows(
            [RowMutation(k, (SetCell("f", b"c", k),)) for k in (b"a", b"n", b"z")]
        )
        assert await read_all(second) == {b"a": b"a", b"n": b"n", b"z": b"z"}
        assert sorted(await client.list_tables()) == ["after", "flow"]


# ------------------------------------------------------------------------------ features to come


@pytest.mark.slow
async def test_added_worker_gets_tablets(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(workers=1)
    async with client_of(cluster) as client:
        table = await client.create_table("grow", ["f"], split_keys=[b"c", b"f", b"i", b"l", b"o"])
        await wait_served(client, "grow", 6)
        rows = {f"{p}{i:02d}".encode(): b"x" for p in "abdegjmpz" for i in range(20)}
        await table.mutate_rows([RowMutation(k, (SetCell("f", b"c", v),)) for k, v in rows.items()])

        added = await asyncio.to_thread(cluster.start_worker)
        table_id = await table_id_of(client, "grow")

        async def balanced() -> bool:
            where = await served(client, table_id, 6)
            status = await client.status()
            new_id = worker_id_of(cluster, added.url, status.workers)  # type: ignore[arg-type]
            return where is not None and len(where.get(new_id, ())) >= 2

        await eventually(balanced, deadline=15, what="the new worker serves >= 2 of 6 tablets")
        assert await read_all(table) == rows


SPLIT_BYTES = 32 * 1024


@pytest.mark.slow
async def test_tablet_splits_past_split_size(make_cluster: Callable[..., Cluster]) -> None:
    cluster = make_cluster(workers=2, split_bytes=SPLIT_BYTES)
    async with client_of(cluster) as client:
        table = await client.create_table("split", ["f"])
        await wait_served(client, "split", 1)
        # Incompressible values: splits count SSTable object bytes (as §5 counts GFS file
        # sizes), and repeated bytes would compress under the split size.
        rng = random.Random(1500)
        rows = {f"r{i:05d}".encode(): rng.randbytes(200) for i in range(1500)}
        items = list(rows.items())
        for i in range(0, len(items), 250):
            chunk = items[i : i + 250]
            await table.mutate_rows([RowMutation(k, (SetCell("f", b"c", v),)) for k, v in chunk])
            await client.flush("split")
        table_id = await table_id_of(client, "split")

        async def split() -> int | None:
            where = placement(await client.status(), table_id)
            n = sum(len(t) for t in where.values())
            return n if n > 1 else None

        await eventually(split, deadline=15, what="the table has more than one tablet")
        assert await read_all(table) == rows
        assert [r.key async for r in table.read_rows(start=b"r00700", limit=3)] == [
            b"r00700",
            b"r00701",
            b"r00702",
        ]


@pytest.mark.slow
async def test_gc_deletes_only_garbage(
    make_cluster: Callable[..., Cluster], s3_server: str
) -> None:
    cluster = make_cluster(workers=1)
    async with client_of(cluster) as client:
        table = await client.create_table("gc", ["f"], split_keys=[b"m"])
        await wait_served(client, "gc", 2)
        rows: dict[bytes, bytes] = {}
        for round_ in range(3):  # three minor compactions: 3 SSTables per tablet
            batch = {f"{p}{i:03d}".encode(): f"{round_}".encode() for p in "az" for i in range(40)}
            await table.mutate_rows(
                [RowMutation(k, (SetCell("f", b"c", v),)) for k, v in batch.items()]
            )
            rows |= batch
            await client.flush("gc")
        await client.compact("gc")  # one SSTable per tablet; the other 6 are garbage
        table_id = await table_id_of(client, "gc")
        bucket = cluster.store_url.split("/")[2]
        s3 = boto3_client(s3_server)

        def sstables() -> list[str]:
            listing = s3.list_objects_v2(Bucket=bucket, Prefix=f"data/tables/{table_id}/")
            return [o["Key"] for o in listing.get("Contents", [])]

        assert len(sstables()) >= 8
        gc = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "tabletstore.cli.main",
                "--url",
                cluster.url,
                "gc",
                "--grace",
                "0",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **PROCESS_ENV},
        )
        assert gc.returncode == 0, gc.stderr

        async def collected() -> bool:
            live = placement(await client.status(), table_id)
            return sum(len(t) for t in live.values()) == 2 and len(sstables()) == 2

        await eventually(collected, deadline=30, what="only the 2 live SSTables are left")
        assert await read_all(table) == rows
        # The same round as a serverless function (functions/gc.py), run as Lambda runs it:
        # a fresh process fed the event; nothing is left to delete.
        event = {"cluster_url": cluster.url, "grace": 0, "dry_run": True}
        ran = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-c", RUN_GC_FUNCTION],
            input=json.dumps(event),
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, **PROCESS_ENV},
            cwd=REPO_ROOT,
        )
        assert ran.returncode == 0, ran.stderr
        answer = json.loads(ran.stdout)
        assert answer["ok"] is True and answer["dry_run"] is True, answer
        assert answer["listed"] >= 2 and answer["deleted"] == 0, answer


REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_GC_FUNCTION = (
    "import json, sys\n"
    "from functions.gc import handler\n"
    "print(json.dumps(handler(json.loads(sys.stdin.read()), None)))\n"
)
