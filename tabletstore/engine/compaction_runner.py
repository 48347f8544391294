"""Running a tablet's compactions (§5.4) and committing their results.

*Minor* freezes the memtable and writes one SSTable per locality group, then moves the redo
point; *merging* rewrites the newest few SSTables of a group into one; *major* rewrites
everything of a group into one SSTable with no deletion entries left; an *adopted* major
compaction is one run elsewhere (a serverless function) whose output this tablet takes in.
What to compact is decided by the pure planner :mod:`tabletstore.engine.compaction`; how the
tablet's state changes, by the pure steps of :mod:`tabletstore.engine.state`.

Failed compactions. A compaction called directly returns its error to the caller and leaves
the tablet as it was (a memtable that failed to be written out stays frozen, serving reads, and
the next minor compaction writes it out with the current memtable). A *background* compaction
that fails transiently (Unavailable: the store or the catalog unreachable or overloaded;
Indeterminate from an SSTable PUT, whose key is never reused) is tried again, backing off from
:data:`RETRY_FIRST` to :data:`RETRY_MAX` seconds, as HBase retries a failed flush: nothing is
lost meanwhile (the frozen memtables are whole in memory and serve reads, and the commit log
holds everything past the redo point), and the tablet goes on taking writes until the memtables
it holds reach ``TabletOptions.memtable_limit_bytes``; past that, writes are refused with
Unavailable naming the failure (:meth:`TabletCore.check_writable`) until a retry succeeds,
which makes the tablet fully writable again. A failure that retrying cannot mend (a record
update whose outcome is unknown, so memory no longer says what the record holds; a Fenced
record; any other error) marks the tablet *failed* (:meth:`TabletCore.fail`): writes and
compactions are refused and its worker reloads it from its record and commit log
(``TabletServer``), without a flush and without an operator. Reads go on in both cases. A
background *merge* that fails is only logged: the memtable is in SSTables already, and the next
flush plans the merge again (an ambiguous record update fails the tablet there too).

Giving way. A tablet about to split or move (§5.2, §5.4) pauses its merging and major
compactions (:meth:`CompactionRunner.pause_merges`): one waiting for room in the worker's
budget gives up, one not started yet does not start, and one running finishes. Its successors
rewrite its SSTables anyway (a split's children major-compact; a moved tablet's new owner merges
as it needs), so the pause loses no work that matters, and the pause of writes that follows
waits for no other tablet's compaction. A split that fails resumes them.

Locks. A tablet's compaction lock is held by a minor compaction from its freeze to its commit,
and by a merging or major one only at its *cut* (choosing its inputs, taking the time, the GC
rules and the memtables' deletion entries it counts with) and at its *commit*; the fetch, the
rewrite and the upload in between (seconds to minutes, in the compaction processes) hold the
tablet's rewrite lock instead, so one rewrite runs at a time and minor compactions go on beside
it. Their SSTables are newer than every input and stay in front of the output
(:func:`~tabletstore.engine.state.apply_major`, ``apply_merge``). Held through the rewrite, the
compaction lock made the memtable wait: a round of splits major-compacts every child at once,
and their memtables, and the commit log behind them, grew until the rewrites ended, then were
all written out together. The commit checks that the tablet is still open and that its
SSTables and schema are still those of the cut; if not, the output is left unreferenced
(garbage for GC). Background merges run in a task of their own, apart from the background
minor compaction, for the same reason.

The redo point. Sequence numbers are allocated before the commit-log append and cells reach the
memtable only after it, so when a memtable freezes, writes with *smaller* sequence numbers may
still be in flight and land in the next memtable. The redo point recorded after a minor
compaction is therefore ``min(in-flight seq) - 1`` when anything is in flight at freeze time,
else the frozen memtable's largest seq; replay skips records at or below it, and re-applying a
record already in an SSTable is harmless (identical ``(key, ts, seq)`` entries collapse).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from tabletstore.data.schema import TableSchema, counts_versions
from tabletstore.engine import compaction, parcel
from tabletstore.engine.compaction_budget import CompactionBudget
from tabletstore.engine.parcel import Parcel, Parcels, Stowed
from tabletstore.engine.state import (
    AdoptedMajor,
    MajorResult,
    MergeResult,
    MinorResult,
    TabletState,
    Written,
    adoptable,
    apply_adopted,
    apply_major,
    apply_merge,
    apply_minor,
    freeze,
    redo_point,
)
from tabletstore.engine.tablet_core import TabletCore
from tabletstore.engine.tablet_sstables import TabletSSTables
from tabletstore.errors import (
    Fenced,
    Indeterminate,
    NotServing,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tabletstore.process_pool import ProcessPool
from tabletstore.sstable import SSTableExcerpt, SSTableInfo

__all__ = ["CompactionRunner"]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Seconds before a failed background compaction is tried again, doubling up to
#: :data:`RETRY_MAX`: a store's 503 storm or a timeout passes in seconds, and a retry costs
#: the re-encoding of the frozen memtables and their PUTs.
RETRY_FIRST = 0.25
RETRY_MAX = 5.0


class CompactionRunner:
    """Runs one tablet's compactions and its background ones: one minor and one rewrite
    (merging or major) at a time, side by side."""

    def __init__(
        self,
        core: TabletCore,
        sstables: TabletSSTables,
        *,
        notify_compacted: Callable[[], None],
        executor: concurrent.futures.Executor | None,
        tasks: asyncio.TaskGroup | None,
        budget: CompactionBudget | None = None,
    ) -> None:
        self._core = core
        self._sstables = sstables
        self._notify_compacted = notify_compacted
        self._executor = executor
        #: Inputs and outputs go to the compaction processes as parcels, not pickled.
        self._parcels = (
            isinstance(executor, ProcessPool | concurrent.futures.ProcessPoolExecutor)
            and parcel.supported()
        )
        #: The worker's compaction memory budget (None: unbounded).
        self._budget = budget
        #: Owns the background compactions (the worker's TaskGroup, or the tablet's own).
        self.tasks = tasks
        #: The background minor compaction running (one at a time), if any.
        self.background: asyncio.Task[None] | None = None
        #: The background merging compactions running (one task at a time), if any: apart
        #: from the minor one, so a memtable is written out while a merge rewrites.
        self.merging: asyncio.Task[None] | None = None
        #: Set when a minor compaction asked for merges while they ran: they plan again.
        self._merge_again = False
        #: Held by a merging or major compaction from its cut to its commit: one rewrite of
        #: the tablet at a time (its compaction lock is held only at the cut and the commit).
        self._rewriting = asyncio.Lock()
        #: Set by :meth:`background_done`: the background compaction retries no more.
        self._stop_retrying = False
        #: Wakes the background compaction from its wait before a retry.
        self._wake = asyncio.Event()
        #: Set while merging and major compactions are paused (:meth:`pause_merges`).
        self._merges_paused = asyncio.Event()
        #: Why they are paused ("splitting", "being unloaded", "closing"), or None.
        self.paused_for: str | None = None

    # ------------------------------------------------------------------ background

    def spawn_flush(self) -> None:
        """Start a background minor compaction (then the merges it calls for), unless one
        runs already: the memtable has outgrown ``memtable_flush_bytes``."""
        self._spawn(self._background_minor_compaction())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        running = self.background is not None and not self.background.done()
        if self._core.closed or running or self.tasks is None:
            # One background compaction at a time; the next write re-triggers if needed.
            coro.close()
            return
        try:
            self.background = self.tasks.create_task(coro)
            self._stop_retrying = False
        except RuntimeError:
            # The worker's TaskGroup is shutting down (the worker is stopping, or failed):
            # the compaction is optional, closing the tablet flushes it anyway.
            coro.close()

    def flushing(self) -> asyncio.Task[None] | None:
        """The background compaction running now, or None."""
        running = self.background
        return None if running is None or running.done() else running

    def resume(self) -> None:
        """Start the background compaction again if a failure it was retrying is still
        unmended (it stops retrying while a split or an unload waits for it)."""
        if self._core.flush_failure is not None:
            self._spawn(self._background_minor_compaction())

    async def _background_minor_compaction(self) -> None:
        """Minor-compact, then merge. A transient failure of the minor compaction is retried,
        backing off, until an attempt succeeds, the tablet closes or fails, or
        :meth:`background_done` asks it to stop (module docstring); a failed merge is only
        logged (the memtable is in SSTables already: the next flush plans it again)."""
        core = self._core
        delay = RETRY_FIRST
        while True:
            try:
                await self.minor_compact()
            except TabletStoreError as exc:
                tablet_id = core.record.tablet_id
                if core.closed or isinstance(exc, NotServing):
                    return  # closed meanwhile: whoever closed it decided about the memtable
                if core.failed is not None or not _transient(exc):
                    log.error("background compaction of %s failed: %s", tablet_id, exc)
                    core.fail(exc)
                    return
                if core.flush_failure is None:
                    log.warning(
                        "background compaction of %s failed (%s); retrying, every acknowledged "
                        "write is in memory and in the commit log",
                        tablet_id,
                        exc,
                    )
                core.flush_failure = exc
                if self._stop_retrying or core.writes_blocked is not None:
                    return  # a split or an unload writes the memtable out itself, or not
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()  # set by background_done()
                if self._stop_retrying or core.closed:
                    return
                delay = min(delay * 2, RETRY_MAX)
                continue
            if core.flush_failure is not None:
                log.warning("background compaction of %s succeeded again", core.record.tablet_id)
                core.flush_failure = None
            self.spawn_merges()
            return

    def spawn_merges(self) -> None:
        """Start the background merging compactions the planner asks for, in a task of their
        own: the next minor compaction need not wait for them. If they run already, they plan
        once more when done."""
        if self.merging is not None and not self.merging.done():
            self._merge_again = True
            return
        if self._core.closed or self.tasks is None or self.paused_for is not None:
            return
        try:
            self.merging = self.tasks.create_task(self._background_merges())
        except RuntimeError:
            pass  # the TaskGroup is shutting down: merges are optional

    async def _background_merges(self) -> None:
        """Merge as the planner asks; a failed merge is only logged (the memtable is in
        SSTables already: the next minor compaction plans it again)."""
        core = self._core
        self._merge_again = True
        while self._merge_again and self.paused_for is None and not core.closed:
            self._merge_again = False
            try:
                await self.merge_if_needed()
            except TabletStoreError as exc:
                if not core.closed and not isinstance(exc, NotServing):
                    log.warning("merging compaction of %s failed: %s", core.record.tablet_id, exc)
                return

    async def background_done(self) -> None:
        """Wait for the background compactions, if any run; a minor one waiting to retry a failure
        stops instead (``flush_failure`` stays set: :meth:`resume` starts it again). Its errors
        are its own: it records them (``flush_failure``, ``failed``), and anything else is for
        its TaskGroup to raise."""
        self._stop_retrying = True
        self._wake.set()
        while any(t is not None and not t.done() for t in (self.background, self.merging)):
            await asyncio.gather(
                *(t for t in (self.background, self.merging) if t is not None),
                return_exceptions=True,
            )

    def pause_merges(self, reason: str) -> None:
        """Start no merging or major compaction until :meth:`resume_merges`; those waiting for
        room in the budget give up (module docstring). One running finishes."""
        self.paused_for = reason
        self._merges_paused.set()

    def resume_merges(self) -> None:
        self.paused_for = None
        self._merges_paused.clear()

    # ------------------------------------------------------------------ minor

    async def minor_compact(self) -> None:
        """Freeze the memtable, write it as one SSTable per locality group, move the redo
        point (§5.4). A no-op when the memtable is empty."""
        core = self._core
        core.check_open()
        async with core.compaction_lock:
            core.check_open()  # a split may have closed the tablet while this waited
            frozen = await self._freeze()
            if frozen is None:
                return
            # On a thread, like the encoding after it: the frozen memtables never change, and
            # a 16 MB one is ~14,500 cells, 30-70 ms of the event loop's time otherwise.
            groups = await asyncio.to_thread(self._sstables.split_by_group, frozen.flushed)
            written = await self._sstables.write_groups(groups)
            result = replace(frozen, written=written)
            await core.commit(lambda state: apply_minor(state, result, now=core.clock.time()))
        self._notify_compacted()

    # REQUIRES: core.compaction_lock held.
    async def _freeze(self) -> MinorResult | None:
        """Freeze the memtable; return what the minor compaction is to write (nothing written
        yet), or None when there is nothing to write."""
        core = self._core
        async with core.state_lock:
            state = freeze(core.state)
            core.state = state
            # Frozen memtables left by a failed earlier attempt are written out too: the
            # redo point moves past all of them, so none may stay behind in memory only.
            if not state.frozen:
                return None
            # Writes after the freeze go to the log of now, or to one the worker moves to
            # later (hold_writes/add_log record it): those may hold writes past the redo
            # point, every log listed before the freeze holds none (apply_minor).
            return MinorResult(
                flushed=state.frozen,
                written={},
                redo_seq=redo_point(state.frozen, core.in_flight),
                log_at_freeze=core.log.log_ref,
                log_start=core.log_start_now(core.log.log_ref),
                listed_at_freeze=state.record.logs,
            )

    # ------------------------------------------------------------------ merging and major

    async def _compute(self, work: Callable[[], T]) -> T:
        """Run a CPU-heavy rewrite in the compaction processes when there are some (§5.4),
        else here."""
        if self._executor is None:
            # On a thread, not inline: a merge of 100s of MB would hold the event loop (and
            # the lease keep-alive with it) for tens of seconds on a loaded machine; the work
            # is a pure function of bytes, so a thread is safe.
            return await asyncio.to_thread(work)
        if self._parcels and isinstance(work, functools.partial):
            result: T = await self._compute_parcelled(work)
            return result
        return await self._in_pool(work)

    async def _in_pool(self, call: Callable[[], T]) -> T:
        """``call`` in the compaction processes; a :class:`ProcessPool` runs it again in a
        new pool if its process dies (the rewrite is a pure function of its inputs)."""
        assert self._executor is not None
        if isinstance(self._executor, ProcessPool):
            return await self._executor.run(call)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def _compute_parcelled(self, work: functools.partial[Any]) -> Any:
        """``work`` (a rewrite whose first argument is its input SSTables' bytes) in the
        compaction processes, its inputs and outputs carried as parcels
        (:mod:`tabletstore.engine.parcel`): pickled, they would hold the GIL, and with it the
        event loop, for about 90 ms per 128 MiB each way."""
        assert self._executor is not None
        blobs, *rest = work.args
        async with Parcels() as parcels:
            inputs = [await _pack(parcels, blob) for blob in blobs]
            out = parcels.result()
            call = functools.partial(
                _rewrite_parcelled, work.func, inputs, out, *rest, **work.keywords
            )
            stowed = await self._in_pool(call)
            if isinstance(stowed, dict):
                return {
                    group: (await parcels.unpack(out, where), info)
                    for group, (where, info) in stowed.items()
                }
            where, info = stowed
            return await parcels.unpack(out, where), info

    async def merge_if_needed(self) -> None:
        """Run the merging compactions the planner asks for (none while paused)."""
        for task in compaction.plan(self._core.record, self._core.options):
            if self.paused_for is not None:
                return
            await self._run_merge(task)

    async def major_compact(self) -> None:
        """Flush the memtable, then rewrite the whole tablet into one SSTable per locality
        group with no deletion entries and GC applied (§5.4) — by the current schema, so a
        dropped family's cells are gone for good and a family moved to another locality group
        moves with its cells (:func:`compaction.rewrite_tablet`). The compaction lock is held
        at the cut and at the commit, not while the rewrite runs: minor compactions go on
        meanwhile, and their SSTables stay in front of the output (:func:`apply_major`)."""
        await self.minor_compact()
        core = self._core
        size = sum(r.size for refs in core.state.record.sstables.values() for r in refs)
        async with self._hold(size) as room, self._rewriting:
            async with core.compaction_lock:
                core.check_open()  # a split may have closed the tablet while this waited
                if not room or self.paused_for is not None:
                    raise Unavailable(
                        f"tablet {core.record.tablet_id} is about to split or move: "
                        "no major compaction now"
                    )
                record = core.state.record
                read = {
                    group: tuple(r.key for r in refs) for group, refs in record.sstables.items()
                }
                keys = [key for group_keys in read.values() for key in group_keys]
                if not keys:
                    return
                schema = core.schema
                rewrite = self._rewrite_tablet(record, keys)
            rewrite = _of(rewrite, await self._sstables.fetch(keys))
            outputs: dict[str, Written] = {}
            try:
                for group, (data, info) in sorted((await self._compute(rewrite)).items()):
                    outputs[group] = await self._sstables.store(group, data, info)
                del rewrite  # its inputs: no longer needed
                result = MajorResult(read, outputs)
                async with core.compaction_lock:
                    self._check_commit(schema, read)
                    old = await core.commit(
                        lambda state: apply_major(state, result, now=core.clock.time())
                    )
            except BaseException:
                for _, table in outputs.values():
                    table.close()
                raise
            _close_replaced(old, read)
        self._notify_compacted()

    def _rewrite_tablet(
        self, record: TabletRecord, keys: list[str]
    ) -> functools.partial[dict[str, tuple[bytes, SSTableInfo]]]:
        """The major compaction's rewrite, by the current schema and GC rules, cut now: its
        inputs (the SSTables ``keys``) are given by :func:`_of`."""
        return compaction.schema_rewrite(
            (),
            self._core.schema,
            now_micros=self._core.now_micros(),
            start_row=record.start_row,
            end_row=record.end_row,
            seq_bases=_seq_bases(record, keys),
            # Written since the flush that began this major compaction (compaction.py).
            masks=self._core.unflushed_deletions(),
        )

    # REQUIRES: core.compaction_lock held.
    def _check_commit(self, schema: TableSchema, read: Mapping[str, Sequence[str]]) -> None:
        """Before a rewrite commits: NotServing if the tablet closed meanwhile (a split or a
        move: its output is garbage), PreconditionFailed if its SSTables or its schema
        changed since the cut in a way the output cannot follow."""
        core = self._core
        core.check_open()
        self._check_schema(schema, "its output is not committed")
        adoptable(core.state.record, {g: tuple(keys) for g, keys in read.items()})

    def _check_schema(self, schema: TableSchema, refused: str) -> None:
        """PreconditionFailed (saying ``refused``) unless ``schema``, the one a rewrite
        applied, has the tablet's families (their GC rules) and locality groups now."""
        core = self._core
        if (schema.families, schema.locality_groups) != (
            core.schema.families,
            core.schema.locality_groups,
        ):
            raise PreconditionFailed(
                f"tablet {core.record.tablet_id}: the schema changed since the compaction "
                f"read it; {refused}"
            )

    async def _run_merge(self, task: compaction.CompactionTask) -> None:
        core = self._core
        core.check_open()
        inputs = set(task.inputs)
        size = sum(
            r.size for r in core.state.record.sstables.get(task.group, ()) if r.key in inputs
        )
        # Room first, then the tablet's lock: waiting for room does not hold the tablet's other
        # compactions, splits and unloads back. The compaction lock is held at the cut and at
        # the commit only: minor compactions go on while the merge runs.
        async with self._hold(size) as room, self._rewriting:
            async with core.compaction_lock:
                core.check_open()  # a split may have closed the tablet while this waited
                if not room or self.paused_for is not None:
                    return  # a split or a move is coming: its successors merge (docstring)
                record = core.state.record
                group = tuple(r.key for r in record.sstables.get(task.group, ()))
                if not inputs <= set(group):
                    return  # the tablet changed since planning; the next plan will see it
                # A minor compaction since planning put a newer SSTable in front: not major.
                task = replace(task, major=task.major and inputs == set(group))
                # The window of the group as it is now: the inputs and any older ones.
                read = {task.group: group[group.index(task.inputs[0]) :]}
                schema = core.schema
                merge = self._merge_sstables(task, record)
            merge = _of(merge, await self._sstables.fetch(task.inputs))
            data, info = await self._compute(merge)
            del merge  # its inputs: no longer needed
            output = await self._sstables.store(task.group, data, info) if info.cells else None
            result = MergeResult(task.group, task.inputs, output, task.major)
            try:
                async with core.compaction_lock:
                    self._check_commit(schema, read)
                    old = await core.commit(
                        lambda state: apply_merge(state, result, now=core.clock.time())
                    )
            except BaseException:
                if output is not None:
                    output[1].close()
                raise
            # The inputs' blocks leave the block cache now, not when the cache's LRU gets to
            # them: dead blocks would take the place of live ones for as long as they stay.
            _close_replaced(old, {task.group: task.inputs})
        self._notify_compacted()

    def _hold(self, nbytes: int) -> contextlib.AbstractAsyncContextManager[bool]:
        """Room in the worker's compaction budget for ``nbytes`` of input (none to wait for
        without a budget): True once held, False if merges were paused meanwhile."""
        if self._budget is None:
            return contextlib.nullcontext(not self._merges_paused.is_set())
        return self._budget.hold(nbytes, unless=self._merges_paused)

    def _merge_sstables(
        self, task: compaction.CompactionTask, record: TabletRecord
    ) -> functools.partial[tuple[bytes, SSTableInfo]]:
        """The merging compaction's rewrite, cut now: its inputs (``task.inputs``, newest
        first) are given by :func:`_of`."""
        core = self._core
        lg = core.locality_group(task.group)
        group_families = {
            name for name, f in core.schema.families.items() if f.locality_group == task.group
        }
        return functools.partial(
            compaction.merge_sstables,
            (),
            gc_rules=core.gc_rules(),
            now_micros=core.now_micros(),
            major=task.major,
            # Taken with the rules and the time: the compaction's moment (compaction.py).
            masks=core.unflushed_deletions(group_families) if task.major else (),
            families=set(core.schema.families),
            compression=lg.compression,
            block_size=lg.block_size,
            locality_group=task.group,
            # After a split the inputs may be shared with the sibling: write our rows only.
            start_row=record.start_row,
            end_row=record.end_row,
            seq_bases=_seq_bases(record, task.inputs),
        )

    # ------------------------------------------------------------------ adopted major

    async def adopt_major(
        self,
        *,
        epoch: int,
        schema: TableSchema,
        read: Mapping[str, tuple[str, ...]],
        outputs: Mapping[str, SSTableRef],
    ) -> None:
        """Adopt a major compaction of this tablet run elsewhere (§5.4; a serverless function,
        ``master/remote_compaction.py``): it read the record at ``epoch`` and its SSTables
        ``read`` (per group, newest first) under ``schema``, and wrote ``outputs``. Committed
        like every compaction of this tablet -- under its compaction lock, by the
        epoch-conditional record update -- so nothing the worker wrote meanwhile is lost: the
        SSTables minor compactions added since stay in front of the output, and the memtable
        is untouched. Refused, the output left unreferenced (garbage for GC), when the tablet
        is no longer this one at ``epoch`` (moved, split: Fenced or NotServing), when its
        SSTables changed otherwise since the read, or when its schema (families, GC rules,
        locality groups) is not the one the rewrite applied (PreconditionFailed). Adopting
        the same outputs again (a retry after an ambiguous answer) is a no-op."""
        core = self._core
        core.check_open()
        async with core.compaction_lock:
            core.check_open()  # a split may have closed the tablet while this waited
            record = core.state.record
            if record.epoch != epoch:
                raise Fenced(
                    f"tablet {record.tablet_id} is at epoch {record.epoch} here, not {epoch}: "
                    "the compaction read another owner's record"
                )
            listed = {r.key for refs in record.sstables.values() for r in refs}
            if outputs and all(ref.key in listed for ref in outputs.values()):
                return  # adopted already: a retry after an ambiguous answer
            self._check_schema(schema, "its output is not adopted")
            compaction.check_outputs(record, outputs)
            newer = adoptable(record, read)  # fail before opening anything
            self._check_no_unseen_deletions(newer)
            opened: dict[str, Written] = {}
            for group, ref in sorted(outputs.items()):
                opened[group] = (ref, await self._sstables.open(group, ref))
            result = AdoptedMajor(read, opened)
            old = await core.commit(
                lambda current: apply_adopted(current, result, now=core.clock.time())
            )
            _close_replaced(old, read)
        self._notify_compacted()

    def _check_no_unseen_deletions(self, newer: Mapping[str, int]) -> None:
        """PreconditionFailed when a deletion the remote rewrite did not see -- in the
        memtables, or in an SSTable written since its read (``newer`` per group) -- may
        delete versions it counted, so that it dropped an older version GC no longer collects
        (``engine.compaction``'s module docstring); a tablet whose families count no versions
        adopts whatever it read. The tablet's own next major compaction counts with them."""
        core = self._core
        if not any(counts_versions(f.gc_rule) for f in core.schema.families.values()):
            return
        front = (
            table for group, n in newer.items() for table in core.state.sstables.get(group, ())[:n]
        )
        if core.unflushed_deletions() or any(sum(t.footer.kind_counts[1:]) for t in front):
            raise PreconditionFailed(
                f"tablet {core.record.tablet_id}: deletions written since the compaction read "
                "its SSTables may uncover versions its GC counted; its output is not adopted"
            )


def _transient(exc: TabletStoreError) -> bool:
    """Whether retrying the compaction as it is may succeed: a dependency unreachable or
    overloaded, or a PUT whose answer was lost (an SSTable key is never reused, so a PUT that
    landed after all only leaves garbage). An ambiguous record update is not: the tablet is
    marked failed as it happens (:meth:`TabletCore.commit`)."""
    return isinstance(exc, Unavailable | Indeterminate) and not isinstance(exc, NotServing)


def _seq_bases(record: TabletRecord, keys: Sequence[str]) -> list[int]:
    """The ``SSTableRef.seq_base`` of each of ``keys`` (SSTables of ``record``)."""
    bases = {ref.key: ref.seq_base for refs in record.sstables.values() for ref in refs}
    return [bases[k] for k in keys]


def _of(cut: functools.partial[T], blobs: list[bytes | SSTableExcerpt]) -> functools.partial[T]:
    """The rewrite ``cut`` (made with ``()`` for its inputs, under the compaction lock: its
    time, GC rules and masks are the cut's) of the inputs' bytes ``blobs``, fetched since."""
    return functools.partial(cut.func, blobs, *cut.args[1:], **cut.keywords)


def _close_replaced(old: TabletState, replaced: Mapping[str, Sequence[str]]) -> None:
    """Close the SSTables ``replaced`` (keys per group) that ``old``, the state before a
    compaction's commit, had open: their blocks leave the block cache now."""
    for group, keys in replaced.items():
        gone = set(keys)
        refs = old.record.sstables.get(group, ())
        for ref, table in zip(refs, old.sstables.get(group, ()), strict=True):
            if ref.key in gone:
                table.close()


@dataclass(frozen=True)
class _ParcelledExcerpt:
    """An :class:`SSTableExcerpt` on its way to a compaction process: its two runs of bytes
    in parcels."""

    blocks: Parcel
    offset: int
    tail: Parcel
    size: int

    def read(self) -> SSTableExcerpt:
        return SSTableExcerpt(self.blocks.read(), self.offset, self.tail.read(), self.size)


async def _pack(parcels: Parcels, blob: bytes | SSTableExcerpt) -> Parcel | _ParcelledExcerpt:
    """A compaction input in parcels (:meth:`CompactionRunner._compute_parcelled`)."""
    if isinstance(blob, SSTableExcerpt):
        return _ParcelledExcerpt(
            await parcels.pack(blob.blocks), blob.offset, await parcels.pack(blob.tail), blob.size
        )
    return await parcels.pack(blob)


def _rewrite_parcelled(
    rewrite: Callable[..., tuple[bytes, SSTableInfo] | dict[str, tuple[bytes, SSTableInfo]]],
    inputs: Sequence[Parcel | _ParcelledExcerpt],
    out: Parcel,
    *args: Any,
    **kwargs: Any,
) -> tuple[Stowed, SSTableInfo] | dict[str, tuple[Stowed, SSTableInfo]]:
    """In a compaction process: ``rewrite`` of the SSTables in ``inputs``, its output stowed
    in ``out`` (:meth:`CompactionRunner._compute`)."""
    result = rewrite([p.read() for p in inputs], *args, **kwargs)
    with out.writer() as writer:
        if isinstance(result, dict):
            return {group: (writer.stow(data), info) for group, (data, info) in result.items()}
        data, info = result
        return writer.stow(data), info
