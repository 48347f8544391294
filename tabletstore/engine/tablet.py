"""Tablet: one contiguous row range served by one worker (§5.3, §5.4, §6).

A tablet's data is the merge of, newest first: the memtable taking writes, frozen memtables
being written out, and per locality group a stack of SSTables (newest first). Its durable state
is its :class:`~tabletstore.metadata.record.TabletRecord` (SSTables, redo point, logs to replay),
committed through a :class:`TabletCatalog` with compare-on-epoch (DESIGN.md §6 rule 2).

Write path (§5.3): validate, take the row lock, allocate sequence numbers, append to the
worker's commit log (group commit; acknowledged only once durable), insert into the memtable.

Read path: merge every source for the row range, apply deletion entries and per-family GC
(:mod:`tabletstore.engine.iterators`), evaluate the filter server-side (:mod:`tabletstore.data.filters`).
Reads share the event loop with the worker's lease keep-alive, so no read may hold it for long:
a scan gives other tasks a turn at least every :data:`READ_SLICE_SECONDS` of computing (data
already in memory or in the block cache never suspends it otherwise), and a row whose
worst-case regex work (:func:`~tabletstore.data.filters.regex_cost` times its bytes) exceeds
:data:`INLINE_REGEX_WORK`, or whose filter steps (the filter's work per cell times its cells)
exceed :data:`INLINE_FILTER_STEPS`, is filtered on a thread (RE2 releases the GIL while it
matches; Python code on a thread gives the loop the GIL at least every switch interval). A
filter's patterns are compiled before anything is read, on such a thread when one is not in
the pattern cache: RE2 compiles holding the GIL, and the filter's cost limits
(:mod:`tabletstore.data.filters`) bound each compile and their sum.

Compactions (§5.4): *minor* freezes the memtable and writes one SSTable per locality group,
then moves the redo point; *merging* rewrites the newest few SSTables of a group into one;
*major* rewrites everything of a group into one SSTable with no deletion entries left. What to
compact is decided by the pure planner :mod:`tabletstore.engine.compaction`.

Failed compactions. A compaction called directly returns its error to the caller and leaves
the tablet as it was (a memtable that failed to be written out stays frozen, serving reads, and
the next minor compaction writes it out with the current memtable). A failed *background*
compaction is sticky: writes and compactions raise Unavailable until the tablet is reloaded
(its commit log still holds everything past the redo point); reads go on.

State is an immutable :class:`TabletState` replaced whole under ``_state_lock``; readers take
one reference and never lock (STYLE.md convention 5).

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
import os
import uuid
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Callable,
    Coroutine,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import numpy as np
import pyarrow as pa

from tabletstore.clock import Clock, SystemClock, micros, stopwatch
from tabletstore.data.filters import RowFilter, apply_filter, compile_filter, uncompiled
from tabletstore.data.model import Cell as ApiCell
from tabletstore.data.model import Mutation, ReadModifyWriteRule, Row, SetCell
from tabletstore.data.query import RowRange
from tabletstore.data.schema import GcRule, LocalityGroup, TableSchema, is_garbage
from tabletstore.data.validation import (
    check_mutation_size,
    validate_rmw_rules,
    validate_row_mutation,
)
from tabletstore.engine import compaction
from tabletstore.engine.cells import apply_rmw_rule, to_cells
from tabletstore.engine.iterators import (
    AsyncCellSource,
    amerge_batches,
    avisible_batches,
    merge_sources,
    visible_cells,
)
from tabletstore.engine.memtable import FrozenMemTable, MemTable
from tabletstore.engine.reverse import (
    MEMTABLE_WINDOW_ROWS,
    next_window_start,
    sorted_block_starts,
)
from tabletstore.engine.scan_stats import ScanStats
from tabletstore.engine.split_key import BlockSpan, choose_split_key, middle_row, widest_block
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
from tabletstore.errors import (
    Fenced,
    InvalidArgument,
    NotServing,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.keys import AGGREGATE_KINDS, Cell, CellFields, CellKind, cell_sort_key
from tabletstore.metadata.record import (
    BulkLoadMark,
    LogRef,
    SSTableRef,
    TabletRecord,
    uncovered,
)
from tabletstore.options import TabletOptions
from tabletstore.sstable import SSTable, SSTableInfo, write_sstable
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.sstable.writer import write_sstable_table
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore

__all__ = [
    "INLINE_FILTER_STEPS",
    "INLINE_REGEX_WORK",
    "READ_SLICE_SECONDS",
    "LogSink",
    "SnapshotCut",
    "Tablet",
    "TabletCatalog",
    "TabletState",
]

log = logging.getLogger(__name__)

T = TypeVar("T")

#: A row deletion's kind, as memtable entries hold it (a plain int).
_DELETE_ROW = int(CellKind.DELETE_ROW)

#: The longest a scan computes on the event loop before it lets other tasks run. The lease
#: keep-alive shares the loop and tolerates a stall of about ``ttl - ttl/3`` (3.3 s with the
#: default 5 s lease); 10 ms keeps the cost of yielding (about 30 us a time) under 1%.
READ_SLICE_SECONDS = 0.01
#: The most regex work (RE2 program size x bytes of the row) one row's filter may do on the
#: event loop. RE2's worst case (its NFA, when a pattern's DFA outgrows its memory) was
#: measured at 5 to 15 ns per byte per instruction, so this bounds an inline filter to a few
#: milliseconds; heavier rows go to :func:`_filter_executor`.
INLINE_REGEX_WORK = 1 << 18
#: The most filter steps (the filter's work per cell, ``shape.work``, times the row's cells)
#: one row's filter may take on the event loop: a few milliseconds of Python.
INLINE_FILTER_STEPS = 1 << 14

_filter_threads: concurrent.futures.ThreadPoolExecutor | None = None


def _filter_executor() -> concurrent.futures.ThreadPoolExecutor:
    """Threads for heavy row filters, apart from the default executor (which does local-store
    I/O): a flood of hostile patterns queues behind itself, not behind reads of data."""
    global _filter_threads
    if _filter_threads is None:
        _filter_threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(4, os.cpu_count() or 1), thread_name_prefix="tabletstore-filter"
        )
    return _filter_threads


def _row_bytes(row: bytes, cells: Sequence[ApiCell]) -> int:
    """Every byte a regex filter might match in one row: key, family names, qualifiers, values."""
    n = len(row)
    for c in cells:  # a loop, not sum() over a generator: half the cost for a one-cell row
        n += len(c.family) + len(c.qualifier) + len(c.value)
    return n


async def _filter_row(
    filter: RowFilter, cost: int, row: bytes, cells: list[ApiCell]
) -> list[ApiCell]:
    """``apply_filter(filter, row, cells)``, on a thread when its regex work or its filter
    steps could stall the event loop. ``cost`` is ``regex_cost(filter)``."""
    if (cost and cost * _row_bytes(row, cells) > INLINE_REGEX_WORK) or (
        filter.shape.work * len(cells) > INLINE_FILTER_STEPS
    ):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_filter_executor(), apply_filter, filter, row, cells)
    return apply_filter(filter, row, cells)


async def _regex_cost(filter: RowFilter | None) -> int:
    """``filter``'s :func:`~tabletstore.data.filters.regex_cost`, compiling its patterns first:
    on a filter thread when one of them is not in the pattern cache, so that the event loop
    runs between one pattern's compile and the next. InvalidArgument for an invalid pattern or
    one over the filter's program limit, before anything is read."""
    if uncompiled(filter):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(_filter_executor(), compile_filter, filter)
    return compile_filter(filter)


class _LoopTurns:
    """Gives other tasks a turn (the lease keep-alive above all) whenever a slice of
    computing has gone by: data in memory or in the block cache never suspends a scan.
    ``if stopwatch() >= turns.end: await turns.give()``: no call on the per-row path but the
    clock's."""

    __slots__ = ("end",)

    def __init__(self) -> None:
        self.end = stopwatch() + READ_SLICE_SECONDS

    async def give(self) -> None:
        await asyncio.sleep(0)
        self.end = stopwatch() + READ_SLICE_SECONDS


