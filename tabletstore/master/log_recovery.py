"""The master's side of recovery by sorting (§5.3, §6; docs/architecture/design.md §7): noticing
dead logs, planning their sort and having the tasks run somewhere.

Paper §6: "we avoid duplicating log reads by first sorting the commit log entries in order of
the keys ⟨table, row name, log sequence number⟩ ... the master coordinates the sorting process
and initiates the sort when a tablet server indicates that it needs to recover mutations from
some commit log file." Here the master does not wait to be asked: in each assignment round,
before it sends the loads of the user tablets, :class:`LogRecovery` looks at the logs listed by
unclaimed tablets, and for each one whose writer is gone (its worker left the servers
directory, or moved on to a later incarnation) it fences the log and creates its sort plan
(:func:`~tabletstore.commitlog.sorting.plan_sort`), then hands the plan's tasks to a
:class:`SortExecutor`. The loads go out meanwhile; each new owner replays from the runs as
they appear (``worker.log.replay_logged``), reading a task's segments itself if that task is
not done within ``WorkerOptions.sort_wait``.

Where the tasks run is the executor's business, behind one interface:

* :class:`InProcessSortExecutor` — asyncio tasks, or a process pool over a shareable store
  URL (the embedded default; the benchmark's N sorters);
* :class:`WorkerSortExecutor` — the live workers (the paper's choice): a task is published
  under ``sorts/...`` in the coordinator, a worker claims it with a key attached to its lease
  (``sorters/...``) and runs it (:mod:`tabletstore.worker.sorter`); a sorter that dies loses
  its claim with its lease and another worker takes the task;
* ``master.sort_lambda.LambdaSortExecutor`` — AWS Lambda functions (``functions/log_sort.py``).

A point-in-time restore (``master/pitr_restore.py``) sorts the retained log through the same
executors: its plans carry a scope (``SortPlan.scope``), so its tasks, claims and runs live
under names of their own (``restores/<id>/`` in the bucket, ``sorts/.../<id>`` in the
coordinator) and never meet a recovery's.

Every task is idempotent (a rerun writes the same bytes), so an executor may run one twice,
and a master failing over mid-sort simply makes the same plan's missing tasks run again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tabletstore.commitlog.runs import SortManifest, SortPlan, SortTask, TabletRange
from tabletstore.commitlog.sorting import (
    plan_sort,
    run_sort_task,
    sort_task_by_number,
    task_done,
)
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, Put, mod_revision_is
from tabletstore.errors import Corruption, InvalidArgument, TabletStoreError, Unavailable
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.process_pool import process_pool
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.layout import recovery_manifest_key

__all__ = [
    "DEFAULT_OWNER_BYTES",
    "InProcessSortExecutor",
    "LogRecovery",
    "SortExecutor",
    "WorkerSortExecutor",
]

log = logging.getLogger(__name__)

#: A log listed by fewer tablets than this is left to the direct replay (bench/recovery.py:
#: with one tablet the direct replay is faster; from two on the sort reads less).
MIN_TABLETS_TO_SORT = 2
#: Default largest dead log (bytes of segments to sort) whose tablets all go to one worker,
#: which sorts all its tasks on its cores (owner affinity). The runs wait for its tablets'
#: replay in its memory, then on its local disk (``commitlog.spill``; 1 GiB by default): a
#: log larger than that would have part of its runs read back from the store. A larger log
#: also takes one worker's cores longer to sort than all workers' together, so past this
#: bound it is sorted by every worker, its tablets spread (read about twice).
DEFAULT_OWNER_BYTES = 512 * 1024 * 1024


class SortExecutor(Protocol):
    """Runs sort tasks somewhere; ``run`` returns the task's manifest once it is done."""

    async def run(self, plan: SortPlan, task: SortTask) -> SortManifest: ...

    async def close(self) -> None: ...


# --- in-process -------------------------------------------------------------------------------


