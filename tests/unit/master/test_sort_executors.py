"""Where sort tasks run (master/log_recovery.py, worker/sorter.py): the in-process executor
(asyncio and a process pool), the live workers through the coordinator (a sorter dying mid-task
loses its claim with its lease and another takes over), and the master's orchestration (dead logs
noticed, failed tasks retried a bounded number of times, a new master after a failover
reusing the plan and running only the tasks not done)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from tabletstore.commitlog.runs import SortManifest, SortPlan, SortTask
from tabletstore.commitlog.sorting import load_plan, plan_sort, run_sort_task, task_done
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.errors import Unavailable
from tabletstore.master.log_recovery import (
    InProcessSortExecutor,
    LogRecovery,
    WorkerSortExecutor,
)
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectInfo
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.worker.sorter import Sorter
from tests.unit.commitlog.test_commitlog_sorting import INC, TABLETS, W, write_log


class StallingStore(MemoryObjectStore):
    """Creates of recovery runs block while ``stall`` is set (a sorter hung mid-task)."""

    def __init__(self) -> None:
        super().__init__(shared=False)
        self.stall = False
        self.stalled = asyncio.Event()

    async def create(self, key: str, data: bytes) -> None:
        if self.stall and key.startswith("recovery/") and key.endswith(".run"):
            self.stalled.set()
            await asyncio.Event().wait()  # forever: the sorter is dead to the world
        await super().create(key, data)


async def _plan(store: MemoryObjectStore) -> SortPlan:
    await write_log(store)
    return await plan_sort(store, W, INC, TABLETS, task_bytes=3000)


async def test_in_process_executor_with_tasks_and_with_processes(tmp_path: Path) -> None:
    store = MemoryObjectStore(shared=False)
    plan = await _plan(store)
    executor = InProcessSortExecutor(store, parallel=2)
    manifests = await asyncio.gather(*(executor.run(plan, t) for t in plan.tasks))
    assert [m.first for m in manifests] == [t.first for t in plan.tasks]
    await executor.close()
    # A process pool over a local directory: the children open the store from its URL.
    url = f"file://{tmp_path}"
    disk = open_store(url)
    await write_log(disk)  # type: ignore[arg-type]
    plan = await plan_sort(disk, W, INC, TABLETS, task_bytes=3000)
    pool = InProcessSortExecutor(disk, processes=2, store_url=url)
    try:
        await pool.warm()
        got = await asyncio.gather(*(pool.run(plan, t) for t in plan.tasks))
    finally:
        await pool.close()
    assert all([await task_done(disk, plan, t) for t in plan.tasks])
    assert got[0] == await run_sort_task(disk, plan, plan.tasks[0])  # rerun: same manifest
    await disk.close()


async def test_live_workers_sort_and_a_dead_sorter_task_is_taken_over() -> None:
    store = StallingStore()
    plan = await _plan(store)
    coord = MemoryCoordinator()
    stop = asyncio.Event()
    # Sorter A hangs inside its first task (after claiming it), then loses its lease.
    lease_a = await coord.grant_lease(30.0)
    store.stall = True
    sorter_a = Sorter("A", store, coord, lease_a, poll=0.01, parallel=1)
    executor = WorkerSortExecutor(store, coord, poll=0.01)
    runs = [asyncio.ensure_future(executor.run(plan, t)) for t in plan.tasks]
    a = asyncio.ensure_future(sorter_a.run(stop))
    await asyncio.wait_for(store.stalled.wait(), 10)
    claims = await coord.get_prefix(paths.SORTERS)
    assert [kv.value for kv in claims] == [b"A"]
    store.stall = False
    # B starts: every task but A's is done by B; A's stays claimed while A's lease lives.
    lease_b = await coord.grant_lease(30.0)
    sorter_b = Sorter("B", store, coord, lease_b, poll=0.01)
    b = asyncio.ensure_future(sorter_b.run(stop))
    held = paths.parse_sort(claims[0].key.replace(paths.SORTERS, paths.SORTS, 1))[2]
    others = [r for r, t in zip(runs, plan.tasks, strict=True) if t.first != held]
    await asyncio.wait_for(asyncio.gather(*others), 20)
    assert not all(r.done() for r in runs)
    await lease_a.revoke()  # A's lease ends (killed): its claim vanishes, B takes the task
    manifests: list[SortManifest] = await asyncio.wait_for(asyncio.gather(*runs), 20)
    assert sorted(m.first for m in manifests) == [t.first for t in plan.tasks]
    assert sorter_b.done == len(plan.tasks)
    assert await coord.get_prefix(paths.SORTS) == []
    stop.set()
    a.cancel()
    await asyncio.gather(a, b, return_exceptions=True)


class GatheringStore(MemoryObjectStore):
    """Creates of recovery runs wait until ``width`` tasks are writing runs at once."""

    def __init__(self, width: int) -> None:
        super().__init__(shared=False)
        self.width = width
        self.writing: set[str] = set()
        self.together = asyncio.Event()

    async def create(self, key: str, data: bytes) -> None:
        if key.startswith("recovery/") and key.endswith(".run"):
            self.writing.add(key.split("/")[3])  # the task's first segment
            if len(self.writing) >= self.width:
                self.together.set()
            await self.together.wait()
        await super().create(key, data)


async def test_one_sorter_runs_several_tasks_at_once() -> None:
    """A sorter with parallel=3 has three tasks under way together (each task here waits
    for the other two before writing its runs: one task at a time would never finish)."""
    store = GatheringStore(width=3)
    plan = await _plan(store)
    assert len(plan.tasks) >= 3
    coord = MemoryCoordinator()
    lease = await coord.grant_lease(30.0)
    sorter = Sorter("A", store, coord, lease, poll=0.01, parallel=3)
    stop = asyncio.Event()
    running = asyncio.ensure_future(sorter.run(stop))
    executor = WorkerSortExecutor(store, coord, poll=0.01)
    manifests = await asyncio.wait_for(
        asyncio.gather(*(executor.run(plan, t) for t in plan.tasks)), 20
    )
    assert sorted(m.first for m in manifests) == [t.first for t in plan.tasks]
    assert sorter.done == len(plan.tasks)  # each task once, however many loops polled it
    stop.set()
    await running


async def test_a_failing_task_is_reported_to_the_master() -> None:
    store = MemoryObjectStore(shared=False)
    plan = await _plan(store)
    coord = MemoryCoordinator()
    lease = await coord.grant_lease(30.0)
    await store.delete(f"logs/{W}/{INC:020d}/{plan.tasks[0].first:020d}.log")
    sorter = Sorter("A", store, coord, lease, poll=0.01)
    stop = asyncio.Event()
    running = asyncio.ensure_future(sorter.run(stop))
    with pytest.raises(Unavailable, match="missing"):
        await asyncio.wait_for(
            WorkerSortExecutor(store, coord, poll=0.01).run(plan, plan.tasks[0]), 10
        )
    stop.set()
    await running


class CountingExecutor:
    def __init__(self, store: MemoryObjectStore, fail: set[int] | None = None) -> None:
        self.store = store
        self.fail = fail or set()
        self.ran: list[int] = []

    async def run(self, plan: SortPlan, task: SortTask) -> SortManifest:
        self.ran.append(task.first)
        if task.first in self.fail:
            raise Unavailable("sorter died")
        return await run_sort_task(self.store, plan, task)

    async def close(self) -> None:
        pass


def _records(logs: tuple[LogRef, ...]) -> list[TabletRecord]:
    return [
        TabletRecord(
            table_id=t.table_id,
            tablet_id=t.tablet_id,
            start_row=t.start_row,
            end_row=t.end_row,
            logs=logs,
        )
        for t in TABLETS
    ]


async def test_master_sorts_dead_logs_retries_and_a_new_master_resumes() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    coord = MemoryCoordinator()
    records = _records((LogRef(W, INC),))
    flaky = CountingExecutor(store, fail={0})
    recovery = LogRecovery(store, flaky, coord, task_bytes=3000, attempts=2)
    # The writer is live and this is its current incarnation: not touched.
    await coord.put(paths.setting(f"incarnation.{W}"), str(INC).encode())
    await recovery.start(records, {}, live=[W])
    assert await load_plan(store, W, INC) is None and flaky.ran == []
    # Its worker is gone: the log is fenced, planned and sorted; task 0 fails twice.
    await recovery.start(records, {}, live=[])
    await recovery.wait()
    plan = await load_plan(store, W, INC)
    assert plan is not None
    await recovery.start(records, {}, live=[])
    await recovery.wait()
    await recovery.start(records, {}, live=[])
    assert flaky.ran.count(0) == 2  # bounded: then the tablets read that task's segments
    assert not await task_done(store, plan, plan.tasks[0])
    assert recovery.sorting == {}
    # A new master (failover): same plan, runs only the task not done.
    fresh = CountingExecutor(store)
    again = LogRecovery(store, fresh, coord, task_bytes=10**9)
    await again.start(records, {}, live=[])
    await again.wait()
    assert fresh.ran == [0]
    assert all([await task_done(store, plan, t) for t in plan.tasks])
    # Claimed tablets need nothing: no sorting starts for a log only they list.
    other = LogRecovery(store, CountingExecutor(store), coord, task_bytes=3000)
    claimed = {(r.table_id, r.tablet_id): "B" for r in _records((LogRef("gone", 1),))}
    await other.start(_records((LogRef("gone", 1),)), claimed, live=["B"])
    assert other.sorting == {}
    # A log only one tablet lists is left to that tablet's direct replay (no second pass).
    await other.start(_records((LogRef(W, INC),))[:1], {}, live=[])
    assert other.sorting == {}


class SlowListStore(MemoryObjectStore):
    """Listing hangs until ``go`` is set (a paused or throttled object store)."""

    def __init__(self) -> None:
        super().__init__(shared=False)
        self.go = asyncio.Event()
        self.go.set()

    async def list(  # type: ignore[override]
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        await self.go.wait()
        async for info in super().list(prefix, start_after=start_after):
            yield info


async def test_a_slow_store_holds_the_assignment_round_back_only_plan_wait() -> None:
    store = SlowListStore()
    await write_log(store)
    store.go.clear()
    coord = MemoryCoordinator()
    executor = CountingExecutor(store)
    recovery = LogRecovery(store, executor, coord, task_bytes=3000, plan_wait=0.05)
    records = _records((LogRef(W, INC),))
    await asyncio.wait_for(recovery.start(records, {}, live=[]), 5)  # returns: loads go out
    assert recovery.sorting == {} and executor.ran == []
    store.go.set()  # the store answers again; the planning went on in the background
    async with asyncio.timeout(20):
        while not recovery.sorting:  # until a round takes in the plan made in the background
            await recovery.start(records, {}, live=[])
    await recovery.wait()
    plan = await load_plan(store, W, INC)
    assert plan is not None and sorted(executor.ran) == [t.first for t in plan.tasks]
    await recovery.close()


async def test_a_plan_starts_at_the_lowest_log_position_of_the_listing() -> None:
    """§5.3 log positions: the full listing's records bound where their writes past the redo
    point start; the plan sorts only the segments from the lowest one on."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    coord = MemoryCoordinator()
    dead = LogRef(W, INC)
    records = [replace(r, log_starts={dead: 3 + i}) for i, r in enumerate(_records((dead,)))]
    recovery = LogRecovery(store, CountingExecutor(store), coord, task_bytes=10**9)
    await recovery.start(records, {}, live=[])
    await recovery.wait()
    plan = await load_plan(store, W, INC)
    assert plan is not None and [(t.first, t.stop) for t in plan.tasks] == [(3, plan.fence)]


