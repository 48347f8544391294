"""Merging and visibility over streams of cells: how reads and compactions see a tablet (§5.3, §5.4).

Paper §5.3: "a valid read operation is executed on a merged view of the sequence of SSTables
and the memtable"; §5.4: merging and major compactions rewrite such a merged view, and "a
major compaction ... produces an SSTable that contains no deletion information or deleted
data". This module owns those merged views. Reads and compactions are built by wrapping
sources, never by hand-merging (docs/architecture/conventions.md convention 3)::

    visible_cells(merge_sources([memtable.scan(), *frozen]), gc_rules=..., now_micros=...)

Every stream is in ``keys.cell_sort_key`` order. Deletion entries sort before the cells they
can mask and mask only cells of their scope with a *smaller* ``seq`` (see keys.py).

Sync and async. Memtables are scanned synchronously; SSTables asynchronously. Each function
has an async twin taking and giving async iterables of cells (``amerge_sources``,
``avisible_cells``, ``acompact_cells``, ``agroup_rows``), and the hot paths have **batch**
twins (``amerge_batches``, ``avisible_batches``, ``acompact_batches``) that pass sorted,
consecutive ``list[Cell]`` batches so a pipeline costs one ``await`` per batch rather than per
cell; ``acells`` flattens batches. The async merge accepts, per source, a sync iterable of
cells (a memtable scan), an async iterable of cells, or an async iterable of cell batches (an
SSTable read block by block); it tells the last two apart by the first item.

The visibility and compaction rules live in two small per-cell state machines
(:class:`_Visibility`, :class:`_MinorCompaction`), shared by the sync and async drivers so the
rules exist once. Like any generator, an iterator that raised stays finished.

What a non-major compaction may drop (``compact_cells(major=False)``). Its input is the merge
of some of a tablet's sources (normally the newest ones); other sources, outside the merge,
may hold any cells. Sequence numbers are unique per cell. The output, merged again with the
sources left out, must read exactly like the original sources (a property test pins this):

* an exact duplicate of a full key (row, family, qualifier, ts, seq): same cell, keep one;
* an older rewrite of the same (row, family, qualifier, ts): reads keep only the newest seq of
  a version; if that newer cell is masked by some deletion, the older one is masked too
  (smaller seq), so dropping the older one changes nothing wherever the newer one lives;
* a put masked by a deletion entry inside the merge: the entry is kept (or one that subsumes
  it), and masking depends only on seqs, never on which source holds a cell;
* a deletion entry subsumed by a kept one: a DELETE_ROW with a larger seq, a DELETE_FAMILY
  of the same family with a larger seq, or a DELETE_COLUMN of the same column with a larger
  seq and a range that contains it (everything it masks, the other masks);
* a put that GC would collect even as the *newest* version of its column
  (``is_garbage(rule, 0, ts, now)``, i.e. age-based collection): ``is_garbage`` is monotone —
  more garbage with a larger version index and an older timestamp — so every version older
  than it is collected too, whatever else exists outside the merge, and it never lowers the
  version index of a version that would otherwise be kept. ``now`` only grows (clock skew
  between workers aside), so collected stays collected.

It must **keep** every other deletion entry (it may mask cells in sources outside the merge)
and must **not** apply version-count GC: the version index of a cell counts visible versions
in *all* sources (a source outside the merge may hold newer timestamps, and deletions outside
it may hide versions the merge counts), so dropping by count could lose a version that should
be read or count one that should not.

A major compaction (the merge of *all* of a tablet's sources) outputs exactly what
``visible_cells`` yields: live puts after deletions, rewrites and GC, no deletion entries.

Aggregate parts (kinds 4-7, ``data.aggregates``). The parts of one bucket (row, family,
qualifier, ts) are consecutive, newest seq first. A part is kept when no deletion entry masks
it (its seq is the largest of the writes folded into it) and, for the bucket's newest part,
when GC keeps the bucket (one version, whatever its number of parts); a compaction applies the
same age rule as to puts. The kept parts of a bucket are then folded into one cell
(:class:`_Combiner`) carrying the newest part's seq -- in reads and in compactions alike, so a
non-major compaction's output reads like its input: folding is associative and commutative,
and a deletion entry outside the merge cannot fall between two parts inside it (a merge takes
consecutive sources, and a row's writes reach sources in seq order). A part seen twice (the
same full key in two sources) counts once. Plain tables never meet the combiner: it starts
with the first aggregate part a filter keeps.

Snapshot reads: compactions discard history (masked and rewritten cells). A reader holding an
older ``snapshot_seq`` must keep reading the sources it started with; SSTables are immutable,
so a read that pinned its source list is unaffected by a compaction finishing meanwhile.
"""

