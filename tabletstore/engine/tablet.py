"""Tablet: one contiguous row range served by one worker (§5.3, §5.4, §6).

A tablet's data is the merge of, newest first: the memtable taking writes, frozen memtables
being written out, and per locality group a stack of SSTables (newest first). Its durable state
is its :class:`~tabletstore.metadata.record.TabletRecord` (SSTables, redo point, logs to replay),
committed through a :class:`TabletCatalog` with compare-on-epoch.

:class:`Tablet` is the facade the worker serves; each concept is a collaborator of its own,
all sharing the tablet's :class:`~tabletstore.engine.tablet_core.TabletCore` (state, schema,
locks, writes in flight):

- :mod:`~tabletstore.engine.log_replay`: loading, §5.3 recovery;
- :mod:`~tabletstore.engine.write_path`: row mutations and single-row transactions, under the
  row locks of :mod:`~tabletstore.engine.row_locks`;
- :mod:`~tabletstore.engine.read_path`: point reads and scans;
- :mod:`~tabletstore.engine.compaction_runner`: minor, merging, major and adopted compactions;
- :mod:`~tabletstore.engine.log_positions`: the commit logs the record lists for recovery;
- :mod:`~tabletstore.engine.snapshot_cut`: a snapshot's cut;
- :mod:`~tabletstore.engine.bulk_ingest`: bulk-loaded SSTables;
- :mod:`~tabletstore.engine.tablet_sstables`: creating, opening and fetching its SSTables.

This module keeps what spans them: loading, splits (§5.2) and closing.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import AsyncIterator, Callable

from tabletstore.clock import Clock, SystemClock
from tabletstore.data.query import RowRange
from tabletstore.data.schema import TableSchema
from tabletstore.engine.bulk_ingest import BulkIngest
from tabletstore.engine.compaction_budget import CompactionBudget
from tabletstore.engine.compaction_runner import CompactionRunner
from tabletstore.engine.log_positions import LogPositions
from tabletstore.engine.log_replay import recover_state
from tabletstore.engine.read_path import ReadPath
from tabletstore.engine.snapshot_cut import SnapshotCut, SnapshotCutter
from tabletstore.engine.split_key import BlockSpan, choose_split_key, middle_row, widest_block
from tabletstore.engine.state import TabletState
from tabletstore.engine.tablet_core import LogSink, TabletCatalog, TabletCore
from tabletstore.engine.tablet_sstables import TabletSSTables
from tabletstore.engine.write_path import WritePath
from tabletstore.errors import Unavailable
from tabletstore.keys import Cell
from tabletstore.metadata.record import TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.sstable.writer import load_lazy_imports
from tabletstore.storage_s3.base import ObjectStore

__all__ = [
    "LogSink",
    "SnapshotCut",
    "Tablet",
    "TabletCatalog",
    "TabletState",
]


class Tablet:
    """One served tablet. Create with :meth:`load`."""

    def __init__(
        self,
        state: TabletState,
        schema: TableSchema,
        *,
        store: ObjectStore,
        log_sink: LogSink,
        catalog: TabletCatalog,
        clock: Clock,
        options: TabletOptions,
        block_cache: BlockCache | None,
        executor: concurrent.futures.Executor | None = None,
        scan_cache: ScanCache | None = None,
        tasks: asyncio.TaskGroup | None = None,
        compaction_budget: CompactionBudget | None = None,
    ) -> None:
        """``tasks`` owns the tablet's background compactions (its worker's TaskGroup); None:
        :meth:`load` opens one for the tablet alone, which :meth:`close` closes."""
        core = TabletCore(
            state,
            schema,
            store=store,
            log_sink=log_sink,
            catalog=catalog,
            clock=clock,
            options=options,
        )
        self._core = core
        self._sstables = TabletSSTables(core, block_cache, scan_cache)
        self._compactions = CompactionRunner(
            core,
            self._sstables,
            notify_compacted=self._notify_compacted,
            executor=executor,
            tasks=tasks,
            budget=compaction_budget,
        )
        self._reads = ReadPath(core)
        self._writes = WritePath(
            core,
            self._reads,
            spawn_flush=self._compactions.spawn_flush,
            flushing=self._compactions.flushing,
        )
        self._logs = LogPositions(core, self._compactions.minor_compact)
        self._snapshots = SnapshotCutter(core, self._sstables)
        self._ingest = BulkIngest(core, self._sstables, self._notify_compacted)
        #: Called after each compaction that changed the record (the worker checks for a split).
        self.on_compacted: Callable[[Tablet], None] | None = None
        #: Called once when the tablet fails (:attr:`must_reload`): the worker reloads it.
        self.on_failed: Callable[[Tablet], None] | None = None
        core.on_failed = self._notify_failed
        self._stack = contextlib.AsyncExitStack()

        # The operations, bound once to the collaborator that does them: the single-row write
        # and the point read are the hot path of every benchmark, and a forwarding method
        # would add a coroutine to each call.
        writes, reads, compactions = self._writes, self._reads, self._compactions
        #: :meth:`WritePath.apply`: one row mutation, atomically (§2).
        self.apply = writes.apply
        #: :meth:`WritePath.apply_many`: many row mutations, one commit-log append.
        self.apply_many = writes.apply_many
        #: :meth:`WritePath.check_and_mutate`: a single-row transaction (§3).
        self.check_and_mutate = writes.check_and_mutate
        #: :meth:`WritePath.read_modify_write`: append or increment (§3).
        self.read_modify_write = writes.read_modify_write
        #: :meth:`ReadPath.read_row`: one row after deletions, GC and the filter.
        self.read_row = reads.read_row
        #: :meth:`ReadPath.scan`: the rows of a range, streamed.
        self.scan = reads.scan
        #: :meth:`ReadPath.scan_with_progress`: a scan that reports long filtered-out runs.
        self.scan_with_progress = reads.scan_with_progress
        #: :meth:`ReadPath.may_read_some`: may read at least one family (the table's shape).
        self.may_read_some = reads.may_read_some
        #: :meth:`CompactionRunner.minor_compact` (§5.4).
        self.minor_compact = compactions.minor_compact
        #: :meth:`CompactionRunner.merge_if_needed` (§5.4).
        self.merge_if_needed = compactions.merge_if_needed
        #: :meth:`CompactionRunner.spawn_merges`: the same, in the background.
        self.spawn_merges = compactions.spawn_merges
        #: :meth:`CompactionRunner.major_compact` (§5.4).
        self.major_compact = compactions.major_compact
        #: :meth:`CompactionRunner.adopt_major`: a major compaction run elsewhere.
        self.adopt_major = compactions.adopt_major
        #: :meth:`LogPositions.trim_logs`: the log position moved to the log's end.
        self.trim_logs = self._logs.trim_logs
        #: :meth:`LogPositions.hold_writes`: writes refused until :attr:`add_log`.
        self.hold_writes = self._logs.hold_writes
        #: :meth:`LogPositions.add_log`: the worker's new log recorded, writes taken again.
        self.add_log = self._logs.add_log
        #: :meth:`SnapshotCutter.hold_for_snapshot`: this tablet's side of a snapshot's cut.
        self.hold_for_snapshot = self._snapshots.hold_for_snapshot
        #: :meth:`SnapshotCutter.release_snapshot_hold`.
        self.release_snapshot_hold = self._snapshots.release_snapshot_hold
        #: :meth:`SnapshotCutter.write_snapshot`: the SSTables of the tablet as of a cut.
        self.write_snapshot = self._snapshots.write_snapshot
        #: :meth:`BulkIngest.bulk_load` (§8).
        self.bulk_load = self._ingest.bulk_load

    # ------------------------------------------------------------------ loading

    @classmethod
    async def load(
        cls,
        record: TabletRecord,
        schema: TableSchema,
        *,
        store: ObjectStore,
        log_sink: LogSink,
        catalog: TabletCatalog,
        replay: Callable[[TabletRecord], AsyncIterator[Cell]] | None = None,
        clock: Clock | None = None,
        options: TabletOptions | None = None,
        block_cache: BlockCache | None = None,
        executor: concurrent.futures.Executor | None = None,
        scan_cache: ScanCache | None = None,
        tasks: asyncio.TaskGroup | None = None,
        claimed: TabletRecord | None = None,
        compaction_budget: CompactionBudget | None = None,
    ) -> Tablet:
        """Open a tablet's SSTables, replay its commit-log records past the redo point into a
        fresh memtable (§5.3 recovery), and record this worker's log in its record
        (:func:`~tabletstore.engine.log_replay.recover_state`, which ``claimed`` is for).
        ``compaction_budget``: the worker's, shared by its tablets' merging and major
        compactions (None: unbounded)."""
        clk = clock or SystemClock()
        await load_lazy_imports()  # before its first minor compaction could (writer.py)
        state = await recover_state(
            record,
            schema,
            store=store,
            log_sink=log_sink,
            catalog=catalog,
            replay=replay,
            clock=clk,
            block_cache=block_cache,
            scan_cache=scan_cache,
            claimed=claimed,
        )
        tablet = cls(
            state,
            schema,
            store=store,
            log_sink=log_sink,
            catalog=catalog,
            clock=clk,
            options=options or TabletOptions(),
            block_cache=block_cache,
            executor=executor,
            scan_cache=scan_cache,
            tasks=tasks,
            compaction_budget=compaction_budget,
        )
        if tasks is None:
            own = await tablet._stack.enter_async_context(asyncio.TaskGroup())
            tablet._compactions.tasks = own
        return tablet

    # ------------------------------------------------------------------ properties

    @property
    def record(self) -> TabletRecord:
        return self._core.state.record

    @property
    def schema(self) -> TableSchema:
        return self._core.schema

    @property
    def state(self) -> TabletState:
        return self._core.state

    @property
    def must_reload(self) -> BaseException | None:
        """Why this tablet takes no more writes until it is reloaded (a background compaction
        failure that retrying cannot mend, a write whose record may or may not be logged:
        ``TabletCore.failed``), or None."""
        return self._core.failed

    @property
    def flush_failure(self) -> BaseException | None:
        """Why its background compaction is failing while it retries, or None."""
        return self._core.flush_failure

    @property
    def log_pending(self) -> bool:
        """Writes are held until :attr:`add_log` records the worker's new log."""
        return self._core.log_pending

    def set_schema(self, schema: TableSchema) -> None:
        """Apply a schema change (new families, GC rules, ACLs) to future requests."""
        self._core.schema = schema

    def contains(self, row: bytes) -> bool:
        return self._core.contains(row)

    # ------------------------------------------------------------------ splits and shutdown

    def _notify_failed(self) -> None:
        if self.on_failed is not None:
            self.on_failed(self)

    def _notify_compacted(self) -> None:
        if self.on_compacted is not None and not self._core.closed:
            self.on_compacted(self)

    def block_spans(self) -> list[BlockSpan]:
        """Every block of every SSTable of the tablet (the split planner's input, §5)."""
        return [
            BlockSpan(b.first_row, b.last_row, b.length)
            for tables in self._core.state.sstables.values()
            for t in tables
            for b in t.footer.blocks
        ]

    async def split_key(self) -> bytes | None:
        """Where to split this tablet (:mod:`tabletstore.engine.split_key`): between blocks by their
        bytes, else at the middle row of its widest block (one block read)."""
        rec = self.record
        spans = self.block_spans()
        key = choose_split_key(rec.start_row, rec.end_row, spans)
        if key is not None:
            return key
        block = widest_block(rec.start_row, rec.end_row, spans)
        if block is None:
            return None
        lo = max(block.first_row, rec.start_row)
        rng = RowRange(lo, block.last_row, end_inclusive=True)
        rows = [row.key async for row in self.scan(rng)]
        return middle_row(rows, rec.start_row)

    async def flush_ahead(self, reason: str) -> None:
        """Get ready to stop writes (a split, §5.2; a move, §5.4) while still serving them:
        pause merging and major compactions (those waiting for room give up), wait for the
        compaction under way, and minor-compact. The pause of writes that follows then has
        only what arrived meanwhile to write out -- the first of §5.4's two minor compactions
        before a tablet moves. Merges stay paused until the tablet closes (a split that fails,
        or this call failing, resumes them)."""
        core = self._core
        core.check_open()
        if core.writes_blocked is not None or self._compactions.paused_for is not None:
            reason_now = core.writes_blocked or self._compactions.paused_for
            raise Unavailable(f"tablet {self.record.tablet_id} is already {reason_now}")
        self._compactions.pause_merges(reason)
        try:
            await self._compactions.background_done()
            await self.minor_compact()
        except BaseException:
            self._compactions.resume_merges()
            self._compactions.resume()  # a failure it was retrying, if still unmended
            raise

    @property
    def writes_refused_since(self) -> float | None:
        """The clock's monotonic time since which new writes are refused (a split or an unload
        under way), or None while they are accepted."""
        core = self._core
        return None if core.writes_blocked is None else core.writes_blocked_at

    async def _quiesce(self, reason: str) -> None:
        """Refuse new writes (NotServing), then wait for background compactions and for every
        write already past the check to be logged and in the memtable."""
        self._core.writes_blocked = reason
        self._core.writes_blocked_at = self._core.clock.monotonic()
        # Idle first: a write finishing may still spawn a background compaction, and does so
        # before this waiter resumes; after that no new one can start.
        await self._core.idle.wait()
        await self._compactions.background_done()

    @contextlib.asynccontextmanager
    async def splitting(self) -> AsyncIterator[TabletRecord]:
        """Prepare a split (§5.2): write the memtable out while still serving
        (:meth:`flush_ahead`), then stop accepting writes, wait for those in flight, write out
        what arrived meanwhile, clear the record's logs, and yield the record -- which then
        holds every acknowledged write in its SSTables -- with the compaction lock held, so
        nothing changes it while the caller commits the split. If the body returns, the tablet
        is closed (its children serve its rows now); if it raises, writes and merges resume
        and the tablet serves on."""
        core = self._core
        await self.flush_ahead("splitting")  # merges resumed if it raises
        try:
            await self._quiesce("splitting")
            await self.minor_compact()
            # Every acknowledged write is in SSTables now: the children need no log, and
            # whoever loads them (or the parent, should the commit fail ambiguously) must not
            # fence this worker's log, which its other tablets still use.
            await self._logs.forget_logs()
            async with core.compaction_lock:
                yield core.state.record
                core.closed = True
        finally:
            if not core.closed:
                core.writes_blocked = None
                self._compactions.resume_merges()
                self._compactions.resume()  # a failure it was retrying, if still unmended

    async def close(self, *, flush: bool) -> None:
        """Stop serving. With ``flush`` (a moved tablet, §5.2), stop writes, wait for those in
        flight and minor-compact, then clear the record's ``logs``: every acknowledged write is
        in SSTables, so the new owner replays (and fences) nothing -- this worker's log stays
        its own. Without it (or once the tablet failed, :attr:`must_reload`) the logs stay
        listed and the next owner recovers from them as after a crash."""
        core = self._core
        # Queued merges give up, so the close waits for none: the next owner merges as needed.
        self._compactions.pause_merges("closing")
        if flush and not core.closed:
            await self._quiesce("being unloaded")
            if core.failed is None:
                await self.minor_compact()
                await self._logs.forget_logs()
        await self._compactions.background_done()
        core.closed = True
        await self._stack.aclose()
