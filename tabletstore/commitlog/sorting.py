"""Sorting a dead worker's commit log, and replaying a tablet from the sorted runs (§5.3, §6).

Paper §6 ("Commit-log implementation"): with one log per server, every new owner of a dead
server's tablet would read the whole log. Bigtable instead sorts the log by ⟨table, row name,
log sequence number⟩, in parallel over its segments, and each new owner reads only its own
part. The three steps here, each idempotent (formats in :mod:`tabletstore.commitlog.runs`,
keys in :mod:`tabletstore.storage_s3.layout`):

1. :func:`plan_sort` (the master): fence the log (docs/architecture/design.md §6 rule 4), list it,
   check it is whole below its first fence (a missing or damaged segment is
   :class:`~tabletstore.errors.Corruption`, never skipped), cut its segments into tasks of
   about ``task_bytes`` and create the plan object. A plan that exists already (another master
   made it before failing over) is returned as it is, so every sort of a log uses one plan.
2. :func:`run_sort_task` (anyone: a local pool, a live worker, a Lambda function): read the
   task's segments once, partition the records by (table id, row) over the plan's tablet
   ranges, write one run per range that got records and then the manifest, all create-only.
   The output is a function of the plan and the segments, so a task run twice (a retried
   function, a duplicate, a sorter that died after some PUTs) writes the same bytes: a run or
   manifest that exists already is compared, and any difference is Corruption.
3. :func:`sorted_replay` (the tablet's new owner): wait for the tasks' manifests (at most
   ``wait`` seconds), read the runs of its table whose row range overlaps its own, keep its
   rows, and merge them by (row, seq) (``heapq.merge``). A task not done by then is run by
   the replayer itself (only those tasks; idempotent, so racing a slow sorter is harmless,
   and its runs then serve the other tablets too), so a slow or dead sorter costs time and
   its own few MB, never correctness. Without a plan the caller falls back to the direct
   replay.

Runs name row ranges rather than only tablets, so a tablet split, merged or moved after the
plan still finds every record of its rows: every run of its table whose range overlaps its own
is read. A record of a row no plan range holds goes to its table's **catch-all run** (tablet id
:data:`CATCH_ALL_TABLET`, range: the whole table), which every tablet of that table reads. So
the plan may be made before every tablet listing the log is known (the master plans a dead
worker's log before the root and METADATA tablets it held are served again, from the tablets
it knew last): the plan's ranges only decide how well the records are spread, never whether
one is replayed. The tasks are cut at ``task_bytes`` and at most ``task_segments`` segments
(one GET each), so a log of many small segments is sorted by several sorters at once.

Everything a replay reads here is immutable once it exists (plan, manifests, runs), so one
process keeps what it read (:class:`_Immutable`): the tablets one worker recovers from a log
share the GETs of its plan, manifests and catch-all runs.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import functools
import heapq
import logging
import weakref
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from tabletstore.clock import monotonic
from tabletstore.commitlog.format import LogRecord
from tabletstore.commitlog.reader import CommitLogReader, decode_log_segment, fence
from tabletstore.commitlog.runs import (
    RunInfo,
    SortManifest,
    SortPlan,
    SortTask,
    TabletRange,
    decode_run,
    encode_run_frames,
)
from tabletstore.commitlog.spill import RunSpill
from tabletstore.errors import Corruption, InvalidArgument, PreconditionFailed, Unavailable
from tabletstore.keys import Cell
from tabletstore.process_pool import ProcessPool
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.layout import (
    log_prefix,
    log_segment_key,
    parse_log_segment_key,
    recovery_manifest_key,
    recovery_plan_key,
    recovery_prefix,
    recovery_run_key,
)

__all__ = [
    "CATCH_ALL_TABLET",
    "DEFAULT_TASK_BYTES",
    "INLINE_SORT_BYTES",
    "MAX_TASK_SEGMENTS",
    "ReplayStats",
    "SharedSorts",
    "SortedRun",
    "load_plan",
    "plan_sort",
    "read_run",
    "run_sort_task",
    "sort_segments",
    "sort_task_by_number",
    "sorted_replay",
    "task_done",
]

#: Default bytes of segments per sort task: a few MB, as the paper's sorter works in pieces.
DEFAULT_TASK_BYTES = 4 * 1024 * 1024
#: Default upper bound on the segments of one sort task (each one is a GET).
MAX_TASK_SEGMENTS = 256
#: Default bytes of segments up to which :class:`SharedSorts` sorts a task in the event loop
#: even when it has a process pool: decoding, partitioning and encoding that much takes about
#: a tenth of a second of CPU (a task of small records), while the pool's first task waits for
#: its processes to start (a Python start-up each, seconds on a quiet machine and tens of
#: seconds on a loaded one), and a recovery's owner is often a worker that never sorted before.
INLINE_SORT_BYTES = 1024 * 1024
log = logging.getLogger(__name__)

#: The tablet id of a table's catch-all run: the records of rows no plan range holds.
CATCH_ALL_TABLET = "~catch-all"
#: Runs a replay fetches at once.
_FETCH_CONCURRENCY = 16


class _Immutable:
    """A process's copy of the recovery objects it read (plans, manifests, runs): they never
    change once they exist, so a key read once is not fetched again. Absent keys are not kept
    (a plan or manifest may appear later). Kept per store object (weakly: a closed store's
    copies go with it), bounded by bytes, oldest dropped first."""

    def __init__(self, max_bytes: int) -> None:
        self._max = max_bytes
        self._stores: weakref.WeakKeyDictionary[ObjectStore, dict[str, bytes]] = (
            weakref.WeakKeyDictionary()
        )
        self._sizes: weakref.WeakKeyDictionary[ObjectStore, int] = weakref.WeakKeyDictionary()

    async def get(self, store: ObjectStore, key: str) -> bytes | None:
        kept = self._stores.get(store)
        data = None if kept is None else kept.get(key)
        if data is not None:
            return data
        data = await store.get(key)
        if data is not None and len(data) <= self._max // 4:
            kept = self._stores.setdefault(store, {})
            kept[key] = data
            size = self._sizes.get(store, 0) + len(data)
            while size > self._max:
                size -= len(kept.pop(next(iter(kept))))
            self._sizes[store] = size
        return data

    def keep(self, store: ObjectStore, key: str, data: bytes) -> None:
        """Keep ``data``, just written to ``key`` create-only (or found there byte for byte):
        a sorter that also replays the tablets it sorted reads its runs from memory (§6: the
        tablet servers sort)."""
        if len(data) > self._max // 4:
            return
        kept = self._stores.setdefault(store, {})
        if key in kept:
            return
        kept[key] = data
        size = self._sizes.get(store, 0) + len(data)
        while size > self._max:
            size -= len(kept.pop(next(iter(kept))))
        self._sizes[store] = size

    def forget(self, store: ObjectStore) -> None:
        """Drop what was kept of ``store`` (a test that damages objects after reading them)."""
        self._stores.pop(store, None)
        self._sizes.pop(store, None)


#: The process-wide cache of recovery objects (64 MiB).
IMMUTABLE = _Immutable(64 * 1024 * 1024)


async def load_plan(
    store: ObjectStore, worker_id: str, incarnation: int, scope: str | None = None
) -> SortPlan | None:
    """The log's sort plan (``scope``: a restore's, ``layout.recovery_prefix``), or None when
    the log was never planned for sorting."""
    key = recovery_plan_key(worker_id, incarnation, scope)
    data = await IMMUTABLE.get(store, key)
    return None if data is None else SortPlan.from_bytes(data, where=key)


async def plan_sort(
    store: ObjectStore,
    worker_id: str,
    incarnation: int,
    tablets: Iterable[TabletRange],
    *,
    task_bytes: int = DEFAULT_TASK_BYTES,
    task_segments: int = MAX_TASK_SEGMENTS,
    start_segment: int = 0,
) -> SortPlan:
    """Fence the log, cut it into tasks and create its plan (or return the existing plan).

    ``tablets``: the ranges to partition the records by, best those of every tablet whose
    record lists the log (records of other rows go to catch-all runs). Tasks hold at most
    ``task_bytes`` (a single larger segment aside) and ``task_segments`` segments. Corruption
    if a segment is missing below the log's first fence (outside the in-flight window).
    ``start_segment``: the lowest log position (§5.3) of the tablets listing the log; the
    segments below it hold none of their writes past their redo points and are not sorted."""
    if task_bytes < 1 or task_segments < 1:
        raise InvalidArgument(
            f"task_bytes and task_segments must be >= 1, got {task_bytes}, {task_segments}"
        )
    existing = await load_plan(store, worker_id, incarnation)
    if existing is not None:
        return existing
    start = max(start_segment, 0)
    await fence(store, worker_id, incarnation, start=start)
    sizes: dict[int, int] = {}
    # Only the tail from the lowest log position is listed (a long-lived worker's log has
    # thousands of segments below it, none of which is sorted).
    after = log_segment_key(worker_id, incarnation, start - 1) if start > 0 else None
    async for info in store.list(log_prefix(worker_id, incarnation), start_after=after):
        sizes[parse_log_segment_key(info.key).seq] = info.size
    if not any(size == 0 for size in sizes.values()):
        # The log ends below ``start`` (fence() listed it whole): its fence is further down,
        # and no tablet needs a segment of it. Its head may be gone (garbage collection trims
        # a live log below every position, master/gc_plan.py rule 3a): nothing is checked
        # below ``start``.
        sizes = {}
        async for info in store.list(log_prefix(worker_id, incarnation)):
            sizes[parse_log_segment_key(info.key).seq] = info.size
    numbers = sorted(sizes)
    # fence() created a fence past the last segment and plugged the gaps a dead writer may
    # legitimately have left (its in-flight window): any other gap below is a lost segment.
    first_fence = min(n for n in numbers if sizes[n] == 0)
    missing = [n for n in range(start, first_fence) if n not in sizes]
    if missing:
        raise Corruption(
            f"commit log {worker_id}/{incarnation}: segment(s) {missing} missing below its "
            f"first fence {first_fence}; acknowledged writes may have been in them"
        )
    tasks: list[SortTask] = []
    first = min(max(start_segment, 0), first_fence)
    size = 0
    for n in range(first, first_fence):
        size += sizes[n]
        if size >= task_bytes or n + 1 - first >= task_segments:
            tasks.append(SortTask(first, n + 1, size))
            first, size = n + 1, 0
    if first < first_fence:
        tasks.append(SortTask(first, first_fence, size))
    ranges = tuple(sorted(set(tablets), key=lambda t: (t.table_id, t.start_row, t.tablet_id)))
    plan = SortPlan(worker_id, incarnation, first_fence, tuple(tasks), ranges)
    key = recovery_plan_key(worker_id, incarnation)
    try:
        await store.create(key, plan.to_bytes())
    except PreconditionFailed:
        # Another master planned meanwhile: its plan is the one every task follows.
        theirs = await load_plan(store, worker_id, incarnation)
        assert theirs is not None
        return theirs
    return plan


async def sort_task_by_number(
    store: ObjectStore,
    worker_id: str,
    incarnation: int,
    first_segment: int,
    *,
    shared: SharedSorts | None = None,
    scope: str | None = None,
) -> SortManifest:
    """Run the task of ``worker_id/incarnation``'s plan that starts at ``first_segment``: what a
    sorter given only names (a worker, a Lambda function) does; ``scope``: the plan of a
    restore's sort (``SortPlan.scope``). NotFound-like errors are Unavailable when the log has
    no plan (it may have been collected: nothing to sort)."""
    plan = await load_plan(store, worker_id, incarnation, scope)
    if plan is None:
        where = "" if scope is None else f" in restore {scope}"
        raise Unavailable(f"no sort plan for commit log {worker_id}/{incarnation}{where}")
    task = next((t for t in plan.tasks if t.first == first_segment), None)
    if task is None:
        raise InvalidArgument(
            f"the sort plan of {worker_id}/{incarnation} has no task at segment {first_segment}"
        )
    if shared is not None:
        return await shared.run(store, plan, task)
    return await run_sort_task(store, plan, task)


class _Partitioner:
    """Finds the plan range holding (table id, row): per table, ranges sorted by start row."""

    def __init__(self, tablets: Sequence[TabletRange]) -> None:
        self._by_table: dict[str, tuple[list[bytes], list[TabletRange]]] = {}
        for t in sorted(tablets, key=lambda t: (t.table_id, t.start_row, t.tablet_id)):
            starts, ranges = self._by_table.setdefault(t.table_id, ([], []))
            starts.append(t.start_row)
            ranges.append(t)

    def find(self, table_id: str, row: bytes) -> TabletRange | None:
        found = self._by_table.get(table_id)
        if found is None:
            return None
        starts, ranges = found
        i = bisect.bisect_right(starts, row) - 1
        # Ranges may overlap (a split intent listed beside its parent): the nearest start
        # that holds the row wins; any range holding it is read by whoever owns the row.
        while i >= 0:
            if ranges[i].holds(row):
                return ranges[i]
            i -= 1
        return None


class SharedSorts:
    """The sort tasks one worker is running (manifest key -> its run): a call for a task
    already running joins that run rather than read its segments again, so a worker's load
    that sorts the tasks reserved for it (owner affinity) and the same worker's sorter taking
    them from the coordinator share one read.

    ``cpu``: makes (once, at the first task) the process pool
    (:func:`tabletstore.process_pool.process_pool`) the tasks' decoding, partitioning and
    encoding run in, so the owner of a log cut into several tasks sorts them on all its
    cores; the segments are fetched and the runs written by this process, which so keeps them
    for its tablets' replay: in ``spill`` (memory, then local disk:
    :mod:`tabletstore.commitlog.spill`), or without one in memory (``IMMUTABLE``). None: in
    this process's event loop. A task of at most ``inline_bytes`` is sorted in the event loop
    all the same, and never makes the pool (:data:`INLINE_SORT_BYTES`): the recovery of a
    small log does not wait for processes to start. At most ``parallel`` tasks are under way
    at once (their segments in memory): one more than the pool's processes keeps them busy
    while the next task's segments are fetched."""

    def __init__(
        self,
        *,
        cpu: Callable[[], concurrent.futures.Executor] | None = None,
        parallel: int = 2,
        spill: RunSpill | None = None,
        inline_bytes: int = INLINE_SORT_BYTES,
    ) -> None:
        if parallel < 1:
            raise InvalidArgument(f"a worker sorts at least 1 task at once, got {parallel}")
        if inline_bytes < 0:
            raise InvalidArgument(f"inline_bytes must be >= 0, got {inline_bytes}")
        self._inline_bytes = inline_bytes
        self._running: dict[str, asyncio.Task[SortManifest]] = {}
        self._make_cpu = cpu
        self._cpu: concurrent.futures.Executor | None = None
        self._parallel = parallel
        self._slots: asyncio.Semaphore | None = None
        #: Where the runs sorted here are kept for this worker's replay (None: ``IMMUTABLE``).
        self.spill = spill

    async def run(self, store: ObjectStore, plan: SortPlan, task: SortTask) -> SortManifest:
        key = recovery_manifest_key(plan.worker_id, plan.incarnation, task.first, plan.scope)
        running = self._running.get(key)
        if running is None:
            running = asyncio.get_running_loop().create_task(self._sort(store, plan, task))
            self._running[key] = running
            running.add_done_callback(lambda done: self._finished(key, done))
        # Shielded: one caller cancelled (a load whose master went away) leaves the others'.
        return await asyncio.shield(running)

    async def _sort(self, store: ObjectStore, plan: SortPlan, task: SortTask) -> SortManifest:
        if self._slots is None:
            self._slots = asyncio.Semaphore(self._parallel)
        async with self._slots:
            if task.size <= self._inline_bytes:
                return await run_sort_task(store, plan, task, spill=self.spill)
            if self._cpu is None and self._make_cpu is not None:
                self._cpu = self._make_cpu()
            if self._cpu is not None:
                try:
                    return await run_sort_task(store, plan, task, cpu=self._cpu, spill=self.spill)
                except concurrent.futures.BrokenExecutor as exc:
                    # A process of a plain pool died (killed, out of memory): the pool is
                    # unusable. The task (idempotent) and every later one run here instead.
                    # (A ProcessPool replaces itself: _run_sort_task.)
                    log.warning("sort pool broken (%s): sorting in the event loop", exc)
                    self._cpu, self._make_cpu = None, None
            return await run_sort_task(store, plan, task, spill=self.spill)

    def _finished(self, key: str, done: asyncio.Task[SortManifest]) -> None:
        if self._running.get(key) is done:
            del self._running[key]
        if not done.cancelled():
            done.exception()  # retrieved: every caller still waiting gets it


