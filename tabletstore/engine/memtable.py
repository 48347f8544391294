"""The memtable: a tablet's recently committed cells, sorted in memory (§5.3, §5.4).

Paper §5.3: "the recently committed ones are stored in memory in a sorted buffer called a
memtable". When it grows past a threshold it is frozen, a new memtable takes the writes, and
the frozen one is converted to an SSTable (a minor compaction, §5.4). This module owns that
buffer; the tablet decides when to freeze and the SSTable writer does the conversion.

Structure (measured on this machine, 100k random cells: a sorted list of cells keyed by
``cell_sort_key`` inserted ~220k cells/s, a sorted list of ``(key, cell)`` tuples ~150k/s, a
dict of rows each holding a list kept sorted with ``bisect.insort`` ~500k/s)::

    _rows:     dict[row key, entry | list[entry]]   a row's cells sorted by keys.cell_sort_key
    _row_keys: SortedList[row key]                  the rows in order, for range scans

``get_row`` is one dict lookup; a new row costs one SortedList insert; a new cell of an
existing row costs one ``insort`` into that row's (usually short) list.

An entry is a cell's seven fields as a plain ``tuple`` (a ``keys.Cell`` is made from it as a
read hands it out), and a row of one cell holds its entry alone, not in a list: a tuple of
bytes, str and int is untracked by the cyclic GC at its first collection, so a memtable of
single-cell rows adds nothing for the GC to traverse. With a ``Cell`` (a tuple subclass, never
untracked) and a list per row, every write left two tracked objects behind that each
collection traversed: a 16 MB memtable (~14,500 cells) was ~29,000 of an embedded
database's ~90,000 tracked objects, and a full collection took ~2.5 times as long.

Iteration contract (single-threaded asyncio; nothing here awaits):

* ``add`` applies all of its cells before returning, and readers copy a row's cell list when
  they reach it, so a reader never sees a row half-applied by one ``add`` call (§2 row
  atomicity, provided the tablet adds one row mutation per call).
* ``scan`` may be interleaved with ``add``: it sees every cell that was present when it started
  and, for rows it has not reached yet, possibly cells added later. Readers that need a fixed
  view pass ``snapshot_seq`` to :func:`tabletstore.engine.iterators.visible_cells`; sequence numbers
  are unique, so that view is exact. ``scan`` never raises because of concurrent writes: it
  walks the row keys by re-seeking past the last row it returned, in small batches.
* A :class:`FrozenMemTable` never changes, so iterating it needs no copies.

Adding a cell whose full key ``(row, family, qualifier, ts, seq)`` is already present is a
no-op (commit-log replay is idempotent this way).

Aggregate cells (``keys.py``) are combined as they arrive: a part of a bucket folds into the
bucket's newest part held here unless a deletion entry of its scope arrived in between, or a
snapshot's cut lies between the two (:meth:`MemTable.keep_parts_through`). A row's writes reach
the memtable in seq order (the tablet's row lock), so a part older than one already held for
its bucket can only be a record replayed twice: it is dropped, never counted again.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import Final

from sortedcontainers import SortedList

from tabletstore.data.aggregates import combine
from tabletstore.errors import InvalidArgument
from tabletstore.keys import TS_MAX, Cell, CellFields, CellKind, cell_sort_key, decode_ts_range

__all__ = ["CELL_OVERHEAD", "FrozenMemTable", "MemTable"]

#: Bytes charged per cell on top of its key and value lengths: an estimate of the Python
#: objects behind it (the NamedTuple, the int objects, the list slot). The tablet compares
#: ``approximate_size`` with its flush threshold, so only the order of magnitude matters.
CELL_OVERHEAD = 120

#: Row keys fetched per re-seek while scanning.
_SCAN_BATCH = 64

_AGG_FIRST = int(CellKind.AGGREGATE_SUM)
_AGG_LAST = int(CellKind.AGGREGATE_HLL)
_DELETE_ROW = int(CellKind.DELETE_ROW)
_DELETE_FAMILY = int(CellKind.DELETE_FAMILY)
_DELETE_COLUMN = int(CellKind.DELETE_COLUMN)
_SEQ_LOW = -(1 << 64)

#: A memtable entry: a cell's fields as a plain tuple (module docstring). A row's slot holds its
#: one entry, or a list of them when it has more.
_Entry = CellFields
_Slot = _Entry | list[_Entry]
_ROW: Final = 0
_FAMILY: Final = 1
_QUALIFIER: Final = 2
_TS: Final = 3
_SEQ: Final = 4
_KIND: Final = 5
_VALUE: Final = 6
#: The ``keys.Cell`` of an entry (no field checks: the entry was a Cell); a C-level call.
_as_cell: Callable[[_Entry], Cell] = functools.partial(tuple.__new__, Cell)


def _entries(slot: _Slot) -> list[_Entry]:
    """A row's entries as a new list (readers copy: ``add`` may change the row's list)."""
    return list(slot) if type(slot) is list else [slot]  # type: ignore[list-item]


def _same_bucket(a: _Entry, b: _Entry) -> bool:
    return a[_TS] == b[_TS] and a[_QUALIFIER] == b[_QUALIFIER] and a[_FAMILY] == b[_FAMILY]


def _deleted_after(row_cells: list[_Entry], cell: _Entry, seq: int) -> bool:
    """Whether the row holds a deletion entry with a seq above ``seq`` whose scope covers
    ``cell`` (deletion entries sort first in their scope: see keys.py)."""
    for c in row_cells:
        if c[_FAMILY] != "":
            break
        if c[_KIND] == _DELETE_ROW and c[_SEQ] > seq:
            return True
    family = cell[_FAMILY]
    for qualifier in {b"", cell[_QUALIFIER]}:
        low = (cell[_ROW], family, qualifier, -TS_MAX, _SEQ_LOW)
        j = bisect.bisect_left(row_cells, low, key=cell_sort_key)
        while j < len(row_cells):
            c = row_cells[j]
            if c[_FAMILY] != family or c[_QUALIFIER] != qualifier or c[_TS] != TS_MAX:
                break
            if c[_SEQ] > seq:
                if c[_KIND] == _DELETE_FAMILY:
                    return True
                if c[_KIND] == _DELETE_COLUMN and qualifier == cell[_QUALIFIER]:
                    start, end = decode_ts_range(c[_VALUE])
                    if start <= cell[_TS] < end:
                        return True
            j += 1
    return False


def _cell_size(e: _Entry) -> int:
    return len(e[_ROW]) + len(e[_FAMILY]) + len(e[_QUALIFIER]) + len(e[_VALUE]) + CELL_OVERHEAD


class _MemTableBase:
    """What frozen and live memtables share: the sorted structure and its read paths."""

    __slots__ = (
        "_cell_count",
        "_deletions",
        "_max_seq",
        "_min_seq",
        "_row_keys",
        "_rows",
        "_size",
    )

    def __init__(self) -> None:
        self._rows: dict[bytes, _Slot] = {}
        self._row_keys: SortedList = SortedList()
        self._size = 0
        self._cell_count = 0
        self._min_seq: int | None = None
        self._max_seq: int | None = None
        #: The deletion entries held, in arrival order (:meth:`deletions`).
        self._deletions: list[_Entry] = []

    @property
    def approximate_size(self) -> int:
        """Estimated memory held, in bytes (key and value lengths + CELL_OVERHEAD per cell)."""
        return self._size

    @property
    def cell_count(self) -> int:
        """Number of distinct cells held (deletion entries included)."""
        return self._cell_count

    @property
    def row_count(self) -> int:
        return len(self._rows)

    @property
    def min_seq(self) -> int | None:
        """Smallest sequence number held, or None when empty."""
        return self._min_seq

    @property
    def max_seq(self) -> int | None:
        """Largest sequence number held, or None when empty."""
        return self._max_seq

    def __len__(self) -> int:
        return self._cell_count

    def is_empty(self) -> bool:
        return self._cell_count == 0

    def deletions(self) -> list[Cell]:
        """The deletion entries held (row, family and column deletions), in sort order: what
        a major compaction of the SSTables counts versions with (``CompactionRunner``)."""
        return sorted(map(_as_cell, self._deletions), key=cell_sort_key)

    def get_row(self, row: bytes) -> list[Cell]:
        """A copy of the row's cells in sort order (empty if the row has none)."""
        slot = self._rows.get(row)
        if slot is None:
            return []
        if type(slot) is list:
            return list(map(_as_cell, slot))
        return [_as_cell(slot)]  # type: ignore[arg-type]

    def _row_batches(self, start_row: bytes, end_row: bytes | None) -> Iterator[list[bytes]]:
        """Row keys in ``[start_row, end_row)``, a batch at a time. Each batch is materialized
        before it is handed out: a SortedList iterator is not valid across inserts, and the
        caller may add() between batches (resuming after the last key handed out)."""
        if end_row is not None and end_row <= start_row:
            return
        last: bytes | None = None
        while True:
            if last is None:
                keys = self._row_keys.irange(
                    minimum=start_row, maximum=end_row, inclusive=(True, False)
                )
            else:
                keys = self._row_keys.irange(
                    minimum=last, maximum=end_row, inclusive=(False, False)
                )
            batch: list[bytes] = list(islice(keys, _SCAN_BATCH))
            if not batch:
                return
            yield batch
            last = batch[-1]

    def row_below(self, end_row: bytes | None, start_row: bytes, n: int) -> bytes | None:
        """The ``n``-th row key below ``end_row`` (exclusive; None = the end) that is above
        ``start_row``, or None if there are fewer: a window edge for reversed scans."""
        keys = self._row_keys.irange(
            minimum=start_row, maximum=end_row, inclusive=(False, False), reverse=True
        )
        found: bytes | None = next(islice(keys, n - 1, None), None)
        return found

    def scan(self, start_row: bytes = b"", end_row: bytes | None = None) -> Iterator[Cell]:
        """Cells of rows in ``[start_row, end_row)`` in sort order (``end_row`` None = to the
        end). Safe to interleave with ``add`` (see the module docstring)."""
        rows = self._rows
        for batch in self._row_batches(start_row, end_row):
            for row in batch:
                yield from map(_as_cell, _entries(rows[row]))

    def entries(self) -> Iterator[CellFields]:
        """Every cell in sort order as a plain tuple, no ``keys.Cell`` made: what the minor
        compaction writes (Cells made for 16 MB of cells would be ~14,500 new objects for the
        cyclic GC, kept while the SSTable is encoded). Safe to interleave with ``add``."""
        rows = self._rows
        for batch in self._row_batches(b"", None):
            for row in batch:
                yield from _entries(rows[row])

    def rows(
        self, start_row: bytes = b"", end_row: bytes | None = None
    ) -> Iterator[tuple[bytes, list[Cell]]]:
        """``(row, cells)`` for each row in ``[start_row, end_row)``, cells copied."""
        rows = self._rows
        for batch in self._row_batches(start_row, end_row):
            for row in batch:
                yield row, list(map(_as_cell, _entries(rows[row])))

    def __iter__(self) -> Iterator[Cell]:
        return self.scan()