async def test_an_early_plan_partitions_by_every_known_tablet() -> None:
    """Before the root is loaded the master knows the tablets from its last listing, some of
    which were loaded on the dead worker since (their records read then do not list its log
    yet): the early plan still gives each known tablet its own runs, and a log that only an
    unclaimed METADATA tablet lists is sorted however few tablets list it."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    coord = MemoryCoordinator()
    dead = LogRef(W, INC)
    user = _records(())  # seen before they listed the dead log
    root = TabletRecord(
        table_id=METADATA_TABLE_ID, tablet_id="root", start_row=b"", end_row=b"!", logs=(dead,)
    )
    # By default no plan is made before the full listing (it bounds the log positions).
    default = LogRecovery(store, CountingExecutor(store), coord, task_bytes=3000)
    await default.start([root, *user], {}, live=[], early=True)
    assert default.sorting == {} and await load_plan(store, W, INC) is None
    recovery = LogRecovery(
        store, CountingExecutor(store), coord, task_bytes=3000, early_system_plans=True
    )
    await recovery.start([root, *user], {}, live=[], early=True)
    await recovery.wait()
    plan = await load_plan(store, W, INC)
    assert plan is not None
    assert {t.tablet_id for t in plan.tablets} == {"root", *(t.tablet_id for t in TABLETS)}
    # Not early: only the tablets listing the log count, and one is too few.
    other = LogRecovery(store, CountingExecutor(store), coord, task_bytes=3000)
    await other.start([replace(root, logs=(LogRef("x", 1),))], {}, live=[])
    assert other.sorting == {}


async def test_a_task_reserved_for_its_owner_is_sorted_there_or_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Owner affinity: a task published for worker A is sorted by A's sorter (its runs then
    stay in A's memory, where A replays the log's tablets), not by B polling alongside; if A
    never takes it (A died), B takes it once OWNER_GRACE has passed since B first saw it."""
    store = MemoryObjectStore(shared=False)
    plan = await _plan(store)
    task = plan.tasks[0]
    coord = MemoryCoordinator()
    executor = WorkerSortExecutor(store, coord, poll=0.01)
    executor.owner_of = lambda worker_id, incarnation: "A"
    stop = asyncio.Event()
    sorters = {
        name: Sorter(name, store, coord, await coord.grant_lease(30.0), poll=0.01)
        for name in ("A", "B")
    }
    running = [asyncio.ensure_future(s.run(stop)) for s in sorters.values()]
    await asyncio.wait_for(executor.run(plan, task), 20)
    assert (sorters["A"].done, sorters["B"].done) == (1, 0)
    stop.set()
    await asyncio.gather(*running)

    # A is gone: B waits out the grace, then sorts the task itself.
    import tabletstore.worker.sorter as sorter_module

    monkeypatch.setattr(sorter_module, "OWNER_GRACE", 0.5)
    other = plan.tasks[1]
    b = Sorter("B", store, coord, await coord.grant_lease(30.0), poll=0.01)
    stop = asyncio.Event()
    running_b = asyncio.ensure_future(b.run(stop))
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(executor.run(plan, other), 20)
    assert b.done == 1
    assert asyncio.get_running_loop().time() - started >= 0.5
    stop.set()
    await running_b