async def run_sort_task(
    store: ObjectStore,
    plan: SortPlan,
    task: SortTask,
    *,
    cpu: concurrent.futures.Executor | None = None,
    spill: RunSpill | None = None,
) -> SortManifest:
    """Sort one task's segments into runs and record it done; idempotent (module docstring).
    ``cpu``: where the segments are decoded and the runs encoded; ``spill``: where the runs
    are kept for this process's replay, else in memory (see :class:`SharedSorts`)."""
    if task not in plan.tasks:
        raise Corruption(f"sort task {task} is not in the plan of {plan.worker_id}")
    return await _run_sort_task(store, plan, task, cpu, spill)


async def _run_sort_task(
    store: ObjectStore,
    plan: SortPlan,
    task: SortTask,
    cpu: concurrent.futures.Executor | None,
    spill: RunSpill | None,
) -> SortManifest:
    w, inc = plan.worker_id, plan.incarnation
    manifest_key = recovery_manifest_key(w, inc, task.first, plan.scope)
    done = await store.get(manifest_key)  # not the process's copy: the store decides
    if done is not None:
        return SortManifest.from_bytes(done, where=manifest_key)
    reader = CommitLogReader(store, w, inc)
    limit = asyncio.Semaphore(_FETCH_CONCURRENCY)

    async def fetch(number: int) -> bytes:
        # Segments are fetched concurrently (on S3 each GET is a round trip of tens of ms),
        # then decoded and partitioned in log order below.
        async with limit:
            return await reader.fetch_segment(number)

    numbers = range(task.first, task.stop)
    fetched = await asyncio.gather(*(fetch(n) for n in numbers))
    wheres = [reader.where(n) for n in numbers]
    if cpu is None:
        # Decoding, partitioning and encoding a task of at most a few hundred segments takes
        # well under a second: done inline. (In a thread it contends for the GIL with the
        # event loop's I/O, which in a chaos run starved workers' lease keep-alives.)
        sorted_ = sort_segments(plan, task, fetched, wheres)
    elif isinstance(cpu, ProcessPool):
        try:
            sorted_ = await cpu.run(functools.partial(sort_segments, plan, task, fetched, wheres))
        except Unavailable as exc:
            # Its process died twice running this task (the pool is replaced for the next
            # ones): this one is sorted here.
            log.warning("sort task %s: %s; sorting in the event loop", task.first, exc)
            sorted_ = sort_segments(plan, task, fetched, wheres)
    else:
        sorted_ = await asyncio.get_running_loop().run_in_executor(
            cpu, sort_segments, plan, task, fetched, wheres
        )
    del fetched
    read_bytes, records, unplanned, encoded = sorted_

    async def put(run: SortedRun) -> RunInfo:
        target = run.target
        key = recovery_run_key(w, inc, task.first, target.table_id, target.tablet_id, plan.scope)
        async with limit:
            await _create_same(store, key, run.data)
        # The stored bytes (_create_same compared them), kept for this process's replay.
        if spill is None:
            IMMUTABLE.keep(store, key, run.data)
        else:
            await spill.keep(key, run.data)
        return RunInfo(
            key,
            target.table_id,
            target.tablet_id,
            target.start_row,
            target.end_row,
            run.records,
            len(run.data),
            run.min_seq,
            run.max_seq,
        )

    # Every run exists before the manifest that says the task is done.
    runs = await asyncio.gather(*(put(run) for run in encoded))
    manifest = SortManifest(
        w, inc, task.first, task.stop, tuple(runs), read_bytes, records, unplanned
    )
    data = manifest.to_bytes()
    await _create_same(store, manifest_key, data)
    IMMUTABLE.keep(store, manifest_key, data)
    return manifest