async def _filtered(row: Row, filter: RowFilter, cost: int) -> Row | None:
    """``row`` after ``filter`` (``cost``: its :func:`regex_cost`); None when nothing is left."""
    cells = await _filter_row(filter, cost, row.key, row.cells)
    return Row(row.key, cells) if cells else None


class LogSink(Protocol):
    """What a tablet needs from its worker's commit log (§5.3)."""

    #: The log this worker appends to, recorded in the tablet's record while it serves it.
    log_ref: LogRef

    def allocate(self, n: int) -> int:
        """Reserve ``n`` consecutive sequence numbers; return the first."""
        ...

    def segment_mark(self) -> int:
        """The number of the next segment of :attr:`log_ref` to be cut: every record appended
        from now on lands in it or a later one (the tablet's position in the log, §5.3)."""
        ...

    def advance(self, seq: int) -> None:
        """Make every future allocation larger than ``seq`` (after loading a tablet)."""
        ...

    async def append(self, table_id: str, row: bytes, cells: Sequence[Cell]) -> None:
        """Durably log one row mutation; returns only once it is durable."""
        ...

    async def append_many(
        self, table_id: str, rows: Sequence[tuple[bytes, Sequence[Cell]]]
    ) -> list[TabletStoreError | None]:
        """Durably log many row mutations in one go (they share segments); returns once each
        is durable or has failed: per row, None (durable) or why it was not acknowledged. An
        exception means none of them was logged."""
        ...