from __future__ import annotations

import heapq
from collections.abc import AsyncIterable, AsyncIterator, Iterable, Iterator, Mapping, Sequence
from itertools import groupby, islice
from operator import attrgetter
from typing import Any, cast

from tabletstore.data.aggregates import combine
from tabletstore.data.schema import GcRule, is_garbage
from tabletstore.errors import Corruption
from tabletstore.keys import Cell, CellKind, cell_sort_key, decode_ts_range

__all__ = [
    "BATCH_SIZE",
    "AsyncCellSource",
    "acells",
    "acompact_batches",
    "acompact_cells",
    "agroup_rows",
    "amerge_batches",
    "amerge_sources",
    "avisible_batches",
    "avisible_cells",
    "compact_cells",
    "group_rows",
    "merge_sources",
    "visible_cells",
]

#: What the async merge accepts per source.
AsyncCellSource = Iterable[Cell] | AsyncIterable[Cell] | AsyncIterable[Sequence[Cell]]

#: Cells per batch produced by the async merge, and pulled at a time from sync sources.
BATCH_SIZE = 512

_PUT = int(CellKind.PUT)
_DELETE_COLUMN = int(CellKind.DELETE_COLUMN)
_DELETE_FAMILY = int(CellKind.DELETE_FAMILY)
_DELETE_ROW = int(CellKind.DELETE_ROW)
_AGG_FIRST = int(CellKind.AGGREGATE_SUM)
_AGG_LAST = int(CellKind.AGGREGATE_HLL)

_row_of = attrgetter("row")


# ---------------------------------------------------------------------------------------------
# Merging


def merge_sources(sources: Sequence[Iterable[Cell]]) -> Iterator[Cell]:
    """The k-way merge of sorted cell streams, in sort order.

    ``sources`` are ordered newest first. Two cells with the same full key (row, family,
    qualifier, ts, seq) are the same entry seen twice (e.g. a memtable being flushed and the
    SSTable it became); the one from the earliest source is kept, the rest dropped.
    """
    if len(sources) == 1:
        yield from sources[0]
        return
    last: tuple[Any, ...] | None = None
    # heapq.merge is stable: on equal keys the earlier iterable's item comes first.
    for cell in heapq.merge(*sources, key=cell_sort_key):
        key = cell[:5]
        if key != last:
            last = key
            yield cell


class _BatchReader:
    """Pulls one source of the async merge a batch at a time."""

    __slots__ = ("_aiter", "_cells_async", "_sync", "buf", "is_async", "pos")

    def __init__(self, source: AsyncCellSource) -> None:
        self.buf: Sequence[Cell] = ()
        self.pos = 0
        self._sync: Iterator[Cell] | None = None
        self._aiter: AsyncIterator[Any] | None = None
        self._cells_async: bool | None = None  # None until the first item tells us
        if hasattr(source, "__aiter__"):
            self._aiter = aiter(cast(AsyncIterable[Any], source))
        else:
            self._sync = iter(source)
        #: Refilling may await I/O.
        self.is_async = self._aiter is not None

    async def fill(self) -> bool:
        """Load the next non-empty batch into ``buf``; False at the end of the source."""
        self.pos = 0
        if self._sync is not None:
            self.buf = list(islice(self._sync, BATCH_SIZE))
            return bool(self.buf)
        assert self._aiter is not None
        while True:
            try:
                item = await anext(self._aiter)
            except StopAsyncIteration:
                self.buf = ()
                return False
            if self._cells_async is None:
                self._cells_async = isinstance(item, Cell)
            if self._cells_async:
                # One cell at a time: reading ahead could cost a source an extra block fetch
                # that a limited scan never needed. Sources that can should yield batches.
                self.buf = (item,)
                return True
            if item:
                self.buf = item
                return True