class SortedRun(NamedTuple):
    """One run a sort task writes: its range, bytes, record count and seq bounds."""

    target: TabletRange
    data: bytes
    records: int
    min_seq: int
    max_seq: int


def sort_segments(
    plan: SortPlan, task: SortTask, segments: Sequence[bytes], wheres: Sequence[str]
) -> tuple[int, int, int, list[SortedRun]]:
    """A task's work between its GETs and its PUTs, a pure function of bytes (run in a pool
    process by an owner, :class:`SharedSorts`): decode the task's ``segments`` (named
    ``wheres`` in errors) in log order, partition their records over the plan's ranges and
    encode one run per range. Bytes and records read, records no plan range holds, and the
    runs in (table, start row, tablet) order."""
    partitioner = _Partitioner(plan.tablets)
    groups: dict[TabletRange, list[tuple[LogRecord, bytes]]] = {}
    read_bytes = records = unplanned = 0
    numbers = range(task.first, task.stop)
    for number, data, where in zip(numbers, segments, wheres, strict=True):
        frames: list[bytes] = []
        contents = decode_log_segment(
            data, plan.worker_id, plan.incarnation, number, where=where, frames=frames
        )
        if contents.fence:
            raise Corruption(
                f"commit log {plan.worker_id}/{plan.incarnation}: segment {number} is a fence "
                f"below the plan's first fence {plan.fence}"
            )
        assert contents.header is not None
        read_bytes += contents.header.records_length
        for record, frame in zip(contents.records, frames, strict=True):
            records += 1
            target = partitioner.find(record.table_id, record.row)
            if target is None:
                # No plan range holds the row: kept, in the table's catch-all run.
                unplanned += 1
                target = TabletRange(record.table_id, CATCH_ALL_TABLET, b"", None)
            groups.setdefault(target, []).append((record, frame))
    out = []
    for target in sorted(groups, key=lambda t: (t.table_id, t.start_row, t.tablet_id)):
        recs = groups[target]
        seqs = [c.seq for r, _ in recs for c in r.cells]
        data = encode_run_frames(target.table_id, target.start_row, target.end_row, recs)
        out.append(SortedRun(target, data, len(recs), min(seqs), max(seqs)))
    return read_bytes, records, unplanned, out