async def test_a_log_of_several_tasks_within_owner_bytes_is_reserved_whole_for_its_owner() -> None:
    """Owner affinity beyond one task (§6): a dead log of several tasks, no larger than
    ``owner_bytes``, gets one owner (its tablets are not spread: ``sorted_wide`` is False) and
    every task is published reserved for it; the owner's sorter claims them all at once,
    beyond its ``parallel`` loops (each task here waits for all the others before writing its
    runs: one or two at a time would never finish), and a sorter polling alongside takes
    none. A larger log is sorted wide, by everyone, without an owner."""
    dead = LogRef(W, INC)
    records = _records((dead,))
    # Larger than owner_bytes: spread, no owner.
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    coord = MemoryCoordinator()
    wide = LogRecovery(store, CountingExecutor(store), coord, task_bytes=3000, owner_bytes=3000)
    await wide.start(records, {}, live=[], owners={dead: "A"})
    assert wide.sorted_wide(dead) and wide.owner(dead) is None
    await wide.wait()
    plan = await load_plan(store, W, INC)
    assert plan is not None and len(plan.tasks) >= 3

    store = GatheringStore(width=len(plan.tasks))
    await write_log(store)
    coord = MemoryCoordinator()
    executor = WorkerSortExecutor(store, coord, poll=0.01)
    recovery = LogRecovery(store, executor, coord, task_bytes=3000)
    executor.owner_of = lambda worker_id, incarnation: recovery.owner(
        LogRef(worker_id, incarnation)
    )
    stop = asyncio.Event()
    sorters = {
        name: Sorter(name, store, coord, await coord.grant_lease(30.0), poll=0.01, parallel=1)
        for name in ("A", "B")
    }
    running = [asyncio.ensure_future(s.run(stop)) for s in sorters.values()]
    await recovery.start(records, {}, live=["A", "B"], owners={dead: "A"})
    assert recovery.owner(dead) == "A" and not recovery.sorted_wide(dead)
    state_plan = recovery.sorting[dead]
    assert len(state_plan.tasks) == len(plan.tasks)

    async def published_for_a() -> bool:
        found = await coord.get_prefix(paths.SORTS)
        return len(found) == len(plan.tasks) and all(
            json.loads(kv.value)["owner"] == "A" for kv in found
        )

    deadline = asyncio.get_running_loop().time() + 20
    while not await published_for_a():
        assert asyncio.get_running_loop().time() < deadline, "tasks not published for A"
        await asyncio.sleep(0.01)
    await asyncio.wait_for(recovery.wait(), 20)
    assert all([await task_done(store, state_plan, t) for t in state_plan.tasks])
    assert (sorters["A"].done, sorters["B"].done) == (len(plan.tasks), 0)
    stop.set()
    await asyncio.gather(*running)
    await recovery.close()