async def amerge_batches(
    sources: Sequence[AsyncCellSource], *, batch_size: int = BATCH_SIZE
) -> AsyncIterator[list[Cell]]:
    """The async k-way merge: like :func:`merge_sources`, yielding sorted batches.

    Each source may be a sync iterable of cells (a memtable scan), an async iterable of cells
    or an async iterable of sorted cell batches (an SSTable scan by blocks); sources are
    ordered newest first and the earliest source wins a full-key tie.
    """
    readers = [_BatchReader(s) for s in sources]
    heap: list[tuple[tuple[Any, ...], int]] = []
    for idx, reader in enumerate(readers):
        if await reader.fill():
            heap.append((cell_sort_key(reader.buf[0]), idx))
    heapq.heapify(heap)
    out: list[Cell] = []
    last: tuple[Any, ...] | None = None
    while heap:
        if len(heap) == 1:
            # One source left: pass its batches through, after the duplicate check on its head.
            idx = heap[0][1]
            reader = readers[idx]
            if last is not None and cell_sort_key(reader.buf[reader.pos]) == last:
                reader.pos += 1
            out.extend(reader.buf[reader.pos :])
            if out:
                yield out
            while await reader.fill():
                yield list(reader.buf)
            return
        key, idx = heap[0]
        reader = readers[idx]
        cell = reader.buf[reader.pos]
        reader.pos += 1
        if key != last:
            last = key
            out.append(cell)
            if len(out) >= batch_size:
                yield out
                out = []
        if reader.pos >= len(reader.buf) and reader.is_async and out:
            # Hand out what is ready before awaiting a source's next block: a consumer that
            # stops here (a limited scan) never pays for that fetch.
            yield out
            out = []
        if reader.pos < len(reader.buf) or await reader.fill():
            heapq.heapreplace(heap, (cell_sort_key(reader.buf[reader.pos]), idx))
        else:
            heapq.heappop(heap)
    if out:
        yield out


async def amerge_sources(sources: Sequence[AsyncCellSource]) -> AsyncIterator[Cell]:
    """:func:`amerge_batches` flattened: the async merge, one cell at a time."""
    async for batch in amerge_batches(sources):
        for cell in batch:
            yield cell


async def acells(batches: AsyncIterable[Sequence[Cell]]) -> AsyncIterator[Cell]:
    """Flatten a stream of batches into single cells."""
    async for batch in batches:
        for cell in batch:
            yield cell


# ---------------------------------------------------------------------------------------------
# Visibility: deletions, rewrites, snapshots, garbage collection