class MemTable(_MemTableBase):
    """The live, writable memtable of one tablet (or one locality group of it)."""

    __slots__ = ("_floor", "_frozen")

    def __init__(self) -> None:
        super().__init__()
        self._frozen = False
        self._floor = -1

    def keep_parts_through(self, seq: int) -> None:
        """Never fold an aggregate part with a seq above ``seq`` into one at or below it (a
        snapshot's cut at ``seq`` reads this memtable's cells with seq <= ``seq``)."""
        self._floor = max(self._floor, seq)

    def _fold(self, row_cells: list[_Entry], i: int, cell: _Entry) -> bool:
        """Fold an aggregate part into its bucket's newest part here, if allowed; True when
        ``cell`` needs no insertion (folded, or an older duplicate)."""
        if i > 0:
            newer = row_cells[i - 1]
            if _same_bucket(newer, cell) and _AGG_FIRST <= newer[_KIND] <= _AGG_LAST:
                return True  # a part older than one held: a replayed record, counted already
        if i >= len(row_cells):
            return False
        old = row_cells[i]
        if old[_KIND] != cell[_KIND] or not _same_bucket(old, cell):
            return False
        if old[_SEQ] <= self._floor < cell[_SEQ] or _deleted_after(row_cells, cell, old[_SEQ]):
            return False
        value = combine(cell[_KIND], cell[_VALUE], old[_VALUE])
        row_cells[i] = (*cell[:_VALUE], value)  # type: ignore[assignment]
        self._size += len(value) - len(old[_VALUE])
        return True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def add(self, cells: Iterable[Cell]) -> None:
        """Insert cells (any order; usually one row mutation). Duplicates of a full key
        ``(row, family, qualifier, ts, seq)`` are ignored. InvalidArgument once frozen."""
        if self._frozen:
            raise InvalidArgument("memtable is frozen: add cells to the tablet's new memtable")
        rows = self._rows
        for cell in cells:
            entry: _Entry = tuple(cell)  # type: ignore[assignment]  # a plain tuple: see above
            if type(entry[_KIND]) is not int:
                # A CellKind member is a tracked object: the tuple holding it would stay tracked.
                entry = (*entry[:_KIND], int(entry[_KIND]), entry[_VALUE])
            row = entry[_ROW]
            slot = rows.get(row)
            if slot is None:
                rows[row] = entry
                self._row_keys.add(row)
            else:
                if type(slot) is list:
                    row_cells: list[_Entry] = slot
                else:
                    row_cells = rows[row] = [slot]  # type: ignore[list-item]
                key = cell_sort_key(entry)
                i = bisect.bisect_left(row_cells, key, key=cell_sort_key)
                if i < len(row_cells) and cell_sort_key(row_cells[i]) == key:
                    continue  # the same entry again (log replay): already held
                if _AGG_FIRST <= entry[_KIND] <= _AGG_LAST and self._fold(row_cells, i, entry):
                    self._note_seq(entry[_SEQ])
                    continue
                row_cells.insert(i, entry)
            self._size += _cell_size(entry)
            self._cell_count += 1
            self._note_seq(entry[_SEQ])
            if _DELETE_COLUMN <= entry[_KIND] <= _DELETE_ROW:
                self._deletions.append(entry)

    def _note_seq(self, seq: int) -> None:
        if self._min_seq is None or seq < self._min_seq:
            self._min_seq = seq
        if self._max_seq is None or seq > self._max_seq:
            self._max_seq = seq

    def freeze(self) -> FrozenMemTable:
        """Stop accepting writes and return the read-only view the minor compaction reads.

        The caller installs a new MemTable for later writes. The frozen view shares this
        memtable's structures, which no longer change, so freezing is O(1).
        """
        self._frozen = True
        return FrozenMemTable(self)


class FrozenMemTable(_MemTableBase):
    """An immutable memtable waiting to be written as an SSTable (§5.4 minor compaction)."""

    __slots__ = ()

    def __init__(self, source: MemTable) -> None:
        super().__init__()
        if not source.frozen:
            raise InvalidArgument("FrozenMemTable requires a frozen MemTable; call freeze()")
        self._rows = source._rows
        self._row_keys = source._row_keys
        self._size = source._size
        self._cell_count = source._cell_count
        self._min_seq = source._min_seq
        self._max_seq = source._max_seq
        self._deletions = source._deletions