class TaskStallingStore(StallingStore):
    """A StallingStore that records which tasks (first segments) hang in their run creates."""

    def __init__(self) -> None:
        super().__init__()
        self.stalled_tasks: set[str] = set()

    async def create(self, key: str, data: bytes) -> None:
        if self.stall and key.startswith("recovery/") and key.endswith(".run"):
            self.stalled_tasks.add(key.split("/")[3])
        await super().create(key, data)


async def test_an_owner_killed_mid_sort_leaves_every_task_to_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner of a log of several tasks claims them all, then hangs mid-sort and its lease
    ends (killed): its claims go with the lease, and once the grace is over another sorter
    takes every task; each is done once more, with the same bytes (create-only)."""
    import tabletstore.worker.sorter as sorter_module

    monkeypatch.setattr(sorter_module, "OWNER_GRACE", 0.3)
    store = TaskStallingStore()
    plan = await _plan(store)
    assert len(plan.tasks) >= 3
    coord = MemoryCoordinator()
    executor = WorkerSortExecutor(store, coord, poll=0.01)
    executor.owner_of = lambda worker_id, incarnation: "A"
    stop = asyncio.Event()
    lease_a = await coord.grant_lease(30.0)
    store.stall = True
    a = asyncio.ensure_future(Sorter("A", store, coord, lease_a, poll=0.01, parallel=1).run(stop))
    runs = [asyncio.ensure_future(executor.run(plan, t)) for t in plan.tasks]

    async def all_claimed_by_a() -> bool:
        claims = await coord.get_prefix(paths.SORTERS)
        return len(claims) == len(plan.tasks) and all(kv.value == b"A" for kv in claims)

    deadline = asyncio.get_running_loop().time() + 20
    while not await all_claimed_by_a():  # every task, beyond A's one loop
        assert asyncio.get_running_loop().time() < deadline, "A did not claim every task"
        await asyncio.sleep(0.01)
    while len(store.stalled_tasks) < len(plan.tasks):  # A hangs inside every task
        assert asyncio.get_running_loop().time() < deadline, store.stalled_tasks
        await asyncio.sleep(0.01)
    store.stall = False
    b_sorter = Sorter("B", store, coord, await coord.grant_lease(30.0), poll=0.01)
    b = asyncio.ensure_future(b_sorter.run(stop))
    await lease_a.revoke()  # A is killed: its claims vanish with its lease
    manifests = await asyncio.wait_for(asyncio.gather(*runs), 30)
    assert sorted(m.first for m in manifests) == [t.first for t in plan.tasks]
    assert b_sorter.done == len(plan.tasks)
    stop.set()
    a.cancel()
    await asyncio.gather(a, b, return_exceptions=True)


async def test_a_dead_owners_tasks_are_re_reserved_for_the_next_owner_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The owner of a dead log dies itself before sorting it (its lease gone: it leaves the
    live workers). The master's next round places the log on another worker, and the tasks
    still published are re-reserved for it: its sorter takes them at once, without waiting out
    the grace the other sorters give a reserved task (here far longer than the test)."""
    import tabletstore.worker.sorter as sorter_module

    monkeypatch.setattr(sorter_module, "OWNER_GRACE", 3600.0)
    dead = LogRef(W, INC)
    records = _records((dead,))
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    coord = MemoryCoordinator()
    executor = WorkerSortExecutor(store, coord, poll=0.01)
    recovery = LogRecovery(store, executor, coord, task_bytes=3000)
    executor.owner_of = lambda worker_id, incarnation: recovery.owner(
        LogRef(worker_id, incarnation)
    )
    stop = asyncio.Event()
    b = Sorter("B", store, coord, await coord.grant_lease(30.0), poll=0.01)
    running = asyncio.ensure_future(b.run(stop))
    # A owns the log, and never sorts (it hangs, then its lease ends).
    await recovery.start(records, {}, live=["A", "B"], owners={dead: "A"})
    plan = recovery.sorting[dead]
    assert recovery.owner(dead) == "A" and len(plan.tasks) >= 3

    async def published_for(owner: str) -> bool:
        found = await coord.get_prefix(paths.SORTS)
        return len(found) == len(plan.tasks) and all(
            json.loads(kv.value).get("owner") == owner for kv in found
        )

    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while not await published_for("A"):
        assert loop.time() < deadline, "tasks not published for A"
        await asyncio.sleep(0.01)
    assert b.done == 0
    # A's lease is gone: the master's next round chooses B (Master._owners) ...
    await recovery.start(records, {}, live=["B"], owners={dead: "B"})
    assert recovery.owner(dead) == "B"
    # ... and B sorts every task now, not after the grace.
    await asyncio.wait_for(recovery.wait(), 20)
    assert all([await task_done(store, plan, t) for t in plan.tasks])
    assert b.done == len(plan.tasks)
    stop.set()
    await running
    await recovery.close()


async def test_the_master_chooses_a_new_owner_when_the_chosen_one_is_gone() -> None:
    """``Master._owners``: the affinity worker of a dead log is kept while it lives, and
    chosen again (the live worker with the fewest claims) once its lease is gone."""
    from tabletstore.master.master import Master
    from tabletstore.rpc.inprocess import InProcessTransport

    coord = MemoryCoordinator()
    master = Master(coordinator=coord, transport=InProcessTransport())
    dead = LogRef(W, INC)
    records = _records((dead,))
    claims = {("x", "1"): "A", ("x", "2"): "B", ("x", "3"): "B"}
    try:
        live = {"A": "inproc://A", "B": "inproc://B", "C": "inproc://C"}
        assert master._owners(records, claims, live)[dead] == "C"
        claims[("x", "4")] = "A"  # C stays while it lives, whoever holds what
        assert master._owners(records, claims, live)[dead] == "C"
        del live["C"]  # C's lease ended
        assert master._owners(records, claims, live)[dead] == "A"
    finally:
        await master.close()
        await coord.close()