class _Scopes:
    """The deletion-entry scopes of a sorted cell stream, shared by the visibility and the
    compaction decisions: the current row's DELETE_ROW floor, the current family's floor (max
    of row and family deletes), the current column's DELETE_COLUMN ranges, the newest
    timestamp seen in the column (rewrite detection) and the count of versions accepted so far
    (the GC version index).

    Subclasses compare the row, family and qualifier of each cell inline (the common case is
    "same as before") and call ``_new_*`` only when one changes.
    """

    __slots__ = (
        "_bucket_live",
        "_bucket_seq",
        "_col_dels",
        "_fam_floor",
        "_family",
        "_gc_rules",
        "_last_ts",
        "_now",
        "_qualifier",
        "_row",
        "_row_floor",
        "_rule",
        "_versions",
        "aggregates",
    )

    def __init__(self, gc_rules: Mapping[str, GcRule | None], now_micros: int) -> None:
        self._gc_rules = gc_rules
        self._now = now_micros
        self._row: bytes | None = None
        self._row_floor = -1
        self._family: str | None = None
        self._fam_floor = -1
        self._rule: GcRule | None = None
        self._qualifier: bytes | None = None
        self._col_dels: list[tuple[int, int, int]] = []
        self._last_ts = -1
        self._versions = 0
        self._bucket_live = False
        self._bucket_seq = -1
        #: Set once a part of an aggregate bucket was kept: the combiner has work to do.
        self.aggregates = False

    def _new_row(self, row: bytes) -> None:
        self._row = row
        self._row_floor = -1
        self._family = None

    def _new_family(self, family: str) -> None:
        # DELETE_ROW entries sort before every family, so the row floor is final here.
        self._family = family
        self._fam_floor = self._row_floor
        self._rule = self._gc_rules.get(family)
        self._qualifier = None

    def _new_column(self, qualifier: bytes) -> None:
        self._qualifier = qualifier
        self._col_dels = []
        self._last_ts = -1
        self._versions = 0

    def _put_hidden(self, seq: int, ts: int) -> bool:
        """Whether a put is an older rewrite of a version already decided, or masked by a
        deletion entry of its row, family or column. Puts sort after every deletion entry of
        their family and column (ts < TS_MAX), so the floors and ranges are final here."""
        if ts == self._last_ts:
            return True
        self._last_ts = ts
        return self._masked(seq, ts)

    def _masked(self, seq: int, ts: int) -> bool:
        """Whether a deletion entry of the cell's row, family or column masks it."""
        if seq < self._fam_floor:
            return True
        for start, end, dseq in self._col_dels:
            if seq < dseq and start <= ts < end:
                return True
        return False

    def _aggregate(self, seq: int, ts: int, index_of_gc: int | None) -> bool:
        """Whether a part of an aggregate bucket is kept. The bucket's newest part decides
        its GC (one version, however many parts: ``index_of_gc`` None means the version
        index of reads, else that fixed index); each older part is kept when the bucket is
        and no deletion entry masks it (the combiner then folds the parts into one cell)."""
        if ts == self._last_ts:
            if seq == self._bucket_seq:
                return False  # the same part seen in two sources: counted once
            self._bucket_seq = seq
            return self._bucket_live and not self._masked(seq, ts)
        self._last_ts = ts
        self._bucket_seq = seq
        if self._masked(seq, ts):
            # Older parts of the bucket have smaller seqs: masked too.
            self._bucket_live = False
            return False
        if index_of_gc is None:
            index = self._versions
            self._versions = index + 1
        else:
            index = index_of_gc
        rule = self._rule
        live = rule is None or not is_garbage(rule, index, ts, self._now)
        self._bucket_live = live
        if live:
            self.aggregates = True
        return live


class _Combiner:
    """Folds the consecutive kept parts of each aggregate bucket (same row, family,
    qualifier, timestamp and kind) into one cell carrying the newest part's seq; parts of
    the bucket of another aggregate kind (a family dropped and created again with another
    value type, whose cells a compaction has not removed yet) are left out. Fed the output of
    a visibility or compaction filter, in order, possibly in batches."""

    __slots__ = ("_pending",)

    def __init__(self) -> None:
        self._pending: Cell | None = None

    def feed(self, cells: Iterable[Cell]) -> list[Cell]:
        out: list[Cell] = []
        pending = self._pending
        for c in cells:
            if pending is not None:
                if (
                    c.ts == pending.ts
                    and c.qualifier == pending.qualifier
                    and c.family == pending.family
                    and c.row == pending.row
                    and _AGG_FIRST <= c.kind <= _AGG_LAST
                ):
                    if c.kind == pending.kind:
                        value = combine(pending.kind, pending.value, c.value)
                        pending = pending._replace(value=value)
                    continue
                out.append(pending)
                pending = None
            if _AGG_FIRST <= c.kind <= _AGG_LAST:
                pending = c
            else:
                out.append(c)
        self._pending = pending
        return out

    def finish(self) -> list[Cell]:
        pending, self._pending = self._pending, None
        return [] if pending is None else [pending]


def _combined(cells: Iterable[Cell], state: _Scopes) -> Iterator[Cell]:
    """``cells`` (a filter over ``state``) with aggregate buckets folded; cells pass straight
    through until the filter keeps the first aggregate part."""
    it = iter(cells)
    for c in it:
        if state.aggregates:
            combiner = _Combiner()
            yield from combiner.feed((c,))
            for c in it:
                yield from combiner.feed((c,))
            yield from combiner.finish()
            return
        yield c


async def _acombined(cells: AsyncIterable[Cell], state: _Scopes) -> AsyncIterator[Cell]:
    """:func:`_combined` over an async stream."""
    combiner: _Combiner | None = None
    async for c in cells:
        if combiner is None and state.aggregates:
            combiner = _Combiner()
        if combiner is None:
            yield c
            continue
        for out in combiner.feed((c,)):
            yield out
    if combiner is not None:
        for out in combiner.finish():
            yield out