async def _create_same(store: ObjectStore, key: str, data: bytes) -> None:
    """Create ``key``; if it exists, it must hold exactly ``data`` (a duplicate task's)."""
    try:
        await store.create(key, data)
    except PreconditionFailed:
        theirs = await store.get(key)
        if theirs != data:
            raise Corruption(
                f"{key} exists with other contents than this sort task produces; the log or "
                "its plan changed under the sort"
            ) from None


async def task_done(store: ObjectStore, plan: SortPlan, task: SortTask) -> bool:
    return (
        await store.head(
            recovery_manifest_key(plan.worker_id, plan.incarnation, task.first, plan.scope)
        )
        is not None
    )


@dataclass(slots=True)
class ReplayStats:
    """What one :func:`sorted_replay` read (for logs and the benchmark)."""

    runs: int = 0
    run_bytes: int = 0
    #: Of which runs (and bytes) read from the replaying worker's own spill, not the store.
    local_runs: int = 0
    local_bytes: int = 0
    #: Tasks not done in time, which the replay sorted itself.
    direct_tasks: int = 0


async def _manifests(
    store: ObjectStore, plan: SortPlan, wait: float, *, skip: Collection[int] = ()
) -> dict[int, SortManifest | None]:
    """Task first segment -> its manifest, or None for a task not done within ``wait`` s
    (the tasks in ``skip`` are not looked for). Polls one listing of the log's recovery
    prefix, backing off."""
    deadline = monotonic() + wait
    prefix = recovery_prefix(plan.worker_id, plan.incarnation, scope=plan.scope)
    pending = {t.first for t in plan.tasks if t.first not in skip}
    found: dict[int, SortManifest | None] = {}
    if not pending:
        return found
    delay = 0.02
    while True:
        listed = {info.key async for info in store.list(prefix)}
        for first in sorted(pending):
            key = recovery_manifest_key(plan.worker_id, plan.incarnation, first, plan.scope)
            if key in listed:
                data = await IMMUTABLE.get(store, key)
                if data is not None:
                    found[first] = SortManifest.from_bytes(data, where=key)
                    pending.discard(first)
        if not pending or monotonic() >= deadline:
            break
        await asyncio.sleep(min(delay, max(0.0, deadline - monotonic())))
        delay = min(delay * 2, 0.2)
    for first in pending:
        found[first] = None
    return found