class TabletCatalog(Protocol):
    """Where tablet records are committed: the catalog (the root tablet's record in the
    coordinator, every other one a row of METADATA)."""

    async def update(self, old: TabletRecord, new: TabletRecord) -> TabletRecord:
        """Replace ``old`` by ``new`` if the stored record still has ``old``'s epoch; raise
        :class:`~tabletstore.errors.Fenced` if it does not. Returns what was stored."""
        ...


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
    ) -> None:
        """``tasks`` owns the tablet's background compactions (its worker's TaskGroup); None:
        :meth:`load` opens one for the tablet alone, which :meth:`close` closes."""
        self._executor = executor
        self._scan_cache = scan_cache
        self._state = state
        self._schema = schema
        #: The last (schema, identity) :meth:`_readable` found may read every family.
        self._reads_all: tuple[TableSchema, str | None] | None = None
        self._value_types_cache: tuple[TableSchema, dict[str, str | None]] | None = None
        self._store = store
        self._log = log_sink
        self._catalog = catalog
        self._clock = clock
        self._options = options
        self._block_cache = block_cache
        self._state_lock = asyncio.Lock()
        # Only one compaction of a tablet runs at a time; it also serializes record commits.
        self._compaction_lock = asyncio.Lock()
        self._row_locks: dict[bytes, asyncio.Lock] = {}
        self._row_lock_users: dict[bytes, int] = {}
        self._in_flight: dict[int, int] = {}  # first seq -> count of mutations in flight
        # first seq -> (the log, its segment mark) when that write took its seqs: the write
        # lands in that segment or a later one (log positions, _log_start_now).
        self._in_flight_marks: dict[int, tuple[LogRef, int]] = {}
        # Set while nothing is in flight (``_in_flight`` empty): what a split or close awaits.
        self._idle = asyncio.Event()
        self._idle.set()
        # Why writes are refused (a split or an unload under way), or None while they are not.
        self._writes_blocked: str | None = None
        # Set while the worker's log moves to a new incarnation that this tablet's record does
        # not list yet: a write logged there now could not be recovered (see hold_writes).
        self._log_pending = False
        # Set while a snapshot's cut holds writes (hold_for_snapshot): writes wait on it.
        self._snapshot_gate: asyncio.Event | None = None
        #: Called after each compaction that changed the record (the worker checks for a split).
        self.on_compacted: Callable[[Tablet], None] | None = None
        self._stack = contextlib.AsyncExitStack()
        self._tasks = tasks
        #: The background compaction running (one at a time), if any.
        self._background: asyncio.Task[None] | None = None
        self._failed: BaseException | None = None
        self._closed = False

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
    ) -> Tablet:
        """Open a tablet's SSTables, replay its commit-log records past the redo point into a
        fresh memtable (§5.3 recovery), and record this worker's log in its record."""
        tables: dict[str, tuple[SSTable, ...]] = {}
        for group, refs in record.sstables.items():
            opened = await asyncio.gather(
                *(
                    SSTable.open(
                        store,
                        ref.key,
                        size=ref.size,
                        tail_size=ref.tail_size or None,
                        block_cache=block_cache,
                        scan_cache=scan_cache,
                        seq_base=ref.seq_base,
                    )
                    for ref in refs
                )
            )
            lg = schema.locality_groups.get(group)
            if lg is not None and lg.in_memory:
                await asyncio.gather(*(t.load_all() for t in opened))
            tables[group] = tuple(opened)
        memtable = MemTable()
        max_seq = max(
            [record.redo_seq, *(r.max_seq for refs in record.sstables.values() for r in refs)]
        )
        if replay is not None:
            batch: list[Cell] = []
            flushed = _FlushedRows(tables, record)
            async for cell in replay(record):
                if cell.seq > record.redo_seq:
                    if cell.kind in AGGREGATE_KINDS and await flushed.holds(cell):
                        continue
                    batch.append(cell)
                    max_seq = max(max_seq, cell.seq)
                    if len(batch) >= 4096:
                        memtable.add(batch)
                        batch = []
            memtable.add(batch)
        log_sink.advance(max_seq)
        logs = tuple(dict.fromkeys((*record.logs, log_sink.log_ref)))
        starts = dict(record.log_starts)
        if log_sink.log_ref not in record.logs:
            # Not serving yet: every write of this tablet to the log comes after this mark.
            starts[log_sink.log_ref] = log_sink.segment_mark()
        clk = clock or SystemClock()
        new_record = replace(record, logs=logs, log_starts=starts).with_event(
            clk.time(), "loaded", f"replayed {len(memtable)} cells"
        )
        if new_record != record:
            new_record = await catalog.update(record, new_record)
        state = TabletState(new_record, memtable, (), tables)
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
        )
        if tasks is None:
            tablet._tasks = await tablet._stack.enter_async_context(asyncio.TaskGroup())
        return tablet

    # ------------------------------------------------------------------ properties

    @property
    def record(self) -> TabletRecord:
        return self._state.record

    @property
    def schema(self) -> TableSchema:
        return self._schema

    @property
    def state(self) -> TabletState:
        return self._state

    def set_schema(self, schema: TableSchema) -> None:
        """Apply a schema change (new families, GC rules, ACLs) to future requests."""
        self._schema = schema

    def contains(self, row: bytes) -> bool:
        return self._state.record.contains(row)

    def _check_serving(self) -> None:
        """Reads need only this: a failed background compaction loses nothing in memory."""
        if self._closed:
            raise NotServing(f"tablet {self.record.tablet_id} is not served here any more")

    def _check_open(self) -> None:
        """Writes and compactions also need no sticky background failure."""
        self._check_serving()
        if self._failed is not None:
            raise Unavailable(
                f"tablet {self.record.tablet_id} failed a background compaction and must be "
                f"reloaded: {self._failed}"
            )

    def _check_writable(self) -> None:
        """Writes also need no split or unload under way; refused ones were not applied, and
        NotServing sends the client to look the tablet up again (its children, its new owner)."""
        self._check_open()
        if self._writes_blocked is not None:
            raise NotServing(
                f"tablet {self.record.tablet_id} is {self._writes_blocked}; look it up again"
            )
        if self._log_pending:
            raise Unavailable(
                f"tablet {self.record.tablet_id}: its worker is moving to a new commit log; "
                "the write was not applied, retry"
            )

    def _check_row(self, row: bytes) -> None:
        if not self.contains(row):
            raise NotServing(
                f"row {row[:64]!r} is outside tablet {self.record.tablet_id} "
                f"[{self.record.start_row[:64]!r}, {self.record.end_row!r})"
            )

    def _gc_rules(self) -> dict[str, GcRule | None]:
        return {name: fam.gc_rule for name, fam in self._schema.families.items()}

    def _value_types(self) -> dict[str, str | None]:
        # Every write asks: built once per schema (set_schema swaps the schema whole).
        schema = self._schema
        cached = self._value_types_cache
        if cached is None or cached[0] is not schema:
            types: dict[str, str | None] = {
                n: f.value_type for n, f in schema.families.items() if f.value_type
            }
            cached = (schema, types)
            self._value_types_cache = cached
        return cached[1]

    def _now_micros(self) -> int:
        return micros(self._clock.time())

    # ------------------------------------------------------------------ writes

    @contextlib.asynccontextmanager
    async def _row_lock(self, row: bytes) -> AsyncIterator[None]:
        rows = [row]
        await self._lock_rows(rows)
        try:
            yield
        finally:
            self._unlock_rows(rows)

    async def apply(
        self, row: bytes, mutations: Sequence[Mutation], *, identity: str | None = None
    ) -> None:
        """Apply one row mutation atomically (§2). Acknowledged only once logged durably."""
        self._check_writable()
        self._check_row(row)
        validate_row_mutation(self._schema, row, mutations, identity)
        rows = [row]  # _lock_rows, not _row_lock: no context-manager generator per write
        await self._lock_rows(rows)
        try:
            await self._apply_locked(row, mutations)
        finally:
            self._unlock_rows(rows)

    # REQUIRES: the row lock of ``row`` held.
    async def _apply_locked(self, row: bytes, mutations: Sequence[Mutation]) -> None:
        # A snapshot's cut is being taken (hold_for_snapshot): wait, briefly, before taking a
        # sequence number, so this write falls on the far side of the cut.
        while self._snapshot_gate is not None:
            await self._snapshot_gate.wait()
        # Checked again with the row lock held: a split or unload may have started while this
        # write waited for it. No await from here to the in-flight entry, so a quiescing
        # tablet sees every write it lets through.
        self._check_writable()
        first = self._log.allocate(len(mutations))
        self._in_flight_marks[first] = (self._log.log_ref, self._log.segment_mark())
        try:
            cells = to_cells(row, mutations, first, self._now_micros(), self._value_types())
        except BaseException:
            del self._in_flight_marks[first]
            raise
        self._in_flight[first] = len(cells)
        self._idle.clear()
        try:
            await self._log.append(self.record.table_id, row, cells)
            self._state.memtable.add(cells)
        finally:
            del self._in_flight[first]
            del self._in_flight_marks[first]
            if not self._in_flight:
                self._idle.set()
        if self._state.memtable.approximate_size >= self._options.memtable_flush_bytes:
            self._spawn(self._background_minor_compaction())

    async def apply_many(
        self, entries: Sequence[tuple[bytes, Sequence[Mutation]]], *, identity: str | None = None
    ) -> list[TabletStoreError | None]:
        """Apply many row mutations, each atomically on its own (§2, §3 batches), as one
        commit-log append: the rows' records share segments, and each row is acknowledged (None
        in its place of the result) only once its record is durable; an entry that failed has
        its error there instead. Entries of the same row apply in their order (rising sequence
        numbers). An exception means no entry was applied (nothing was logged)."""
        out: list[TabletStoreError | None] = [None] * len(entries)
        self._check_writable()
        valid: list[int] = []
        for i, (row, mutations) in enumerate(entries):
            try:
                self._check_row(row)
                validate_row_mutation(self._schema, row, mutations, identity)
            except TabletStoreError as exc:
                out[i] = exc
                continue
            valid.append(i)
        if not valid:
            return out
        # Sorted: two batches take their common rows' locks in the same order, so neither
        # waits on the other in a cycle (single-row writers hold one lock only).
        rows = sorted({entries[i][0] for i in valid})
        await self._lock_rows(rows)
        try:
            await self._apply_many_locked(entries, valid, out)
        finally:
            self._unlock_rows(rows)
        return out

    async def _lock_rows(self, rows: list[bytes]) -> None:
        """Take the row locks of ``rows`` (sorted, distinct), as :meth:`_row_lock` does for
        one; all or none of them are held when this returns or raises."""
        taken = 0
        try:
            for row in rows:
                lock = self._row_locks.get(row)
                if lock is None:
                    lock = self._row_locks[row] = asyncio.Lock()
                self._row_lock_users[row] = self._row_lock_users.get(row, 0) + 1
                try:
                    await lock.acquire()
                except BaseException:
                    self._drop_row_lock_user(row)
                    raise
                taken += 1
        except BaseException:
            self._unlock_rows(rows[:taken])
            raise

    def _unlock_rows(self, rows: list[bytes]) -> None:
        for row in rows:
            self._row_locks[row].release()
            self._drop_row_lock_user(row)

    def _drop_row_lock_user(self, row: bytes) -> None:
        users = self._row_lock_users[row] - 1
        if users:
            self._row_lock_users[row] = users
        else:
            del self._row_lock_users[row]
            del self._row_locks[row]

    # REQUIRES: the row locks of every valid entry's row held.
    async def _apply_many_locked(
        self,
        entries: Sequence[tuple[bytes, Sequence[Mutation]]],
        valid: list[int],
        out: list[TabletStoreError | None],
    ) -> None:
        while self._snapshot_gate is not None:  # as in _apply_locked
            await self._snapshot_gate.wait()
        # No await from this check to the in-flight entries (as in _apply_locked).
        self._check_writable()
        now = self._now_micros()
        value_types = self._value_types()
        logged: list[tuple[int, int, list[Cell]]] = []  # (entry, first seq, cells)
        for i in valid:
            row, mutations = entries[i]
            first = self._log.allocate(len(mutations))
            try:
                cells = to_cells(row, mutations, first, now, value_types)
            except TabletStoreError as exc:
                out[i] = exc
                continue
            logged.append((i, first, cells))
        if not logged:
            return
        # The log position a minor compaction records must stay at or below the segment
        # these records land in (_log_start_now): no await since allocate, so the mark now
        # is the mark at allocation.
        mark = (self._log.log_ref, self._log.segment_mark())
        for _, first, cells in logged:
            self._in_flight[first] = len(cells)
            self._in_flight_marks[first] = mark
        self._idle.clear()
        try:
            results = await self._log.append_many(
                self.record.table_id, [(entries[i][0], cells) for i, _, cells in logged]
            )
            memtable = self._state.memtable
            for (i, _, cells), error in zip(logged, results, strict=True):
                if error is None:
                    memtable.add(cells)
                else:
                    out[i] = error
        finally:
            for _, first, _ in logged:
                del self._in_flight[first]
                del self._in_flight_marks[first]
            if not self._in_flight:
                self._idle.set()
        if self._state.memtable.approximate_size >= self._options.memtable_flush_bytes:
            self._spawn(self._background_minor_compaction())

    async def check_and_mutate(
        self,
        row: bytes,
        predicate: RowFilter | None,
        true_mutations: Sequence[Mutation],
        false_mutations: Sequence[Mutation],
        *,
        identity: str | None = None,
    ) -> bool:
        """Single-row transaction (§3): apply ``true_mutations`` if the predicate filter yields
        any cell of the row (or, with no predicate, if the row has any cell), else
        ``false_mutations``. Returns whether the predicate matched."""
        self._check_writable()
        self._check_row(row)
        for muts in (true_mutations, false_mutations):
            if muts:
                validate_row_mutation(self._schema, row, muts, identity)
        cost = await _regex_cost(predicate)
        async with self._row_lock(row):
            current = await self._read_row_cells(row, self._readable(identity))
            cells = current
            if predicate is not None:
                cells = await _filter_row(predicate, cost, row, current)
            matched = bool(cells)
            chosen = true_mutations if matched else false_mutations
            if chosen:
                await self._apply_locked(row, chosen)
        return matched

    async def read_modify_write(
        self, row: bytes, rules: Sequence[ReadModifyWriteRule], *, identity: str | None = None
    ) -> Row:
        """Single-row read-modify-write (§3): append or increment; returns the new cells."""
        self._check_writable()
        self._check_row(row)
        validate_rmw_rules(self._schema, row, rules, identity)
        async with self._row_lock(row):
            current = await self._read_row_cells(row, None)
            latest: dict[tuple[str, bytes], bytes] = {}
            for c in current:
                latest.setdefault((c.family, c.qualifier), c.value)
            written: dict[tuple[str, bytes], bytes] = {}
            for rule in rules:
                col = (rule.family, rule.qualifier)
                base = written.get(col, latest.get(col))
                written[col] = apply_rmw_rule(rule, base)
            # Whole milliseconds: a Cloud Bigtable client stamps its writes with the front
            # door's clock truncated to the millisecond, and a write acknowledged after this
            # one must not get an older timestamp and be hidden behind it (seq breaks ties).
            now = self._now_micros() // 1000 * 1000
            newest: dict[tuple[str, bytes], int] = {}
            for c in current:
                newest.setdefault((c.family, c.qualifier), c.timestamp)
            # The result must be the column's newest version even when an existing version
            # carries a client timestamp in the future: write at max(now, newest).
            muts: list[Mutation] = [
                SetCell(f, q, v, max(now, newest.get((f, q), now))) for (f, q), v in written.items()
            ]
            # Appends can grow a row mutation past what one request could carry: refuse it
            # like a write of the same cells (the result row crosses the wire in one reply).
            check_mutation_size(row, muts)
            await self._apply_locked(row, muts)
            out = [
                ApiCell(m.family, m.qualifier, m.timestamp or now, m.value)
                for m in muts
                if isinstance(m, SetCell)
            ]
        out.sort(key=lambda c: (c.family, c.qualifier))
        return Row(row, out)

    # ------------------------------------------------------------------ reads

    def may_read_some(self, identity: str | None) -> bool:
        """Whether ``identity`` may read at least one family of this table (or it has none):
        what reading the table's shape (its sample keys, its tablets' boundaries) needs."""
        return self._readable(identity) != set()

    def _readable(self, identity: str | None) -> set[str] | None:
        """Families the identity may read, or None when it may read them all."""
        schema = self._schema
        if self._reads_all is not None and self._reads_all[0] is schema:
            if self._reads_all[1] == identity:  # every point read asks: remembered
                return None
        fams = schema.families
        if all(f.acl.may_read(identity) for f in fams.values()):
            self._reads_all = (schema, identity)
            return None
        return {name for name, f in fams.items() if f.acl.may_read(identity)}

    def _groups_for(self, families: set[str] | None) -> list[str]:
        state = self._state
        if families is None:
            return list(state.sstables)
        wanted = {
            self._schema.families[f].locality_group for f in families if f in self._schema.families
        }
        return [g for g in state.sstables if g in wanted]

    async def _read_row_cells(self, row: bytes, families: set[str] | None) -> list[ApiCell]:
        """Visible cells of one row (deletions and GC applied), as API cells."""
        state = self._state
        raw: list[Cell] = list(state.memtable.get_row(row))
        for mt in state.frozen:
            raw.extend(mt.get_row(row))
        # The point-read fast path: key ranges and bloom filters first, resident (in-memory)
        # SSTables answered without an await, and no task unless two SSTables need I/O.
        fetch = []
        for g in self._groups_for(families):
            for t in state.sstables[g]:
                if t.might_hold(row):
                    cells = t.resident_row(row)
                    if cells is None:
                        fetch.append(t)
                    else:
                        raw.extend(cells)
        if len(fetch) == 1:
            raw.extend(await fetch[0].read_candidate(row))
        elif fetch:
            for cells in await asyncio.gather(*(t.read_candidate(row) for t in fetch)):
                raw.extend(cells)
        if len(raw) == 1 and raw[0].kind == CellKind.PUT:
            return self._lone_put(raw[0], families)
        # A stable sort keeps the newest source first among identical keys.
        raw.sort(key=cell_sort_key)
        visible = visible_cells(raw, gc_rules=self._gc_rules(), now_micros=self._now_micros())
        # Cells of a dropped family stay in SSTables until their next compaction: never shown.
        wanted = set(self._schema.families) if families is None else families
        return [
            ApiCell(c.family, c.qualifier, c.ts, c.value) for c in visible if c.family in wanted
        ]

    def _lone_put(self, cell: Cell, families: set[str] | None) -> list[ApiCell]:
        """What visible_cells and the family check make of a row whose only cell is one put
        (most point reads: issue 18), without sorting or a visibility pass: the put itself
        unless its family's GC rule collects it (version 0 at its age)."""
        family = self._schema.families.get(cell.family)
        if (family is None) if families is None else (cell.family not in families):
            return []
        rule = None if family is None else family.gc_rule
        if rule is not None and is_garbage(rule, 0, cell.ts, self._now_micros()):
            return []
        return [ApiCell(cell.family, cell.qualifier, cell.ts, cell.value)]

    async def read_row(
        self,
        row: bytes,
        *,
        filter: RowFilter | None = None,
        families: set[str] | None = None,
        identity: str | None = None,
        stats: ScanStats | None = None,
    ) -> Row | None:
        """One row after deletions, GC and the filter; None when nothing is left. ``stats``
        counts the row as seen (before the filter) if it has cells."""
        self._check_serving()
        self._check_row(row)
        cost = await _regex_cost(filter)
        fams = _intersect(families, self._readable(identity))
        cells = await self._read_row_cells(row, fams)
        if stats is not None and cells:
            stats.seen(Row(row, cells))
        if filter is not None:
            cells = await _filter_row(filter, cost, row, cells)
        return Row(row, cells) if cells else None

    async def scan(
        self,
        row_range: RowRange,
        *,
        filter: RowFilter | None = None,
        families: set[str] | None = None,
        limit: int | None = None,
        identity: str | None = None,
        reverse: bool = False,
    ) -> AsyncIterator[Row]:
        """Rows of ``row_range`` (clipped to this tablet) in order, streamed; in descending
        order when ``reverse`` (:mod:`tabletstore.engine.reverse`)."""
        self._check_serving()
        rec = self.record
        clipped = row_range.clip(rec.start_row, rec.end_row)
        if clipped is None or (limit is not None and limit <= 0):
            return
        if reverse:
            reversed_rows = self._scan_reversed(clipped, filter, families, limit, identity, None)
            async with contextlib.aclosing(reversed_rows):
                async for row in reversed_rows:
                    yield row
            return
        cost = await _regex_cost(filter)
        rows = self._scan_rows(clipped, _intersect(families, self._readable(identity)))
        emitted = 0
        turns = _LoopTurns()
        async with contextlib.aclosing(rows):
            async for batch in rows:
                for row in batch:
                    # No coroutine per row on the hot path of plain scans.
                    out = row if filter is None else await _filtered(row, filter, cost)
                    if out is not None:
                        yield out
                        emitted += 1
                        if limit is not None and emitted >= limit:
                            return
                    if stopwatch() >= turns.end:
                        await turns.give()
                if stopwatch() >= turns.end:
                    await turns.give()

    async def scan_with_progress(
        self,
        row_range: RowRange,
        stats: ScanStats,
        *,
        filter: RowFilter | None = None,
        families: set[str] | None = None,
        limit: int | None = None,
        identity: str | None = None,
        reverse: bool = False,
    ) -> AsyncIterator[Row | ScanStats]:
        """:meth:`scan`, counting what it reads in ``stats`` and yielding ``stats`` itself
        each time ``stats.dropped()`` says a long run of rows was filtered out (forward scans
        only: a reversed scan only counts)."""
        self._check_serving()
        rec = self.record
        clipped = row_range.clip(rec.start_row, rec.end_row)
        if clipped is None or (limit is not None and limit <= 0):
            return
        if reverse:
            reversed_rows = self._scan_reversed(clipped, filter, families, limit, identity, stats)
            async with contextlib.aclosing(reversed_rows):
                async for row in reversed_rows:
                    yield row
            return
        cost = await _regex_cost(filter)
        rows = self._scan_rows(clipped, _intersect(families, self._readable(identity)))
        emitted = 0
        turns = _LoopTurns()
        async with contextlib.aclosing(rows):
            async for batch in rows:
                for row in batch:
                    stats.seen(row)
                    out = row if filter is None else await _filtered(row, filter, cost)
                    if out is not None:
                        stats.returned()
                        yield out
                        emitted += 1
                        if limit is not None and emitted >= limit:
                            return
                    elif stats.dropped():
                        yield stats
                    if stopwatch() >= turns.end:
                        await turns.give()
                if stopwatch() >= turns.end:
                    await turns.give()

    async def _scan_reversed(
        self,
        rng: RowRange,
        filter: RowFilter | None,
        families: set[str] | None,
        limit: int | None,
        identity: str | None,
        stats: ScanStats | None,
    ) -> AsyncGenerator[Row, None]:
        """``rng``'s rows in descending order: windows from the top down, each scanned forward
        and handed out reversed (:mod:`tabletstore.engine.reverse`)."""
        start, upper = rng.bounds()
        fams = _intersect(families, self._readable(identity))
        emitted = 0
        while True:
            state = self._state
            blocks = sorted_block_starts(
                b.first_row
                for g in self._groups_for(fams)
                for t in state.sstables[g]
                for b in t.footer.blocks
            )
            probes = [
                functools.partial(_memtable_probe, mt)
                for mt in (state.memtable, *state.frozen)
                if not mt.is_empty()
            ]
            lo = next_window_start(upper, start, blocks, probes)
            window = RowRange.half_open(lo, upper)
            scanned = (
                self.scan(window, filter=filter, families=fams)
                if stats is None
                else self.scan_with_progress(window, stats, filter=filter, families=fams)
            )
            rows = [row async for row in scanned if isinstance(row, Row) and rng.contains(row.key)]
            for row in reversed(rows):
                yield row
                emitted += 1
                if limit is not None and emitted >= limit:
                    return
            if lo <= start:
                return
            upper = lo

    def _scan_sources(
        self, start: bytes, end: bytes | None, fams: set[str] | None
    ) -> list[AsyncCellSource]:
        """Every source of the rows ``[start, end)``, newest first: the memtable, the frozen
        ones, then the SSTables of the locality groups holding ``fams`` (None: all)."""
        state = self._state
        sources: list[AsyncCellSource] = [
            list(state.memtable.scan(start, end)),
            *(list(mt.scan(start, end)) for mt in state.frozen),
        ]
        for g in self._groups_for(fams):
            sources.extend(t.scan_blocks(start, end) for t in state.sstables[g])
        return sources

    async def _scan_rows(
        self, rng: RowRange, fams: set[str] | None
    ) -> AsyncGenerator[list[Row], None]:
        """The visible cells of ``rng`` as rows, a list of whole rows per merged batch (the
        last row of a batch is held back until a later batch starts another row). A row with
        no visible cell of ``fams`` is left out."""
        start, end = rng.bounds()
        batches = avisible_batches(
            amerge_batches(self._scan_sources(start, end, fams)),
            gc_rules=self._gc_rules(),
            now_micros=self._now_micros(),
        )
        # Cells of a dropped family stay in SSTables until their next compaction: never shown.
        wanted = set(self._schema.families) if fams is None else fams
        row: bytes | None = None
        cells: list[ApiCell] = []
        async for batch in batches:
            done: list[Row] = []
            for c in batch:
                if c.row != row:
                    if cells and row is not None and rng.contains(row):
                        done.append(Row(row, cells))
                    row, cells = c.row, []
                if c.family in wanted:
                    cells.append(ApiCell(c.family, c.qualifier, c.ts, c.value))
            yield done
        if cells and row is not None and rng.contains(row):
            yield [Row(row, cells)]

    # ------------------------------------------------------------------ compactions

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        running = self._background is not None and not self._background.done()
        if self._closed or running or self._tasks is None:
            # One background compaction at a time; the next write re-triggers if needed.
            coro.close()
            return
        try:
            self._background = self._tasks.create_task(coro)
        except RuntimeError:
            # The worker's TaskGroup is shutting down (the worker is stopping, or failed):
            # the compaction is optional, closing the tablet flushes it anyway.
            coro.close()

    async def _background_minor_compaction(self) -> None:
        try:
            await self.minor_compact()
            await self.merge_if_needed()
        except TabletStoreError as exc:
            # Sticky until the tablet is reloaded (STYLE.md convention 7): serving on with a
            # memtable that can never be written out would grow without bound.
            log.error("background compaction of %s failed: %s", self.record.tablet_id, exc)
            self._failed = exc

    async def minor_compact(self) -> None:
        """Freeze the memtable, write it as one SSTable per locality group, move the redo
        point (§5.4). A no-op when the memtable is empty."""
        self._check_open()
        async with self._compaction_lock:
            self._check_open()  # a split may have closed the tablet while this waited
            frozen = await self._freeze()
            if frozen is None:
                return
            # On a thread, like the encoding after it: the frozen memtables never change, and
            # a 16 MB one is ~14,500 cells, 30-70 ms of the event loop's time otherwise.
            groups = await asyncio.to_thread(self._split_by_group, frozen.flushed)
            written = await self._write_groups(groups, major=False)
            result = replace(frozen, written=written)
            await self._commit(lambda state: apply_minor(state, result, now=self._clock.time()))
        self._notify_compacted()

    # REQUIRES: self._compaction_lock held.
    async def _freeze(self) -> MinorResult | None:
        """Freeze the memtable; return what the minor compaction is to write (nothing written
        yet), or None when there is nothing to write."""
        async with self._state_lock:
            state = freeze(self._state)
            self._state = state
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
                redo_seq=redo_point(state.frozen, self._in_flight),
                log_at_freeze=self._log.log_ref,
                log_start=self._log_start_now(self._log.log_ref),
                listed_at_freeze=state.record.logs,
            )

    async def trim_logs(self) -> None:
        """Move this tablet's log position to the log's end (§5.3, §5.4: a minor compaction
        shrinks what recovery reads): minor-compact it; with nothing in memory, frozen or in
        flight, only rewrite its record to list the worker's log from its current segment
        (every write it has is in its SSTables: no other log holds one it lacks)."""
        self._check_open()
        if len(self._state.memtable) or self._state.frozen or self._in_flight:
            await self.minor_compact()
            return
        async with self._compaction_lock, self._state_lock:
            self._check_open()
            state = self._state
            if self._in_flight or len(state.memtable) or state.frozen or self._log_pending:
                return  # a write came in meanwhile: the next round compacts
            ref = self._log.log_ref
            starts = {ref: self._log_start_now(ref)}
            record = state.record
            if record.logs == (ref,) and record.log_starts == starts:
                return
            new_record = replace(record, logs=(ref,), log_starts=starts).with_event(
                self._clock.time(),
                "log_position",
                f"{ref.worker_id}/{ref.incarnation}@{starts[ref]}",
            )
            stored = await self._catalog.update(record, new_record)
            self._state = replace(state, record=stored)

    def _log_start_now(self, ref: LogRef) -> int:
        """The first segment of ``ref`` that can hold a write of this tablet not yet in its
        memtable: the log's segment mark now, or an earlier one taken by a write in flight
        (0 when a write in flight took its seqs under another log: it may land anywhere)."""
        if ref != self._log.log_ref:
            return 0
        start = self._log.segment_mark()
        for log_ref, mark in self._in_flight_marks.values():
            if log_ref != ref:
                return 0
            start = min(start, mark)
        return start

    # REQUIRES: self._compaction_lock held (nothing else changes the record meanwhile).
    async def _commit(self, step: Callable[[TabletState], TabletState]) -> TabletState:
        """Apply ``step`` (a pure function of :mod:`tabletstore.engine.state`) to the state of
        now, commit its record through the catalog and swap the state in; return the state it
        replaced. Writes go on meanwhile: they add to the memtable, they never swap the state."""
        async with self._state_lock:
            state = self._state
            new = step(state)
            stored = await self._catalog.update(state.record, new.record)
            self._state = replace(new, record=stored)
            return state

    def _split_by_group(self, memtables: Sequence[MemTable]) -> dict[str, list[CellFields]]:
        """Cells of memtables (newest first) per locality group, in sort order; row deletions
        go to every group. One memtable (the usual case) gives its plain-tuple entries: no
        Cell objects made for the cyclic GC to track while the SSTables are encoded."""
        groups: dict[str, list[CellFields]] = {}
        fams = self._schema.families
        all_groups = list(self._schema.locality_groups)
        cells: Iterable[CellFields] = (
            memtables[0].entries()
            if len(memtables) == 1
            else merge_sources([mt.scan() for mt in memtables])
        )
        for c in cells:
            if c[5] == _DELETE_ROW:  # kind
                for g in all_groups:
                    groups.setdefault(g, []).append(c)
                continue
            fam = fams.get(c[1])  # family
            # Cells of a dropped family are garbage: they are not written out.
            if fam is not None:
                groups.setdefault(fam.locality_group, []).append(c)
        return groups

    async def _write_groups(
        self, groups: Mapping[str, Iterable[CellFields]], *, major: bool
    ) -> dict[str, Written]:
        out: dict[str, Written] = {}
        for group, cells in groups.items():
            lg = self._locality_group(group)
            # On a thread (the cells are a frozen memtable's): a 16 MB minor compaction is
            # ~1 s of encoding that would otherwise hold the event loop.
            data, info = await asyncio.to_thread(
                functools.partial(
                    write_sstable,
                    cells,
                    compression=lg.compression,
                    block_size=lg.block_size,
                    locality_group=group,
                )
            )
            if info.cells:
                out[group] = await self._store_sstable(group, data, info)
        return out

    async def _store_sstable(self, group: str, data: bytes, info: SSTableInfo) -> Written:
        """Upload a new SSTable of ``group`` and open it (loaded whole for an in-memory
        locality group, §6)."""
        ref = await self._upload(group, data, info)
        table = await self._open(ref)
        if self._locality_group(group).in_memory:
            await table.load_all()
        return ref, table

    def _locality_group(self, group: str) -> LocalityGroup:
        """The schema's settings of ``group``; a group the schema no longer names (its
        SSTables not yet compacted away) is written with a locality group's defaults."""
        return self._schema.locality_groups.get(group) or LocalityGroup(name=group)

    async def _upload(self, group: str, data: bytes, info: SSTableInfo) -> SSTableRef:
        """Create the SSTable object (create-only: objects are never overwritten)."""
        rec = self.record
        key = layout.sstable_key(rec.table_id, rec.tablet_id, group, uuid.uuid4().hex)
        await self._store.create(key, data)
        return SSTableRef.of(key, len(data), info)

    async def _open(self, ref: SSTableRef) -> SSTable:
        return await SSTable.open(
            self._store,
            ref.key,
            size=ref.size,
            tail_size=ref.tail_size or None,
            block_cache=self._block_cache,
            scan_cache=self._scan_cache,
            seq_base=ref.seq_base,
        )

    async def _fetch(self, keys: Sequence[str]) -> list[bytes]:
        """The bytes of the SSTables ``keys``: a compaction's inputs."""
        blobs = await asyncio.gather(*(self._store.get(key) for key in keys))
        missing = [k for k, b in zip(keys, blobs, strict=True) if b is None]
        if missing:
            raise Unavailable(f"SSTable objects vanished before compaction: {missing}")
        return [b for b in blobs if b is not None]

    async def _compute(self, work: Callable[[], T]) -> T:
        """Run a CPU-heavy rewrite in the compaction processes when there are some (§5.4),
        else here."""
        if self._executor is None:
            # On a thread, not inline: a merge of 100s of MB held the event loop (and the
            # lease keep-alive with it) for tens of seconds on a loaded machine (issue 18's
            # growth run); the work is a pure function of bytes, so a thread is safe.
            return await asyncio.to_thread(work)
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    async def merge_if_needed(self) -> None:
        """Run the merging compactions the planner asks for."""
        for task in compaction.plan(self.record, self._options):
            await self._run_merge(task)

    async def major_compact(self) -> None:
        """Flush the memtable, then rewrite the whole tablet into one SSTable per locality
        group with no deletion entries and GC applied (§5.4) — by the current schema, so a
        dropped family's cells are gone for good and a family moved to another locality group
        moves with its cells (:func:`compaction.rewrite_tablet`)."""
        await self.minor_compact()
        async with self._compaction_lock:
            self._check_open()  # a split may have closed the tablet while this waited
            record = self._state.record
            keys = [ref.key for refs in record.sstables.values() for ref in refs]
            if not keys:
                return
            rewrite = self._rewrite_tablet(record, keys, await self._fetch(keys))
            outputs = {
                group: await self._store_sstable(group, data, info)
                for group, (data, info) in sorted((await self._compute(rewrite)).items())
            }
            result = MajorResult(len(keys), outputs)
            old = await self._commit(
                lambda state: apply_major(state, result, now=self._clock.time())
            )
            for tables in old.sstables.values():
                for t in tables:
                    t.close()
        self._notify_compacted()

    def _rewrite_tablet(
        self, record: TabletRecord, keys: list[str], blobs: list[bytes]
    ) -> Callable[[], dict[str, tuple[bytes, SSTableInfo]]]:
        """The major compaction's rewrite of ``blobs``, by the current schema and GC rules."""
        return compaction.schema_rewrite(
            blobs,
            self._schema,
            now_micros=self._now_micros(),
            start_row=record.start_row,
            end_row=record.end_row,
            seq_bases=_seq_bases(record, keys),
        )

    async def _run_merge(self, task: compaction.CompactionTask) -> None:
        self._check_open()
        async with self._compaction_lock:
            self._check_open()  # a split may have closed the tablet while this waited
            record = self._state.record
            if not set(task.inputs) <= {r.key for r in record.sstables.get(task.group, ())}:
                return  # the tablet changed since planning; the next plan will see it
            merge = self._merge_sstables(task, record, await self._fetch(task.inputs))
            data, info = await self._compute(merge)
            output = await self._store_sstable(task.group, data, info) if info.cells else None
            result = MergeResult(task.group, task.inputs, output, task.major)
            await self._commit(lambda state: apply_merge(state, result, now=self._clock.time()))
        self._notify_compacted()

    def _merge_sstables(
        self, task: compaction.CompactionTask, record: TabletRecord, blobs: list[bytes]
    ) -> Callable[[], tuple[bytes, SSTableInfo]]:
        """The merging compaction's rewrite of ``blobs`` (``task.inputs``, newest first)."""
        lg = self._locality_group(task.group)
        return functools.partial(
            compaction.merge_sstables,
            blobs,
            gc_rules=self._gc_rules(),
            now_micros=self._now_micros(),
            major=task.major,
            families=set(self._schema.families),
            compression=lg.compression,
            block_size=lg.block_size,
            locality_group=task.group,
            # After a split the inputs may be shared with the sibling: write our rows only.
            start_row=record.start_row,
            end_row=record.end_row,
            seq_bases=_seq_bases(record, task.inputs),
        )

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
        self._check_open()
        async with self._compaction_lock:
            self._check_open()  # a split may have closed the tablet while this waited
            record = self._state.record
            if record.epoch != epoch:
                raise Fenced(
                    f"tablet {record.tablet_id} is at epoch {record.epoch} here, not {epoch}: "
                    "the compaction read another owner's record"
                )
            listed = {r.key for refs in record.sstables.values() for r in refs}
            if outputs and all(ref.key in listed for ref in outputs.values()):
                return  # adopted already: a retry after an ambiguous answer
            if (schema.families, schema.locality_groups) != (
                self._schema.families,
                self._schema.locality_groups,
            ):
                raise PreconditionFailed(
                    f"tablet {record.tablet_id}: the schema changed since the compaction read "
                    "it; its output is not adopted"
                )
            compaction.check_outputs(record, outputs)
            adoptable(record, read)  # fail before opening anything
            opened: dict[str, Written] = {}
            for group, ref in sorted(outputs.items()):
                table = await self._open(ref)
                if self._locality_group(group).in_memory:
                    await table.load_all()
                opened[group] = (ref, table)
            result = AdoptedMajor(read, opened)
            old = await self._commit(
                lambda current: apply_adopted(current, result, now=self._clock.time())
            )
            replaced = {key for keys in read.values() for key in keys}
            for group, tables in old.sstables.items():
                for ref, table in zip(old.record.sstables.get(group, ()), tables, strict=True):
                    if ref.key in replaced:
                        table.close()
        self._notify_compacted()

    # ------------------------------------------------------------------ splits and shutdown

    def _notify_compacted(self) -> None:
        if self.on_compacted is not None and not self._closed:
            self.on_compacted(self)

    def block_spans(self) -> list[BlockSpan]:
        """Every block of every SSTable of the tablet (the split planner's input, §5)."""
        return [
            BlockSpan(b.first_row, b.last_row, b.length)
            for tables in self._state.sstables.values()
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

    async def _quiesce(self, reason: str) -> None:
        """Refuse new writes (NotServing), then wait for background compactions and for every
        write already past the check to be logged and in the memtable."""
        self._writes_blocked = reason
        # Idle first: a write finishing may still spawn a background compaction, and does so
        # before this waiter resumes; after that no new one can start.
        await self._idle.wait()
        await self._background_done()

    async def _background_done(self) -> None:
        """Wait for the background compaction, if one runs. Its errors are its own: it
        records them (``_failed``), and anything else is for its TaskGroup to raise."""
        while self._background is not None and not self._background.done():
            await asyncio.gather(self._background, return_exceptions=True)

    @contextlib.asynccontextmanager
    async def splitting(self) -> AsyncIterator[TabletRecord]:
        """Prepare a split (§5.2): stop accepting writes, wait for those in flight, write the
        memtable out, clear the record's logs, and yield the record -- which then holds every
        acknowledged write in its SSTables -- with the compaction lock held, so nothing changes it while the caller
        commits the split. If the body returns, the tablet is closed (its children serve its
        rows now); if it raises, writes resume and the tablet serves on."""
        self._check_open()
        if self._writes_blocked is not None:
            raise Unavailable(f"tablet {self.record.tablet_id} is already {self._writes_blocked}")
        try:
            await self._quiesce("splitting")
            await self.minor_compact()
            # Every acknowledged write is in SSTables now: the children need no log, and
            # whoever loads them (or the parent, should the commit fail ambiguously) must not
            # fence this worker's log, which its other tablets still use.
            await self._forget_logs()
            async with self._compaction_lock:
                yield self._state.record
                self._closed = True
        finally:
            if not self._closed:
                self._writes_blocked = None

    async def close(self, *, flush: bool) -> None:
        """Stop serving. With ``flush`` (a moved tablet, §5.2), stop writes, wait for those in
        flight and minor-compact, then clear the record's ``logs``: every acknowledged write is
        in SSTables, so the new owner replays (and fences) nothing -- this worker's log stays
        its own. Without it (or after a failed background compaction) the logs stay listed and
        the next owner recovers from them as after a crash."""
        if flush and not self._closed:
            await self._quiesce("being unloaded")
            if self._failed is None:
                await self.minor_compact()
                await self._forget_logs()
        await self._background_done()
        self._closed = True
        await self._stack.aclose()

    def hold_writes(self) -> None:
        """Refuse writes (Unavailable) until :meth:`add_log` records the worker's next log:
        its current one failed, and a write logged in the next one before this tablet's record
        lists it would be lost in a crash."""
        self._log_pending = True

    async def add_log(self, ref: LogRef) -> None:
        """Record ``ref`` (the worker's new log incarnation) among the logs to replay, then
        take writes again. Raises (Fenced: the tablet is no longer this worker's) if the
        record cannot be updated; writes stay refused then."""
        async with self._compaction_lock, self._state_lock:
            record = self._state.record
            if ref not in record.logs:
                starts = {**record.log_starts, ref: self._log_start_now(ref)}
                new_record = replace(
                    record, logs=(*record.logs, ref), log_starts=starts
                ).with_event(self._clock.time(), "new_log", f"{ref.worker_id}/{ref.incarnation}")
                stored = await self._catalog.update(record, new_record)
                self._state = replace(self._state, record=stored)
        self._log_pending = False

    async def _forget_logs(self) -> None:
        async with self._compaction_lock, self._state_lock:
            record = self._state.record
            if not record.logs:
                return
            new_record = replace(record, logs=(), log_starts={}).with_event(
                self._clock.time(), "unloaded", "flushed; nothing to replay"
            )
            stored = await self._catalog.update(record, new_record)
            self._state = replace(self._state, record=stored)

    # ------------------------------------------------------------------ snapshots and bulk load

    async def hold_for_snapshot(self, hold_seconds: float) -> SnapshotCut:
        """Take this tablet's side of a snapshot's cut (§8, ``tabletstore.batch``).

        Writes that have not taken a sequence number yet wait (they are not refused); writes
        already past that point finish. Then the tablet's cut is taken in one step with no
        await: its sequence-number high-water mark (every cell of the tablet with a larger
        seq is written after the cut: a tablet's cells are totally ordered by seq, as a
        tablet loaded elsewhere advances the new worker's sequence past them), its memtables
        and its SSTable stack. Writes stay held until :meth:`release_snapshot_hold` or until
        ``hold_seconds`` pass, whichever comes first (a coordinator that died mid-snapshot
        cannot stall the tablet); the caller learns from the release whether the hold lasted.
        """
        self._check_open()
        if self._snapshot_gate is not None:
            raise Unavailable(
                f"tablet {self.record.tablet_id}: another snapshot is being taken; retry"
            )
        gate = asyncio.Event()
        self._snapshot_gate = gate
        timer = asyncio.get_running_loop().call_later(hold_seconds, self._open_gate, gate)
        try:
            async with asyncio.timeout(hold_seconds):
                await self._idle.wait()
            self._check_open()
        except TimeoutError as exc:
            timer.cancel()
            self._open_gate(gate)
            raise Unavailable(
                f"tablet {self.record.tablet_id}: writes in flight did not finish within "
                f"{hold_seconds} s of a snapshot's hold; retry"
            ) from exc
        except BaseException:
            timer.cancel()
            self._open_gate(gate)
            raise
        state = self._state
        memtables = (state.memtable, *state.frozen)
        rec = state.record
        mark = max(
            [
                rec.redo_seq,
                *(m.max_seq or 0 for m in memtables),
                *(r.max_seq for refs in rec.sstables.values() for r in refs),
            ]
        )
        # Aggregate parts written after the cut must not fold into parts before it.
        state.memtable.keep_parts_through(mark)
        return SnapshotCut(rec, mark, memtables, gate, timer)

    def _open_gate(self, gate: asyncio.Event) -> None:
        if self._snapshot_gate is gate:
            self._snapshot_gate = None
        gate.set()

    def release_snapshot_hold(self, cut: SnapshotCut) -> bool:
        """Let held writes go on; True if the hold lasted until now (it had not timed out)."""
        held = self._snapshot_gate is cut.gate
        cut.timer.cancel()
        self._open_gate(cut.gate)
        return held

    async def write_snapshot(self, cut: SnapshotCut) -> dict[str, tuple[SSTableRef, ...]]:
        """The SSTables that hold this tablet as of ``cut``, per locality group, newest first:
        its SSTables at the cut, plus new SSTables holding what its memtables held at the
        cut (cells with seq <= the mark), written for the snapshot alone (the tablet's own
        record does not change; a snapshot manifest pins them, §8).

        Why not minor-compact and read the record back: a merging compaction that runs
        between the cut and that read may have dropped a put masked by a deletion made after
        the cut, which the snapshot must still show. The SSTables named at the cut are
        immutable and stay in the bucket while the manifest names them (GC rule).
        """
        mark = cut.mark
        groups = self._split_by_group(cut.memtables)
        out: dict[str, tuple[SSTableRef, ...]] = {
            g: tuple(r) for g, r in cut.record.sstables.items()
        }
        for group, cells in groups.items():
            ref = await self._snapshot_sstable(group, [c for c in cells if c[4] <= mark])  # seq
            if ref is not None:
                out[group] = (ref, *out.get(group, ()))
        return {g: refs for g, refs in out.items() if refs}

    async def _snapshot_sstable(self, group: str, cells: list[CellFields]) -> SSTableRef | None:
        """Upload ``cells`` as an SSTable of ``group`` for a snapshot only (not opened, not in
        the tablet's record); None when there are none."""
        if not cells:
            return None
        lg = self._locality_group(group)
        data, info = write_sstable(
            cells, compression=lg.compression, block_size=lg.block_size, locality_group=group
        )
        return await self._upload(group, data, info)

    async def bulk_load(
        self,
        groups: Mapping[str, pa.Table],
        marks: tuple[BulkLoadMark, ...] = (),
        adopt: Sequence[tuple[str, SSTableRef]] = (),
    ) -> int:
        """Add bulk-loaded cells (§8; Arrow tables of the SSTable schema, sorted, puts only,
        in this tablet's range, families of its schema) as new SSTables, one per locality
        group, and the SSTables ``adopt`` names ((group, reference), objects of this table
        holding only puts of rows in this tablet's range, every stored seq 0: staged by the
        master, batch/load_files.py step 2) as they are, in one record update: all of them or
        none. Returns the cells added.

        ``marks`` name the load and the rows these cells are; the same record update adds
        them, so the load is applied once: if the record already marks any of those rows
        as loaded by it (a concurrent or repeated call), nothing is added (0), or NotServing
        when only part of them are (the master looks again at what is left).

        The cells' seqs are replaced by fresh ones from the worker's sequence (an adopted
        SSTable's by the ``seq_base`` of its reference: one fresh seq for all its cells,
        which are distinct cells), so loaded cells behave exactly like writes made now:
        newer than every cell already in the tablet (a later delete masks them, an earlier
        one does not)."""
        self._check_writable()
        written_cells = int(sum(t.num_rows for t in groups.values()))
        total = written_cells + sum(ref.cells for _, ref in adopt)
        if not total and not marks:
            return 0
        async with self._compaction_lock:
            self._check_writable()
            if marks and self._marked(marks):
                return 0
            seqs_needed = written_cells + len(adopt)
            first = self._log.allocate(seqs_needed) if seqs_needed else 0
            added: list[tuple[str, SSTableRef, SSTable]] = []
            for group, staged in adopt:
                base, first = first, first + 1
                ref = replace(
                    staged,
                    seq_base=base,
                    min_seq=staged.min_seq + base,
                    max_seq=staged.max_seq + base,
                )
                table = await self._open(ref)
                if self._locality_group(group).in_memory:
                    await table.load_all()
                added.append((group, ref, table))
            for group, cells in sorted(groups.items()):
                n = cells.num_rows
                if not n:
                    continue
                # Distinct (row, family, qualifier, ts) per cell (checked by the loader), so
                # any seq order keeps the cells sorted.
                seqs = pa.array(np.arange(first, first + n, dtype=np.int64))
                first += n
                renumbered = cells.set_column(4, "seq", seqs)
                lg = self._schema.locality_groups.get(group)
                # Encoding releases the GIL: off the event loop (tablets load in parallel).
                data, info = await asyncio.to_thread(
                    write_sstable_table,
                    renumbered,
                    compression=lg.compression if lg is not None else "zstd",
                    block_size=lg.block_size if lg is not None else 64 * 1024,
                    locality_group=group,
                )
                ref, table = await self._store_sstable(group, data, info)
                added.append((group, ref, table))
            async with self._state_lock:
                state = self._state
                record = state.record
                new_sstables = dict(record.sstables)
                opened = dict(state.sstables)
                for group, ref, table in added:
                    new_sstables[group] = (ref, *new_sstables.get(group, ()))
                    opened[group] = (table, *opened.get(group, ()))
                detail = f"{total} cells" + (f" of load {marks[0].load_id}" if marks else "")
                new_record = (
                    replace(record, sstables=new_sstables)
                    .with_bulk_loads(marks)
                    .with_event(self._clock.time(), "bulk load", detail)
                )
                stored = await self._catalog.update(record, new_record)
                self._state = replace(state, record=stored, sstables=opened)
        self._notify_compacted()
        return total

    def _marked(self, marks: tuple[BulkLoadMark, ...]) -> bool:
        """Whether the record marks all the rows of ``marks`` as loaded (True), none of them
        (False), or some (NotServing: the caller's view is stale)."""
        have = self.record.bulk_loads
        fresh = [uncovered(have, m.load_id, m.start_row, m.end_row) for m in marks]
        if all(f == [(m.start_row, m.end_row)] for f, m in zip(fresh, marks, strict=True)):
            return False
        if all(not f for f in fresh):
            return True
        raise NotServing(
            f"tablet {self.record.tablet_id}: load {marks[0].load_id} is partly in it already"
        )


def _seq_bases(record: TabletRecord, keys: Sequence[str]) -> list[int]:
    """The ``SSTableRef.seq_base`` of each of ``keys`` (SSTables of ``record``)."""
    bases = {ref.key: ref.seq_base for refs in record.sstables.values() for ref in refs}
    return [bases[k] for k in keys]


def _memtable_probe(
    mt: MemTable | FrozenMemTable, upper: bytes | None, start: bytes
) -> bytes | None:
    return mt.row_below(upper, start, MEMTABLE_WINDOW_ROWS)


@dataclass(frozen=True, slots=True)
class SnapshotCut:
    """One tablet's side of a snapshot's cut (:meth:`Tablet.hold_for_snapshot`)."""

    #: The tablet's record at the cut (its SSTables then).
    record: TabletRecord
    #: The largest seq of any cell of the tablet at the cut: larger ones are after it.
    mark: int
    #: The memtables at the cut, newest first (the first keeps taking writes, seq > mark).
    memtables: tuple[MemTable, ...]
    gate: asyncio.Event
    timer: asyncio.TimerHandle


class _FlushedRows:
    """Which replayed aggregate parts an SSTable holds already (:meth:`Tablet.load`).

    Replay re-applies every record past the redo point, and the redo point may lag behind
    what the SSTables hold (writes in flight at a freeze, see the module docstring). A put
    applied twice collapses with itself (same key), but an aggregate part would be counted
    twice, once in the SSTable's combined cell and once more from the log. A row's writes
    reach memtables in seq order (row lock), and memtables reach SSTables in order, so a part
    of row R and family F with seq ``s`` is in an SSTable (or was removed from one by a
    deletion or GC) exactly when some SSTable holds a cell of R in F, or a row deletion of R,
    with a seq >= ``s`` (bulk loads, whose fresh seqs bypass the memtable, are refused for
    aggregate families). Only parts with a seq between the redo point and the SSTables'
    largest seq can be there: the others are not looked up."""

    def __init__(self, tables: Mapping[str, tuple[SSTable, ...]], record: TabletRecord) -> None:
        self._tables = [t for group in tables.values() for t in group]
        self._top = max((r.max_seq for refs in record.sstables.values() for r in refs), default=0)
        self._rows: dict[tuple[bytes, str], int] = {}

    async def holds(self, cell: Cell) -> bool:
        if cell.seq > self._top:
            return False
        top = self._rows.get((cell.row, cell.family))
        if top is None:
            rows = await asyncio.gather(*(t.get_row(cell.row) for t in self._tables))
            top = max(
                (
                    c.seq
                    for cells in rows
                    for c in cells
                    if c.family == cell.family or c.kind == CellKind.DELETE_ROW
                ),
                default=-1,
            )
            self._rows[(cell.row, cell.family)] = top
        return cell.seq <= top


def _intersect(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b


def validate_families_hint(schema: TableSchema, families: Iterable[str]) -> None:
    """A read naming a family the table does not have is an error, not an empty result."""
    for f in families:
        if f not in schema.families:
            raise InvalidArgument(f"table {schema.name!r} has no column family {f!r}")