async def _combined_batches(
    batches: AsyncIterable[Sequence[Cell]], state: _Visibility | _MinorCompaction
) -> AsyncIterator[list[Cell]]:
    """Filter each batch through ``state.accept`` and fold aggregate buckets (only once the
    filter kept one: plain tables pay nothing)."""
    accept = state.accept
    combiner = _Combiner()
    async for batch in batches:
        out = [c for c in batch if accept(c)]
        if state.aggregates:
            out = combiner.feed(out)
        if out:
            yield out
    tail = combiner.finish()
    if tail:
        yield tail


class _Visibility(_Scopes):
    """Per-cell decision of what a read sees; feed cells in sort order to :meth:`accept`."""

    __slots__ = ("_keep_deletions", "_snapshot")

    def __init__(
        self,
        gc_rules: Mapping[str, GcRule | None],
        now_micros: int,
        snapshot_seq: int | None,
        keep_deletions: bool,
    ) -> None:
        super().__init__(gc_rules, now_micros)
        self._snapshot = snapshot_seq
        self._keep_deletions = keep_deletions

    def accept(self, cell: Cell) -> bool:
        seq = cell.seq
        if self._snapshot is not None and seq > self._snapshot:
            return False  # written after the reader's snapshot
        if cell.row != self._row:
            self._new_row(cell.row)
        kind = cell.kind
        if kind == _DELETE_ROW:
            if seq > self._row_floor:
                self._row_floor = seq
            return self._keep_deletions
        if cell.family != self._family:
            self._new_family(cell.family)
        if cell.qualifier != self._qualifier:
            self._new_column(cell.qualifier)
        if kind == _PUT:
            if self._put_hidden(seq, cell.ts):
                return False
            index = self._versions
            self._versions = index + 1
            rule = self._rule
            return rule is None or not is_garbage(rule, index, cell.ts, self._now)
        if _AGG_FIRST <= kind <= _AGG_LAST:
            return self._aggregate(seq, cell.ts, None)
        if kind == _DELETE_FAMILY:
            if seq > self._fam_floor:
                self._fam_floor = seq
            return self._keep_deletions
        if kind == _DELETE_COLUMN:
            start, end = _ts_range(cell)
            self._col_dels.append((start, end, seq))
            return self._keep_deletions
        raise Corruption(f"cell of row {cell.row!r} has unknown kind {kind}")


class _MinorCompaction(_Scopes):
    """Per-cell decision of a non-major compaction (rules in the module docstring)."""

    __slots__ = ()

    def accept(self, cell: Cell) -> bool:
        seq = cell.seq
        if cell.row != self._row:
            self._new_row(cell.row)
        kind = cell.kind
        if kind == _DELETE_ROW:
            # Entries of one scope sort by seq descending: only the first can be unsubsumed.
            if seq > self._row_floor:
                self._row_floor = seq
                return True
            return False
        if cell.family != self._family:
            self._new_family(cell.family)
        if cell.qualifier != self._qualifier:
            self._new_column(cell.qualifier)
        if kind == _PUT:
            if self._put_hidden(seq, cell.ts):
                return False
            rule = self._rule
            return rule is None or not is_garbage(rule, 0, cell.ts, self._now)
        if _AGG_FIRST <= kind <= _AGG_LAST:
            return self._aggregate(seq, cell.ts, 0)
        if kind == _DELETE_FAMILY:
            if seq > self._fam_floor:
                self._fam_floor = seq
                return True
            return False
        if kind == _DELETE_COLUMN:
            if seq < self._fam_floor:
                return False
            start, end = _ts_range(cell)
            for dstart, dend, dseq in self._col_dels:
                if dseq > seq and dstart <= start and end <= dend:
                    return False
            self._col_dels.append((start, end, seq))
            return True
        raise Corruption(f"cell of row {cell.row!r} has unknown kind {kind}")


def _ts_range(cell: Cell) -> tuple[int, int]:
    try:
        return decode_ts_range(cell.value)
    except Exception as exc:  # struct.error: the value is not 16 bytes
        raise Corruption(
            f"DELETE_COLUMN entry of row {cell.row!r} has a malformed range value"
        ) from exc