async def sorted_replay(
    store: ObjectStore,
    plan: SortPlan,
    table_id: str,
    start_row: bytes,
    end_row: bytes | None,
    after_seq: int,
    *,
    wait: float,
    stats: ReplayStats | None = None,
    run_here: Collection[int] = (),
    shared: SharedSorts | None = None,
) -> AsyncIterator[Cell]:
    """The cells with seq > ``after_seq`` of one tablet (``table_id``, rows in
    ``[start_row, end_row)``) from the sorted log, merged by (row, seq); see the module
    docstring for how unfinished tasks are handled. The tasks whose first segment is in
    ``run_here`` (reserved for the caller: owner affinity) are run here at once rather than
    waited for (through ``shared``, when given: the caller's worker may be sorting them)."""
    stats = stats if stats is not None else ReplayStats()

    async def sort(task: SortTask) -> SortManifest:
        if shared is None:
            return await run_sort_task(store, plan, task)
        return await shared.run(store, plan, task)

    here = [t for t in plan.tasks if t.first in run_here]
    if shared is None:
        ran = {t.first: await sort(t) for t in here}
    else:
        # All at once: ``shared`` bounds how many run side by side (on its pool's cores), and
        # the worker's other loads from this log join the same runs.
        manifests_here = await asyncio.gather(*(sort(t) for t in here))
        ran = {t.first: m for t, m in zip(here, manifests_here, strict=True)}
    manifests: dict[int, SortManifest | None] = {
        **await _manifests(store, plan, wait, skip=ran.keys()),
        **ran,
    }
    late = [t for t in plan.tasks if manifests[t.first] is None]
    if late:
        # Sorted here rather than read for this tablet alone: the same GETs, and the runs
        # then serve every other tablet waiting for these tasks (a task is idempotent, so a
        # slow sorter finishing it too is harmless).
        stats.direct_tasks += len(late)
        for task in late:  # one at a time: the sorters may be running them too
            manifests[task.first] = await sort(task)
    wanted: list[RunInfo] = []
    for task in plan.tasks:
        manifest = manifests[task.first]
        assert manifest is not None
        for run in manifest.runs:
            probe = TabletRange(run.table_id, run.tablet_id, run.start_row, run.end_row)
            if (
                run.table_id == table_id
                and run.max_seq > after_seq
                and probe.overlaps(start_row, end_row)
            ):
                wanted.append(run)
    mine = TabletRange(table_id, "", start_row, end_row)
    sources: list[list[LogRecord]] = []
    limit = asyncio.Semaphore(_FETCH_CONCURRENCY)
    spill = None if shared is None else shared.spill

    async def fetch(run: RunInfo) -> list[LogRecord]:
        async with limit:
            local = None if spill is None else await spill.get(run.key)
            if local is not None:
                try:
                    records = await _decode_off_loop(run, local)
                except Corruption as exc:
                    # A kept copy is a shortcut only: the store's copy decides.
                    assert spill is not None
                    spill.bad_copy(run.key, f"not a valid run ({exc})")
                else:
                    stats.local_runs += 1
                    stats.local_bytes += len(local)
                    stats.runs += 1
                    stats.run_bytes += len(local)
                    return [r for r in records if mine.holds(r.row) and r.last_seq > after_seq]
            data = await IMMUTABLE.get(store, run.key)
        if data is None:
            raise Corruption(f"recovery run {run.key} listed by its manifest is missing")
        records = await _decode_off_loop(run, data)
        stats.runs += 1
        stats.run_bytes += len(data)
        return [r for r in records if mine.holds(r.row) and r.last_seq > after_seq]

    sources.extend(await asyncio.gather(*(fetch(r) for r in wanted)))
    for record in heapq.merge(*sources, key=lambda r: (r.row, r.first_seq, r.last_seq)):
        for cell in record.cells:
            if cell.seq > after_seq:
                yield cell


