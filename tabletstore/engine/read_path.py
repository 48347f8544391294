"""A tablet's read path: point reads and scans over the merge of every source, newest first
(the memtable, the frozen ones, the SSTables of the locality groups asked for), with deletion
entries and per-family GC applied (:mod:`tabletstore.engine.iterators`) and the filter
evaluated server-side (:mod:`tabletstore.data.filters`); reversed scans by windows
(:mod:`tabletstore.engine.reverse`).

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
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import os
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

from tabletstore.clock import stopwatch
from tabletstore.data.filters import RowFilter, apply_filter, compile_filter, uncompiled
from tabletstore.data.model import Cell as ApiCell
from tabletstore.data.model import Row
from tabletstore.data.query import RowRange
from tabletstore.data.schema import TableSchema, is_garbage
from tabletstore.engine.iterators import (
    AsyncCellSource,
    amerge_batches,
    avisible_batches,
    visible_cells,
)
from tabletstore.engine.memtable import FrozenMemTable, MemTable
from tabletstore.engine.reverse import (
    MEMTABLE_WINDOW_ROWS,
    next_window_start,
    sorted_block_starts,
)
from tabletstore.engine.scan_stats import ScanStats
from tabletstore.engine.tablet_core import TabletCore
from tabletstore.keys import Cell, CellKind, cell_sort_key

__all__ = [
    "INLINE_FILTER_STEPS",
    "INLINE_REGEX_WORK",
    "READ_SLICE_SECONDS",
    "ReadPath",
    "filter_row",
    "regex_cost_compiled",
]

#: The longest a scan computes on the event loop before it lets other tasks run. The lease
#: keep-alive shares the loop and tolerates a stall of about ``ttl - ttl/3`` (3.3 s with the
#: default 5 s lease), so liveness alone would allow far more; the bound is the point reads
#: queued behind the scan: each waits for the slice of every scan ahead of it, so the slice
#: is a term of their tail. 1 ms keeps a yield (a few tens of µs through a stream's
#: generators) to a few percent of the scan's time, where 0.1 ms costs scans a third of their
#: throughput (``bench.scan_turns`` measures both sides).
READ_SLICE_SECONDS = 0.001
#: The most regex work (RE2 program size x bytes of the row) one row's filter may do on the
#: event loop. RE2's worst case (its NFA, when a pattern's DFA outgrows its memory) is 5 to
#: 15 ns per byte per instruction, so this bounds an inline filter to a few milliseconds;
#: heavier rows go to :func:`_filter_executor`.
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


async def filter_row(
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


async def regex_cost_compiled(filter: RowFilter | None) -> int:
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
    cells = await filter_row(filter, cost, row.key, row.cells)
    return Row(row.key, cells) if cells else None


class ReadPath:
    """Reads one tablet: its rows as of now, never locking (one reference to the state)."""

    def __init__(self, core: TabletCore) -> None:
        self._core = core
        #: The last (schema, identity) :meth:`readable` found may read every family.
        self._reads_all: tuple[TableSchema, str | None] | None = None

    def may_read_some(self, identity: str | None) -> bool:
        """Whether ``identity`` may read at least one family of this table (or it has none):
        what reading the table's shape (its sample keys, its tablets' boundaries) needs."""
        return self.readable(identity) != set()

    def readable(self, identity: str | None) -> set[str] | None:
        """Families the identity may read, or None when it may read them all."""
        schema = self._core.schema
        if self._reads_all is not None and self._reads_all[0] is schema:
            if self._reads_all[1] == identity:  # every point read asks: remembered
                return None
        fams = schema.families
        if all(f.acl.may_read(identity) for f in fams.values()):
            self._reads_all = (schema, identity)
            return None
        return {name for name, f in fams.items() if f.acl.may_read(identity)}

    def _groups_for(self, families: set[str] | None) -> list[str]:
        state = self._core.state
        if families is None:
            return list(state.sstables)
        schema = self._core.schema
        wanted = {schema.families[f].locality_group for f in families if f in schema.families}
        return [g for g in state.sstables if g in wanted]

    async def read_row_cells(self, row: bytes, families: set[str] | None) -> list[ApiCell]:
        """Visible cells of one row (deletions and GC applied), as API cells."""
        core = self._core
        state = core.state
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
        visible = visible_cells(raw, gc_rules=core.gc_rules(), now_micros=core.now_micros())
        # Cells of a dropped family stay in SSTables until their next compaction: never shown.
        wanted = set(core.schema.families) if families is None else families
        return [
            ApiCell(c.family, c.qualifier, c.ts, c.value) for c in visible if c.family in wanted
        ]

    def _lone_put(self, cell: Cell, families: set[str] | None) -> list[ApiCell]:
        """What visible_cells and the family check make of a row whose only cell is one put
        (most point reads), without sorting or a visibility pass: the put itself unless its
        family's GC rule collects it (version 0 at its age)."""
        family = self._core.schema.families.get(cell.family)
        if (family is None) if families is None else (cell.family not in families):
            return []
        rule = None if family is None else family.gc_rule
        if rule is not None and is_garbage(rule, 0, cell.ts, self._core.now_micros()):
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
        core = self._core
        core.check_serving()
        core.check_row(row)
        # No filter (most point reads): no coroutine and generators to find it has no patterns.
        cost = 0 if filter is None else await regex_cost_compiled(filter)
        fams = _intersect(families, self.readable(identity))
        cells = await self.read_row_cells(row, fams)
        if stats is not None and cells:
            stats.seen(Row(row, cells))
        if filter is not None:
            cells = await filter_row(filter, cost, row, cells)
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
        self._core.check_serving()
        rec = self._core.record
        clipped = row_range.clip(rec.start_row, rec.end_row)
        if clipped is None or (limit is not None and limit <= 0):
            return
        if reverse:
            reversed_rows = self._scan_reversed(clipped, filter, families, limit, identity, None)
            async with contextlib.aclosing(reversed_rows):
                async for row in reversed_rows:
                    yield row
            return
        cost = await regex_cost_compiled(filter)
        rows = self._scan_rows(clipped, _intersect(families, self.readable(identity)))
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
        self._core.check_serving()
        rec = self._core.record
        clipped = row_range.clip(rec.start_row, rec.end_row)
        if clipped is None or (limit is not None and limit <= 0):
            return
        if reverse:
            reversed_rows = self._scan_reversed(clipped, filter, families, limit, identity, stats)
            async with contextlib.aclosing(reversed_rows):
                async for row in reversed_rows:
                    yield row
            return
        cost = await regex_cost_compiled(filter)
        rows = self._scan_rows(clipped, _intersect(families, self.readable(identity)))
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
        fams = _intersect(families, self.readable(identity))
        emitted = 0
        while True:
            state = self._core.state
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
        ones, then the SSTables of the locality groups holding ``fams`` (None: all). The
        memtables are read lazily, a batch at a time as the merge reaches them (their scans
        may interleave with writes, ``engine/memtable.py``): copied whole, a 100-row scan of a
        tablet holding a 16 MB memtable built ~16,000 cells on the event loop first (15 ms
        median, 70 ms with a garbage collection), and every other request waited."""
        state = self._core.state
        sources: list[AsyncCellSource] = [
            state.memtable.scan(start, end),
            *(mt.scan(start, end) for mt in state.frozen),
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
        core = self._core
        start, end = rng.bounds()
        batches = avisible_batches(
            amerge_batches(self._scan_sources(start, end, fams)),
            gc_rules=core.gc_rules(),
            now_micros=core.now_micros(),
        )
        # Cells of a dropped family stay in SSTables until their next compaction: never shown.
        wanted = set(core.schema.families) if fams is None else fams
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


def _memtable_probe(
    mt: MemTable | FrozenMemTable, upper: bytes | None, start: bytes
) -> bytes | None:
    return mt.row_below(upper, start, MEMTABLE_WINDOW_ROWS)


def _intersect(a: set[str] | None, b: set[str] | None) -> set[str] | None:
    if a is None:
        return b
    if b is None:
        return a
    return a & b