def visible_cells(
    merged: Iterable[Cell],
    *,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    snapshot_seq: int | None = None,
    drop_deletions: bool = True,
) -> Iterator[Cell]:
    """What a read sees in a merged stream: the live puts, in sort order.

    * a deletion entry masks the cells of its scope (row, family, or column and timestamp
      range) whose seq is smaller than its own;
    * of several puts of the same (row, family, qualifier, ts) only the newest seq counts;
    * with ``snapshot_seq``, entries with a larger seq are ignored (written after the read);
    * a family's GC rule (``gc_rules[family]``, missing = none) is applied with the version
      index counted among the column's visible versions, newest first, at ``now_micros``.

    ``drop_deletions=False`` also yields the deletion entries in effect at the snapshot (for
    consumers that merge this stream with further sources).
    """
    state = _Visibility(gc_rules, now_micros, snapshot_seq, not drop_deletions)
    return _combined(filter(state.accept, merged), state)


async def avisible_cells(
    merged: AsyncIterable[Cell],
    *,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    snapshot_seq: int | None = None,
    drop_deletions: bool = True,
) -> AsyncIterator[Cell]:
    """:func:`visible_cells` over an async stream of cells."""
    state = _Visibility(gc_rules, now_micros, snapshot_seq, not drop_deletions)
    accept = state.accept

    async def kept() -> AsyncIterator[Cell]:
        async for cell in merged:
            if accept(cell):
                yield cell

    async for cell in _acombined(kept(), state):
        yield cell


async def avisible_batches(
    batches: AsyncIterable[Sequence[Cell]],
    *,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    snapshot_seq: int | None = None,
    drop_deletions: bool = True,
) -> AsyncIterator[list[Cell]]:
    """:func:`visible_cells` over a stream of batches; yields non-empty batches."""
    state = _Visibility(gc_rules, now_micros, snapshot_seq, not drop_deletions)
    async for out in _combined_batches(batches, state):
        yield out


def _compaction_filter(
    gc_rules: Mapping[str, GcRule | None], now_micros: int, major: bool
) -> _Visibility | _MinorCompaction:
    if major:
        return _Visibility(gc_rules, now_micros, None, keep_deletions=False)
    return _MinorCompaction(gc_rules, now_micros)


def compact_cells(
    merged: Iterable[Cell],
    *,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    major: bool,
) -> Iterator[Cell]:
    """What a compaction writes (§5.4). ``major``: the merge covers all of the tablet's
    sources; the output is exactly ``visible_cells``. Otherwise only what is safe to drop
    with sources outside the merge is dropped (see the module docstring)."""
    state = _compaction_filter(gc_rules, now_micros, major)
    return _combined(filter(state.accept, merged), state)


async def acompact_cells(
    merged: AsyncIterable[Cell],
    *,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    major: bool,
) -> AsyncIterator[Cell]:
    """:func:`compact_cells` over an async stream of cells."""
    state = _compaction_filter(gc_rules, now_micros, major)
    accept = state.accept

    async def kept() -> AsyncIterator[Cell]:
        async for cell in merged:
            if accept(cell):
                yield cell

    async for cell in _acombined(kept(), state):
        yield cell


async def acompact_batches(
    batches: AsyncIterable[Sequence[Cell]],
    *,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
    major: bool,
) -> AsyncIterator[list[Cell]]:
    """:func:`compact_cells` over a stream of batches; yields non-empty batches."""
    async for out in _combined_batches(batches, _compaction_filter(gc_rules, now_micros, major)):
        yield out


# ---------------------------------------------------------------------------------------------
# Rows


def group_rows(cells: Iterable[Cell]) -> Iterator[tuple[bytes, list[Cell]]]:
    """``(row, cells of the row)`` for each row of a sorted stream."""
    for row, group in groupby(cells, key=_row_of):
        yield row, list(group)


async def agroup_rows(cells: AsyncIterable[Cell]) -> AsyncIterator[tuple[bytes, list[Cell]]]:
    """:func:`group_rows` over an async stream of cells."""
    row: bytes | None = None
    current: list[Cell] = []
    async for cell in cells:
        if cell.row != row:
            if current:
                assert row is not None
                yield row, current
            row = cell.row
            current = []
        current.append(cell)
    if current:
        assert row is not None
        yield row, current
