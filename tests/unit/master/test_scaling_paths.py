"""The master's loops cost no more than the cluster grows (docs/architecture/master.md): counted
in calls and passes over their inputs, never timed."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tabletstore.clock import ManualClock
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.master import assignment, balancer
from tabletstore.master.assignment_watch import AssignmentWatch
from tabletstore.master.log_recovery import InProcessSortExecutor, LogRecovery
from tabletstore.master.master import Master
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.options import MasterOptions
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.messages import ServerStatusRequest, ServerStatusResponse, TabletStatus
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.storage_s3.memory import MemoryObjectStore


def test_placing_tablets_does_not_scan_every_worker_per_tablet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    scans = 0

    def counting_min(*args: Any, **kwargs: Any) -> Any:
        nonlocal scans
        scans += 1
        return min(*args, **kwargs)

    monkeypatch.setattr(assignment, "min", counting_min, raising=False)
    workers = [f"w{i:03d}" for i in range(50)]
    tablets = [assignment.TabletLoad("t", f"t{i:05d}", None) for i in range(500)]
    out = assignment.plan(workers, tablets)
    assert scans == 0  # was one scan of the 50 workers per tablet placed
    per_worker: dict[str, int] = {}
    for a in out:
        per_worker[a.worker] = per_worker.get(a.worker, 0) + 1
    assert sorted(per_worker) == workers and set(per_worker.values()) == {10}


def test_placement_still_fills_the_least_loaded_worker_first() -> None:
    held = [assignment.TabletLoad("t", f"h{i}", "a") for i in range(3)]
    fresh = [assignment.TabletLoad("t", f"n{i}", None) for i in range(4)]
    out = assignment.plan(["a", "b", "c"], [*held, *fresh])
    got = sorted(a.worker for a in out)
    assert got.count("a") == 0 and got.count("b") == 2 and got.count("c") == 2


class CountingCoordinator(MemoryCoordinator):
    def __init__(self) -> None:
        super().__init__()
        self.ranges = 0

    async def get_prefix(self, prefix: str) -> Any:
        self.ranges += 1
        return await super().get_prefix(prefix)


async def test_table_by_id_reads_one_schema_not_every_one() -> None:
    coord = CountingCoordinator()
    catalog = Catalog(coord)
    ids = []
    for name in ("alpha", "beta", "gamma"):
        schema = TableSchema(name=name, families={"f": ColumnFamily(name="f")})
        table_id = Catalog.new_table_id(name)
        ids.append(table_id)
        await catalog.create_table(schema, [TabletRecord(table_id, "t0", b"", None)])
    coord.ranges = 0
    for table_id in ids:
        assert (await catalog.table_by_id(table_id)).table_id == table_id
    assert coord.ranges == 0  # was a range read of every schema per call
    await coord.close()


class CountingRecords(list[TabletRecord]):
    passes = 0

    def __iter__(self) -> Iterator[TabletRecord]:
        CountingRecords.passes += 1
        return super().__iter__()


async def test_recovery_reads_the_records_once_per_round_not_once_per_dead_log() -> None:
    store = MemoryObjectStore()
    coord = MemoryCoordinator()
    recovery = LogRecovery(store, InProcessSortExecutor(store), coord, task_bytes=1 << 20)
    dead = [LogRef(f"dead{i:02d}", 1) for i in range(20)]
    records = CountingRecords(
        TabletRecord("t-1", f"t{i:03d}", b"%03d" % i, b"%03d" % (i + 1), logs=(dead[i % 20],))
        for i in range(100)
    )
    CountingRecords.passes = 0
    # Early, with no METADATA tablet among them: every dead log is looked at and left to the
    # full listing, so nothing is planned and only the passes over the records count.
    await recovery.start(records, {}, ["live"], early=True)
    assert CountingRecords.passes == 1  # was 1 + one per dead log
    await recovery.close()
    await coord.close()


def test_a_racks_dead_logs_get_different_owners() -> None:
    master = Master(coordinator=MemoryCoordinator(), transport=InProcessTransport())
    dead = [LogRef(f"dead{i}", 1) for i in range(3)]
    records = [
        TabletRecord("t-1", f"t{i:03d}", b"%03d" % i, b"%03d" % (i + 1), logs=(dead[i % 3],))
        for i in range(30)
    ]
    workers = {"a": "a:1", "b": "b:1", "c": "c:1"}
    owners = master._owners(records, {}, workers)
    assert sorted(owners[ref] for ref in dead) == ["a", "b", "c"]  # were all "a"


async def test_a_full_round_is_still_due_every_full_round_interval() -> None:
    clock = ManualClock()
    watch = AssignmentWatch(MemoryCoordinator(), full_interval=60.0, now=clock.monotonic)
    await watch.start()
    assert watch.take()  # nothing known yet
    assert not watch.take()
    clock.advance(59.0)
    assert not watch.take()
    clock.advance(1.0)
    assert watch.take()
    await watch.close()


class StatusWorkers:
    """W workers answering ``server_status`` with one equal tablet each, after a round trip
    (one sleep), counting the requests and the most in flight at once."""

    def __init__(self, transport: InProcessTransport, n: int) -> None:
        self.requests = self.in_flight = self.peak = 0
        self.addresses = {f"w{i:03d}": f"w{i:03d}" for i in range(n)}
        for wid in self.addresses:
            transport.register(wid, self._handlers(wid))

    def _handlers(self, wid: str) -> dict[str, Any]:
        async def server_status(req: ServerStatusRequest) -> ServerStatusResponse:
            self.requests += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            await asyncio.sleep(0.01)  # a round trip
            self.in_flight -= 1
            status = TabletStatus("t-1", f"{wid}-t", b"", None, 1, 1 << 20, 0, 0)
            return ServerStatusResponse(wid, wid, (status,))

        return {TABLET.method(TabletService.server_status).name: server_status}


async def test_the_balancer_polls_the_workers_concurrently_with_a_bound() -> None:
    """Each balancing round asks every worker for its tablets' loads: one after another, W
    round trips added up; now POLL_CONCURRENCY at a time."""
    transport = InProcessTransport()
    fleet = StatusWorkers(transport, 100)
    coord = MemoryCoordinator()
    master = Master(coordinator=coord, transport=transport)
    loads = await master.balancer._loads(fleet.addresses)
    assert loads is not None and len(loads) == 100
    assert 1 < fleet.peak <= balancer.POLL_CONCURRENCY  # was 1
    await master.close()
    await coord.close()


async def test_a_balanced_cluster_is_polled_every_balance_interval_not_every_round() -> None:
    """A balancing round runs every second once every tablet is served; finding nothing to
    move, it asked all W workers again the next second (O(W) requests and O(N) statuses a
    second); now after ``balance_interval``."""
    clock = ManualClock()
    transport = InProcessTransport()
    fleet = StatusWorkers(transport, 20)
    coord = MemoryCoordinator()
    for wid, address in fleet.addresses.items():
        await coord.put(paths.server(wid), address.encode())
    master = Master(coordinator=coord, transport=transport, clock=clock)
    for _ in range(10):
        assert await master.balancer.balance() == 0
        clock.advance(1.0)
    assert fleet.requests == 20  # was 200
    assert await master.balancer.balance() == 0
    assert fleet.requests == 40
    await master.close()
    await coord.close()


def test_moves_per_round_grow_with_the_cluster_and_stay_bounded_per_worker() -> None:
    """Adding 10 empty workers to 100 moved 2 tablets a round (418 rounds to converge); a
    round now moves up to a tenth of the workers' count, at most 2 per worker."""
    old = [f"w{i:03d}" for i in range(100)]
    new = [f"n{i:02d}" for i in range(10)]
    loads = [
        assignment.TabletLoad(f"t{i // 100}", f"x{i:05d}", old[i % 100], size=64 << 20)
        for i in range(10_000)
    ]
    out = assignment.plan(
        old + new, loads, balance=True, max_moves=11, max_moves_per_worker=2, ratio=1.5
    )
    per_worker = Counter(w for m in out for w in (m.source, m.worker))
    assert len(out) == 11 and max(per_worker.values()) <= 2  # were at most 2 moves in all
    shell = Master(coordinator=MemoryCoordinator(), transport=InProcessTransport()).balancer
    assert shell.moves_per_round(110) == 11
    assert shell.moves_per_round(5) == MasterOptions().max_moves


async def test_merging_lists_the_tables_a_few_times_per_merge_window_not_every_round() -> None:
    """A pair merges once it has stayed small for ``merge_after`` (600 s); listing every
    table's METADATA rows each balancing round (every second) for it was O(N) a second."""
    clock = ManualClock()
    coord = CountingCoordinator()
    master = Master(
        coordinator=coord,
        transport=InProcessTransport(),
        clock=clock,
        options=MasterOptions(merge_after=600.0),
    )
    for _ in range(120):
        await master.balancer.merge_small()
        clock.advance(1.0)
    assert coord.ranges == 2  # one listing of the schemas every 60 s; was 120
    await coord.close()
