"""Sorting a log into per-tablet runs and replaying a tablet from them (commitlog/sorting.py):
the sorted replay equals the direct replay, a task run twice or concurrently is harmless, a
tablet split after the plan still finds its rows, a slow task is read directly, and a missing
or damaged segment is Corruption, never a silent skip."""

from __future__ import annotations

import asyncio
import concurrent.futures
import concurrent.futures.process
import os
import random
import signal

import pytest

from tabletstore.commitlog import encode_record, encode_segment, replay_cells
from tabletstore.commitlog.runs import SortManifest, SortPlan, SortTask, TabletRange
from tabletstore.commitlog.sorting import (
    ReplayStats,
    SharedSorts,
    load_plan,
    plan_sort,
    run_sort_task,
    sorted_replay,
    task_done,
)
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import Cell, CellKind
from tabletstore.process_pool import ProcessPool, process_pool
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore, Op
from tabletstore.storage_s3.memory import MemoryObjectStore

W, INC = "w9", 3
TABLETS = [
    TabletRange("t1", "a", b"", b"g"),
    TabletRange("t1", "b", b"g", b"p"),
    TabletRange("t1", "c", b"p", None),
    TabletRange("t2", "a", b"", None),
]


async def write_log(store: MemoryObjectStore, segments: int = 12, per: int = 30) -> None:
    rnd = random.Random(7)
    seq = 1
    for n in range(segments):
        frames = []
        for _ in range(per):
            table = rnd.choice(["t1", "t1", "t2", "t3"])
            row = bytes([rnd.randrange(ord("a"), ord("z"))]) + b"%03d" % rnd.randrange(50)
            cells = [
                Cell(row, "cf", b"q%d" % i, 100, seq + i, CellKind.PUT, b"v%d" % seq)
                for i in range(2)
            ]
            seq += 2
            frames.append(encode_record(table, row, cells))
        await store.create(layout.log_segment_key(W, INC, n), encode_segment(W, INC, n, frames))


async def direct(store: MemoryObjectStore, t: TabletRange, after: int = 0) -> list[Cell]:
    cells = [
        c async for c in replay_cells(store, W, INC, t.table_id, t.start_row, t.end_row, after)
    ]
    return sorted(cells, key=lambda c: (c.row, c.seq))


async def owned_replay(
    store: ObjectStore,
    plan: SortPlan,
    t: TabletRange,
    reserved: set[int],
    shared: SharedSorts,
    stats: ReplayStats | None = None,
) -> list[Cell]:
    """``t``'s cells replayed by the log's owner: it sorts the ``reserved`` tasks itself
    through ``shared`` and waits as long as that takes."""
    return [
        c
        async for c in sorted_replay(
            store,
            plan,
            t.table_id,
            t.start_row,
            t.end_row,
            0,
            wait=3600.0,
            run_here=reserved,
            shared=shared,
            stats=stats,
        )
    ]


async def from_runs(
    store: MemoryObjectStore,
    t: TabletRange,
    after: int = 0,
    wait: float = 5.0,
    stats: ReplayStats | None = None,
) -> list[Cell]:
    plan = await load_plan(store, W, INC)
    assert plan is not None
    return [
        c
        async for c in sorted_replay(
            store, plan, t.table_id, t.start_row, t.end_row, after, wait=wait, stats=stats
        )
    ]


async def sort_all(store: MemoryObjectStore) -> list[SortManifest]:
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    return list(await asyncio.gather(*(run_sort_task(store, plan, t) for t in plan.tasks)))