def _sort_in_child(
    store_url: str, worker_id: str, incarnation: int, first: int, scope: str | None = None
) -> bytes:
    """A process-pool job: one task against a store opened from its URL; the manifest's bytes."""

    async def go() -> bytes:
        store = open_store(store_url)
        try:
            manifest = await sort_task_by_number(store, worker_id, incarnation, first, scope=scope)
        finally:
            await store.close()
        return manifest.to_bytes()

    return asyncio.run(go())


class InProcessSortExecutor:
    """Sort tasks in this process: at most ``parallel`` at once, as asyncio tasks, or in a pool
    of ``processes`` processes (then the store must be reachable from its ``store_url``: a
    local directory or S3, not memory). Processes use both cores for the decoding and
    encoding; asyncio tasks only overlap the I/O."""

    def __init__(
        self,
        store: ObjectStore,
        *,
        parallel: int = 4,
        processes: int = 0,
        store_url: str | None = None,
    ) -> None:
        if parallel < 1 or processes < 0:
            raise InvalidArgument(
                f"parallel must be >= 1 and processes >= 0, got {parallel}, {processes}"
            )
        if processes and store_url is None:
            raise InvalidArgument("a process pool of sorters needs the store's URL")
        self._store = store
        self._url = store_url
        self._processes = processes
        self._slots = asyncio.Semaphore(processes or parallel)
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        if processes:
            self._pool = process_pool(processes)

    async def warm(self) -> None:
        """Start the pool's processes now rather than at the first task (a master keeps its
        pool; the benchmark times recoveries, not process start-up)."""
        if self._pool is not None:
            loop = asyncio.get_running_loop()
            n = self._processes
            await asyncio.gather(*(loop.run_in_executor(self._pool, os.getpid) for _ in range(n)))

    async def run(self, plan: SortPlan, task: SortTask) -> SortManifest:
        async with self._slots:
            if self._pool is None:
                return await run_sort_task(self._store, plan, task)
            assert self._url is not None
            data = await asyncio.get_running_loop().run_in_executor(
                self._pool,
                _sort_in_child,
                self._url,
                plan.worker_id,
                plan.incarnation,
                task.first,
                plan.scope,
            )
            return SortManifest.from_bytes(data)

    async def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


# --- the live workers -------------------------------------------------------------------------


class WorkerSortExecutor:
    """Sort tasks run by the live workers (§6: "tablet servers" sort): published under
    ``sorts/<worker>/<incarnation>/<first>``; a worker's :class:`~tabletstore.worker.sorter.
    Sorter` claims one under ``sorters/...`` (attached to its lease), runs it and deletes the
    published key, or writes ``{"error": ...}`` into it when the task failed."""

    def __init__(self, store: ObjectStore, coordinator: Coordinator, *, poll: float = 0.1) -> None:
        self._store = store
        self._coord = coordinator
        self._poll = poll
        #: Which worker a log's task is reserved for (owner affinity: the worker that will
        #: serve every tablet of the log sorts it, and reads its runs from its own memory);
        #: :class:`LogRecovery` sets it. None: any sorter takes the task.
        self.owner_of: Callable[[str, int], str | None] = lambda worker_id, incarnation: None

    async def run(self, plan: SortPlan, task: SortTask) -> SortManifest:
        key = paths.sort(plan.worker_id, plan.incarnation, task.first, plan.scope)
        published: dict[str, object] = {"stop": task.stop}
        owner = self.owner_of(plan.worker_id, plan.incarnation)
        if owner is not None:
            # The other sorters leave it to the owner for a while (worker.sorter.OWNER_GRACE).
            published["owner"] = owner
        await self._coord.put(key, json.dumps(published).encode())
        while True:
            kv = await self._coord.get(key)
            if kv is None:
                break
            now = json.loads(kv.value)
            failure = now.get("error")
            if failure is not None:
                await self._coord.delete(key)
                raise Unavailable(f"sort task {key} failed on a worker: {failure}")
            owner = self.owner_of(plan.worker_id, plan.incarnation)
            if owner is not None and now.get("owner") != owner:
                # The owner died and the master chose another: reserved for the new one now
                # (its sorter takes it at once; the others give it a grace of its own). Only
                # over the value read: a task finished or failed meanwhile is left as it is.
                await self._coord.txn(
                    [mod_revision_is(key, kv.mod_revision)],
                    [Put(key, json.dumps({**now, "owner": owner}).encode())],
                    [],
                )
            await asyncio.sleep(self._poll)
        mkey = recovery_manifest_key(plan.worker_id, plan.incarnation, task.first, plan.scope)
        data = await self._store.get(mkey)
        if data is None:
            raise Unavailable(f"sort task {key} was taken down without its manifest")
        return SortManifest.from_bytes(data, where=mkey)

    async def close(self) -> None:
        """Published tasks stay: the workers finish them, and the next master reuses them."""