async def read_run(store: ObjectStore, run: RunInfo) -> list[LogRecord]:
    """The records of the run a manifest lists, read from the store (not kept: a one-time
    reader such as a restore); Corruption if it is missing or not what the manifest says."""
    data = await store.get(run.key)
    if data is None:
        raise Corruption(f"sorted run {run.key} listed by its manifest is missing")
    return _decode_listed(run, data)


async def _decode_off_loop(run: RunInfo, data: bytes) -> list[LogRecord]:
    """:func:`_decode_listed`, on a thread for a run larger than :data:`INLINE_SORT_BYTES`:
    decoding a few MB takes the event loop, and the lease keep-alive on it, for 0.1 s of CPU
    or (on a loaded host) many times that; a thread lets the loop run between its slices."""
    if len(data) <= INLINE_SORT_BYTES:
        return _decode_listed(run, data)
    return await asyncio.to_thread(_decode_listed, run, data)


def _decode_listed(run: RunInfo, data: bytes) -> list[LogRecord]:
    """The records of ``data``, the run ``run`` of a manifest: Corruption unless it decodes
    (checksums) and matches what the manifest says of it."""
    header, records = decode_run(data, where=run.key)
    if (header.table_id, header.start_row, header.end_row) != (
        run.table_id,
        run.start_row,
        run.end_row,
    ) or header.record_count != run.records:
        raise Corruption(f"recovery run {run.key} does not match its manifest")
    return records
