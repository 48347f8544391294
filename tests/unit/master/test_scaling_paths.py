"""The master's loops cost no more than the cluster grows (docs/architecture/master.md): counted
in calls and passes over their inputs, never timed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.master import assignment
from tabletstore.master.log_recovery import InProcessSortExecutor, LogRecovery
from tabletstore.master.master import Master
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.rpc.inprocess import InProcessTransport
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