# --- the orchestrator -------------------------------------------------------------------------


@dataclass(slots=True)
class _LogSort:
    """One log being sorted: its plan and the state of each task (by first segment)."""

    plan: SortPlan
    #: The worker the master gives every tablet of this log to (owner affinity), which then
    #: sorts all its tasks; None when the log is sorted by several workers.
    owner: str | None = None
    done: set[int] = field(default_factory=set)
    running: dict[int, asyncio.Task[SortManifest]] = field(default_factory=dict)
    attempts: dict[int, int] = field(default_factory=dict)

    def finished(self, attempts: int) -> bool:
        return not self.running and all(
            t.first in self.done or self.attempts.get(t.first, 0) >= attempts
            for t in self.plan.tasks
        )


class LogRecovery:
    """Notices dead logs that unclaimed tablets need and has them sorted (module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        executor: SortExecutor,
        coordinator: Coordinator,
        *,
        task_bytes: int,
        attempts: int = 3,
        plan_wait: float = 2.0,
        early_system_plans: bool = False,
        owner_bytes: int = DEFAULT_OWNER_BYTES,
    ) -> None:
        """``owner_bytes``: the largest log (bytes of segments to sort) one worker sorts whole
        and serves every tablet of (owner affinity, :meth:`owner`); a larger one is sorted by
        every worker and its tablets spread. ``plan_wait``: seconds an assignment round waits for the planning of new dead logs
        before its loads go out anyway (see :meth:`start`). ``early_system_plans``: sort a
        dead log a root or METADATA tablet lists before METADATA can be listed, from its first
        segment (without log positions to start from: workers that do not trim their logs,
        and a bucket whose collector never trimmed a live log, ``gc_plan`` rule 3a: the head of
        a trimmed log is gone, and such a plan would find it missing)."""
        self._early_system_plans = early_system_plans
        if task_bytes < 1 or attempts < 1 or owner_bytes < 0:
            raise InvalidArgument(
                f"task_bytes and attempts must be >= 1 and owner_bytes >= 0, got {task_bytes}, "
                f"{attempts}, {owner_bytes}"
            )
        self._owner_bytes = owner_bytes
        self._store = store
        self.executor = executor
        self._coord = coordinator
        self._task_bytes = task_bytes
        self._attempts = attempts
        self._logs: dict[LogRef, _LogSort] = {}
        self._planning: dict[LogRef, asyncio.Task[_LogSort]] = {}
        self._plan_wait = plan_wait
        #: Logs whose plan failed (Corruption): reported once, not retried every round.
        self._broken: dict[LogRef, str] = {}
        #: Logs whose every task ran (done, or given up: the replayers sort those): not
        #: planned again while records read before their tablets loaded still list them.
        self._finished: set[LogRef] = set()

    @property
    def sorting(self) -> Mapping[LogRef, SortPlan]:
        """The logs being sorted now, with their plans."""
        return {ref: s.plan for ref, s in self._logs.items()}

    async def start(
        self,
        records: Sequence[TabletRecord],
        claims: Mapping[tuple[str, str], str],
        live: Iterable[str],
        *,
        early: bool = False,
        owners: Mapping[LogRef, str] | None = None,
    ) -> None:
        """Plan and start the sort of every dead log an unclaimed tablet of ``records`` lists
        (``records``: best every tablet record, so each plan partitions by all tablets listing
        the log; rows of others go to catch-all runs); start again the tasks of logs being
        sorted that failed or never ran. ``early``: the records are what the master knew
        before it could list METADATA (the root's, and those seen last round), so a dead log
        an unclaimed root or METADATA tablet lists is sorted however few of them list it
        (the tablets listing it are not all known yet). ``owners``: the worker the master
        places a dead log's tablets on (owner affinity); a log sorted in one task, or of at
        most ``owner_bytes``, has its tasks reserved for it (see :meth:`owner`)."""
        live_workers = set(live)
        needed: set[LogRef] = set()
        # The records listing each log, gathered in one pass: O(records + logs listed) per
        # round, where a scan of every record per dead log cost O(dead logs x records) (a
        # rack failure: tens of dead logs over every record of the cluster).
        listings: dict[LogRef, list[TabletRecord]] = {}
        for rec in records:
            if claims.get((rec.table_id, rec.tablet_id)) not in live_workers:
                needed.update(rec.logs)
            for ref in rec.logs:
                listings.setdefault(ref, []).append(rec)
        known = self._logs.keys() | self._broken.keys() | self._planning.keys() | self._finished
        for ref in sorted(needed - known, key=_order):
            if not await self._dead(ref, live_workers):
                continue
            listing = listings[ref]
            system = any(
                r.table_id == METADATA_TABLE_ID
                for r in listing
                if claims.get((r.table_id, r.tablet_id)) not in live_workers
            )
            if early and not (system and self._early_system_plans):
                # Left to this round's full listing (made once METADATA serves), whose
                # records give the log positions the sort may start from; the dead
                # worker's root and METADATA tablets meanwhile read the log directly from
                # their own positions, a short tail (WorkerOptions.log_trim_interval).
                continue
            if len(listing) < MIN_TABLETS_TO_SORT and not (early and system):
                # One reader reads the log once either way; sorting would add a second pass.
                continue
            # Early, the records were read before some tablets were loaded on the dead worker
            # (they do not list its log yet): partition by every known tablet, so their rows
            # still get runs of their own rather than the catch-all run.
            ranges = [
                TabletRange(r.table_id, r.tablet_id, r.start_row, r.end_row)
                for r in (records if early else listing)
            ]
            # Log positions (§5.3): no tablet listing the log has a write past its redo point
            # below its position. Only a full listing made after the writer died bounds them
            # all (records seen before may predate a tablet's load): early plans read it all.
            start = 0 if early else min(r.log_start(ref) for r in listing)
            self._planning[ref] = asyncio.get_running_loop().create_task(
                self._plan(ref, ranges, start),
                name=f"plan the sort of {ref.worker_id}/{ref.incarnation}",
            )
        # The planning is a few requests (fence, list, one PUT), but the object store may be
        # slow or paused: the loads of this round wait for it only so long, and a load that
        # starts before its log's plan exists replays the log directly (correct, slower).
        if self._planning:
            await asyncio.wait(list(self._planning.values()), timeout=self._plan_wait)
        for ref, planning in list(self._planning.items()):
            if not planning.done():
                continue
            del self._planning[ref]
            if planning.cancelled():
                continue
            exc = planning.exception()
            if isinstance(exc, Corruption):
                log.error(
                    "commit log %s/%s cannot be sorted: %s", ref.worker_id, ref.incarnation, exc
                )
                self._broken[ref] = str(exc)
            elif exc is not None:
                log.warning(
                    "planning the sort of %s/%s failed: %s", ref.worker_id, ref.incarnation, exc
                )
            else:
                self._logs[ref] = planning.result()
        for ref, state in list(self._logs.items()):
            if state.owner not in live_workers and owners and self._owned(state.plan):
                # None yet, or the owner died itself: the worker the master places the log's
                # tablets on now (the executor re-reserves the tasks still published).
                chosen = owners.get(ref)
                if state.owner is not None and chosen is not None and chosen != state.owner:
                    log.info(
                        "the owner %s of commit log %s/%s is gone: %s sorts it",
                        state.owner,
                        ref.worker_id,
                        ref.incarnation,
                        chosen,
                    )
                state.owner = chosen if chosen is not None else state.owner
            self._reap(ref, state)
            for task in state.plan.tasks:
                if task.first in state.done or task.first in state.running:
                    continue
                if state.attempts.get(task.first, 0) >= self._attempts:
                    continue
                state.attempts[task.first] = state.attempts.get(task.first, 0) + 1
                state.running[task.first] = asyncio.get_running_loop().create_task(
                    self.executor.run(state.plan, task),
                    name=f"sort {ref.worker_id}/{ref.incarnation}@{task.first}",
                )
            if state.finished(self._attempts):
                del self._logs[ref]
                self._finished.add(ref)

    def owner(self, ref: LogRef) -> str | None:
        """The worker every tablet of the dead log ``ref`` goes to, which sorts all its tasks
        (owner affinity: the runs stay in that worker's memory, so the log's records are read
        once in the cluster); None for a log sorted by several workers (larger than
        ``owner_bytes``, or before an owner is chosen) or not being sorted."""
        state = self._logs.get(ref)
        return None if state is None else state.owner

    def sorted_wide(self, ref: LogRef) -> bool:
        """Whether ``ref`` is being sorted in several tasks by several workers (then its
        tablets are spread)."""
        state = self._logs.get(ref)
        return state is not None and len(state.plan.tasks) > 1 and not self._owned(state.plan)

    def _owned(self, plan: SortPlan) -> bool:
        """Whether one worker sorts the whole of ``plan`` (owner affinity)."""
        return len(plan.tasks) == 1 or sum(t.size for t in plan.tasks) <= self._owner_bytes

    async def _plan(self, ref: LogRef, ranges: Sequence[TabletRange], start: int) -> _LogSort:
        """Fence, list and plan one log from segment ``start`` (or take its existing plan)
        and find its done tasks."""
        plan = await plan_sort(
            self._store,
            ref.worker_id,
            ref.incarnation,
            ranges,
            task_bytes=self._task_bytes,
            start_segment=start,
        )
        state = _LogSort(plan)
        for task in plan.tasks:  # a previous master's tasks that finished
            if await task_done(self._store, plan, task):
                state.done.add(task.first)
        log.info(
            "sorting commit log %s/%s: %d of its %d segments in %d tasks for %d tablets",
            ref.worker_id,
            ref.incarnation,
            sum(t.stop - t.first for t in plan.tasks),
            plan.fence,
            len(plan.tasks),
            len(plan.tablets),
        )
        return state

    def _reap(self, ref: LogRef, state: _LogSort) -> None:
        for first, task in list(state.running.items()):
            if not task.done():
                continue
            del state.running[first]
            if task.cancelled():
                continue
            exc = task.exception()
            if exc is None:
                state.done.add(first)
            else:
                level = logging.ERROR if isinstance(exc, Corruption) else logging.WARNING
                log.log(
                    level,
                    "sort task %s/%s@%d failed: %s",
                    ref.worker_id,
                    ref.incarnation,
                    first,
                    exc,
                )

    async def wait(self) -> None:
        """Wait for every task running now (tests and the benchmark)."""
        await asyncio.gather(*self._planning.values(), return_exceptions=True)
        tasks = [t for s in self._logs.values() for t in s.running.values()]
        await asyncio.gather(*tasks, return_exceptions=True)
        for ref, state in list(self._logs.items()):
            self._reap(ref, state)

    async def _dead(self, ref: LogRef, live: set[str]) -> bool:
        """Whether the log's writer is gone: its worker is not live, or runs a later
        incarnation (then this one was closed or failed and is never written again)."""
        if ref.worker_id not in live:
            return True
        kv = await self._coord.get(paths.setting(f"incarnation.{ref.worker_id}"))
        try:
            return kv is not None and int(kv.value) > ref.incarnation
        except ValueError:
            return False

    async def close(self) -> None:
        """Stop waiting for the tasks (they are idempotent: the next master runs them again)."""
        tasks = [
            *(t for s in self._logs.values() for t in s.running.values()),
            *self._planning.values(),
        ]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._logs.clear()
        self._planning.clear()
        try:
            await self.executor.close()
        except TabletStoreError as exc:
            log.warning("closing the sort executor: %s", exc)


def _order(ref: LogRef) -> tuple[str, int]:
    return (ref.worker_id, ref.incarnation)