async def test_sorted_replay_equals_direct_replay_and_reads_each_byte_once() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    manifests = await sort_all(store)
    plan = await load_plan(store, W, INC)
    assert plan is not None and len(plan.tasks) > 2 and plan.fence == 12
    log_bytes = sum(m.read_bytes for m in manifests)
    run_bytes = 0
    for t in TABLETS:
        stats = ReplayStats()
        got = await from_runs(store, t, stats=stats)
        assert got == await direct(store, t)
        assert [(c.row, c.seq) for c in got] == sorted((c.row, c.seq) for c in got)
        run_bytes += stats.run_bytes
        assert stats.direct_tasks == 0
    # Every tablet together reads about the log once (run headers aside).
    assert run_bytes < 1.2 * log_bytes
    # Records of table t3 (no plan range holds them) are kept in t3's catch-all run: a tablet
    # of t3 the plan did not know (the master planned before it could list every tablet)
    # replays them all.
    assert sum(m.unplanned for m in manifests) > 0
    unknown = TabletRange("t3", "x", b"", None)
    got = await from_runs(store, unknown)
    assert got and got == await direct(store, unknown)
    # Redo point: only cells past it.
    later = await from_runs(store, TABLETS[1], after=500)
    assert later == await direct(store, TABLETS[1], after=500) and all(c.seq > 500 for c in later)


async def test_a_task_run_twice_or_concurrently_writes_the_same_result() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    task = plan.tasks[1]
    first, second = await asyncio.gather(
        run_sort_task(store, plan, task), run_sort_task(store, plan, task)
    )
    assert first == second == await run_sort_task(store, plan, task)
    # A sorter that died after some runs but before its manifest: the rerun completes it.
    other = plan.tasks[2]
    done = await run_sort_task(store, plan, other)
    await store.delete(layout.recovery_manifest_key(W, INC, other.first))
    await store.delete(done.runs[-1].key)
    assert await run_sort_task(store, plan, other) == done


async def test_a_plan_that_knows_no_tablet_still_replays_every_record() -> None:
    """The master may plan before it can list the tablets (the root and METADATA tablets of
    the dead worker are not served yet): every record then lands in a catch-all run, and each
    tablet still replays exactly its own records."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, [], task_bytes=3000)
    manifests = await asyncio.gather(*(run_sort_task(store, plan, t) for t in plan.tasks))
    assert sum(m.unplanned for m in manifests) == sum(m.records for m in manifests)
    for t in [*TABLETS, TabletRange("t3", "x", b"", b"m"), TabletRange("t3", "y", b"m", None)]:
        assert await from_runs(store, t) == await direct(store, t)


async def test_tasks_are_cut_at_task_segments() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store, segments=12)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=10**9, task_segments=5)
    assert [(t.first, t.stop) for t in plan.tasks] == [(0, 5), (5, 10), (10, 12)]
    with pytest.raises(InvalidArgument):
        await plan_sort(MemoryObjectStore(shared=False), W, INC, TABLETS, task_segments=0)


async def test_a_process_reads_each_recovery_object_once() -> None:
    """Plans, manifests and runs are immutable: the tablets one worker recovers share one
    GET of each (the catch-all run of a table is read by all of them)."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    await sort_all(store)
    counted = InstrumentedObjectStore(store)
    halves = [TabletRange("t3", "x", b"", b"m"), TabletRange("t3", "y", b"m", None)]
    plan = await load_plan(counted, W, INC)
    assert plan is not None
    for t in halves:
        assert [
            c
            async for c in sorted_replay(
                counted, plan, t.table_id, t.start_row, t.end_row, 0, wait=1
            )
        ] == await direct(store, t)
    gets = counted.stats()[Op.GET].requests
    runs = {r.key for t in plan.tasks for r in (await run_sort_task(store, plan, t)).runs}
    catch_all = [k for k in runs if "/t3/" in k]
    # one plan, one manifest per task, one GET per t3 run, whichever half read it first
    assert gets == 1 + len(plan.tasks) + len(catch_all)


async def test_a_plan_from_a_log_position_sorts_only_the_segments_from_there() -> None:
    """The tablets' log positions (§5.3) bound where their unflushed writes start: the
    segments below the lowest one are neither read nor sorted."""
    store = MemoryObjectStore(shared=False)
    await write_log(store, segments=12)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=10**9, start_segment=7)
    assert [(t.first, t.stop) for t in plan.tasks] == [(7, 12)]
    manifests = await asyncio.gather(*(run_sort_task(store, plan, t) for t in plan.tasks))
    for t in TABLETS:
        from_position = [
            c
            async for c in replay_cells(
                store, W, INC, t.table_id, t.start_row, t.end_row, 0, start_segment=7
            )
        ]
        order = sorted(from_position, key=lambda c: (c.row, c.seq))
        assert await from_runs(store, t) == order
    log_bytes = 0
    for n in range(12):
        log_bytes += len(await store.get(layout.log_segment_key(W, INC, n)) or b"")
    assert sum(m.read_bytes for m in manifests) < log_bytes / 2


async def test_a_trimmed_log_that_ends_below_every_position_plans_nothing() -> None:
    """Garbage collection trimmed the live log's head (gc_plan rule 3a), keeping its newest
    segment; its writer died with a segment cut past that and never written, so every
    tablet's position lies past the log's end: nothing is sorted and nothing is missing."""
    store = MemoryObjectStore(shared=False)
    await write_log(store, segments=12)
    await store.delete_many([layout.log_segment_key(W, INC, n) for n in range(11)])
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=10**9, start_segment=13)
    assert plan.tasks == ()
    assert plan.fence == 12


async def test_plan_is_made_once_and_reused_after_failover() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    # A second master with other boundaries (a split happened since) reuses the first plan,
    # so the tasks' output does not depend on which master ran them.
    again = await plan_sort(store, W, INC, TABLETS[:1], task_bytes=10**9)
    assert again == plan


async def test_tablets_split_or_merged_after_the_plan_find_their_rows() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    await sort_all(store)
    children = [TabletRange("t1", "b1", b"g", b"k"), TabletRange("t1", "b2", b"k", b"p")]
    merged = TabletRange("t1", "ab", b"", b"p")
    for t in [*children, merged]:
        assert await from_runs(store, t) == await direct(store, t)


async def test_a_task_not_done_in_time_is_sorted_by_the_replay() -> None:
    """The first task's sorter is slow (never finishes here): the replay runs that task
    itself, so its runs then serve the other tablets too."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    for task in plan.tasks[1:]:  # the first task's sorter is slow (never finishes here)
        await run_sort_task(store, plan, task)
    stats = ReplayStats()
    got = await from_runs(store, TABLETS[0], wait=0.05, stats=stats)
    assert got == await direct(store, TABLETS[0]) and stats.direct_tasks == 1
    assert await task_done(store, plan, plan.tasks[0])
    again = ReplayStats()
    assert await from_runs(store, TABLETS[1], wait=0.05, stats=again) == await direct(
        store, TABLETS[1]
    )
    assert again.direct_tasks == 0


async def test_a_task_reserved_for_the_replayer_is_sorted_at_once_in_one_shared_run() -> None:
    """Owner affinity: the tablets' new owner sorts the log's task itself at once (no wait
    for a sorter: ``wait`` here would outlast the test's deadline), and its loads and its
    sorter share one read of the segments (SharedSorts)."""
    mem = MemoryObjectStore(shared=False)
    await write_log(mem)
    store = InstrumentedObjectStore(mem)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=10**9)
    assert len(plan.tasks) == 1
    shared = SharedSorts()
    store.reset()

    reserved = {plan.tasks[0].first}
    got = await asyncio.wait_for(
        asyncio.gather(
            *(owned_replay(store, plan, t, reserved, shared) for t in TABLETS),
            shared.run(store, plan, plan.tasks[0]),
        ),
        30,
    )
    for t, cells in zip(TABLETS, got[:-1], strict=True):
        assert cells == await direct(mem, t)
    # One run for all five callers: each segment read once, plus its check for a manifest.
    assert store.stats()[Op.GET].requests == plan.fence + 1
    assert await task_done(store, plan, plan.tasks[0])


async def test_missing_segment_below_the_window_is_corruption_for_plan_and_task() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store, segments=20)
    await store.delete(layout.log_segment_key(W, INC, 3))
    with pytest.raises(Corruption, match="missing"):
        await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    # Lost after the plan was made: the task fails loudly, and so does a direct read of it.
    store = MemoryObjectStore(shared=False)
    await write_log(store, segments=20)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    await store.delete(layout.log_segment_key(W, INC, 3))
    task = next(t for t in plan.tasks if t.first <= 3 < t.stop)
    with pytest.raises(Corruption):
        await run_sort_task(store, plan, task)
    with pytest.raises(Corruption):
        await from_runs(store, TABLETS[0], wait=0.0)


async def test_damaged_segment_or_run_is_corruption() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    key = layout.log_segment_key(W, INC, plan.tasks[0].first)
    data = bytearray(await store.get(key) or b"")
    data[-1] ^= 0xFF
    await store.delete(key)
    await store.create(key, bytes(data))
    with pytest.raises(Corruption):
        await run_sort_task(store, plan, plan.tasks[0])
    manifest = await run_sort_task(store, plan, plan.tasks[1])
    run = manifest.runs[0]
    data = bytearray(await store.get(run.key) or b"")
    data[-1] ^= 0xFF
    await store.delete(run.key)
    await store.create(run.key, bytes(data))
    t = next(t for t in TABLETS if (t.table_id, t.tablet_id) == (run.table_id, run.tablet_id))
    with pytest.raises(Corruption):
        await from_runs(store, t, wait=0.0)
    # A rerun of the task does not paper over the damaged run either.
    await store.delete(layout.recovery_manifest_key(W, INC, plan.tasks[1].first))
    with pytest.raises(Corruption, match="other contents"):
        await run_sort_task(store, plan, plan.tasks[1])


async def test_an_owner_sorts_every_task_of_a_log_on_a_process_pool_and_reads_it_once() -> None:
    """Owner affinity for a log of several tasks (§6): the worker given every tablet of the
    log sorts all its tasks at once, decoding and encoding in a process pool; the runs come
    back to it in memory, are written create-only as before (a rerun elsewhere finds the same
    bytes), and its tablets replay them without reading them back: the segments are the only
    bytes read."""
    mem = MemoryObjectStore(shared=False)
    await write_log(mem, segments=16)
    store = InstrumentedObjectStore(mem)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    assert len(plan.tasks) >= 4
    pool = process_pool(2)
    shared = SharedSorts(cpu=lambda: pool, parallel=3, inline_bytes=0)
    store.reset()
    reserved = {t.first for t in plan.tasks}

    try:
        got = await asyncio.wait_for(
            asyncio.gather(*(owned_replay(store, plan, t, reserved, shared) for t in TABLETS)), 60
        )
    finally:
        pool.shutdown(wait=True)
    for t, cells in zip(TABLETS, got, strict=True):
        assert cells == await direct(mem, t)
    stats = store.stats()[Op.GET]
    # Each segment once, plus each task's check for a manifest: no run read back.
    assert stats.requests == plan.fence + len(plan.tasks)
    log_bytes = sum(
        [len(await mem.get(layout.log_segment_key(W, INC, n)) or b"") for n in range(plan.fence)]
    )
    assert stats.bytes == log_bytes
    # The runs and manifests are in the store, the very bytes an inline rerun writes.
    for task in plan.tasks:
        assert await task_done(mem, plan, task)
        assert await run_sort_task(mem, plan, task) == await _rerun(mem, plan, task)


async def _rerun(store: MemoryObjectStore, plan: SortPlan, task: SortTask) -> SortManifest:
    """The task run again inline after its manifest is removed: _create_same compares every
    run with what the pool wrote (Corruption on any difference)."""
    key = layout.recovery_manifest_key(W, INC, task.first)
    data = await store.get(key)
    await store.delete(key)
    manifest = await run_sort_task(store, plan, task)
    assert manifest.to_bytes() == data
    return manifest


async def test_a_damaged_segment_is_corruption_in_a_pool_process_too() -> None:
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    key = layout.log_segment_key(W, INC, plan.tasks[0].first)
    data = bytearray(await store.get(key) or b"")
    data[-1] ^= 0xFF
    await store.delete(key)
    await store.create(key, bytes(data))
    pool = process_pool(1)
    try:
        with pytest.raises(Corruption):
            await SharedSorts(cpu=lambda: pool, inline_bytes=0).run(store, plan, plan.tasks[0])
    finally:
        pool.shutdown(wait=True)
    assert not await task_done(store, plan, plan.tasks[0])


class _BrokenPool(concurrent.futures.Executor):
    """A pool whose processes are gone (one was killed): every submit fails."""

    def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise concurrent.futures.process.BrokenProcessPool("a pool process died")


async def test_a_broken_sort_pool_falls_back_to_sorting_in_the_event_loop() -> None:
    """A pool process killed (out of memory, say) must not fail the owner's recovery: the
    task runs again in the worker's event loop, and so do the later ones."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    made: list[int] = []

    def make() -> concurrent.futures.Executor:
        made.append(1)
        return _BrokenPool()

    shared = SharedSorts(cpu=make, inline_bytes=0)
    got = [await shared.run(store, plan, t) for t in plan.tasks]
    assert [m.first for m in got] == [t.first for t in plan.tasks]
    assert all([await task_done(store, plan, t) for t in plan.tasks])
    assert made == [1]


async def test_a_worker_sort_pool_whose_process_dies_is_replaced() -> None:
    """The worker's sort pool (a ProcessPool) outlives the loss of a process: the next task
    runs in a new pool, not in the event loop, and so do the later ones."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    assert len(plan.tasks) >= 3
    pool = ProcessPool(1, name="sort")
    try:
        shared = SharedSorts(cpu=lambda: pool, inline_bytes=0)
        first = await shared.run(store, plan, plan.tasks[0])
        os.kill(await pool.run(os.getpid), signal.SIGKILL)  # the OOM killer, say
        rest = [await shared.run(store, plan, t) for t in plan.tasks[1:]]
        assert [m.first for m in [first, *rest]] == [t.first for t in plan.tasks]
        assert all([await task_done(store, plan, t) for t in plan.tasks])
        assert pool.renewals == 1 and shared._cpu is pool  # still sorting in processes
    finally:
        pool.shutdown(wait=True)


async def test_a_small_task_is_sorted_in_the_event_loop_without_starting_the_pool() -> None:
    """The pool's first task waits for its processes to start (a Python start-up each): a
    task of at most ``inline_bytes`` is sorted in the event loop instead and never makes the
    pool, so the recovery of a small log does not wait for it; a larger task still goes to
    the pool."""
    store = MemoryObjectStore(shared=False)
    await write_log(store)
    plan = await plan_sort(store, W, INC, TABLETS, task_bytes=3000)
    small = min(plan.tasks, key=lambda t: t.size)
    large = max(plan.tasks, key=lambda t: t.size)
    made: list[int] = []
    submitted: list[str] = []

    class Counting(concurrent.futures.ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
            submitted.append(fn.__name__)
            return super().submit(fn, *args, **kwargs)

    pool = Counting(1)

    def make() -> concurrent.futures.Executor:
        made.append(1)
        return pool

    try:
        shared = SharedSorts(cpu=make, inline_bytes=small.size)
        assert large.size > small.size
        manifest = await shared.run(store, plan, small)
        assert manifest.first == small.first and await task_done(store, plan, small)
        assert made == [] and submitted == []
        await shared.run(store, plan, large)
        assert made == [1] and submitted == ["sort_segments"]
    finally:
        pool.shutdown(wait=True)
