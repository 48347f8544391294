"""Rows of any size across the wire: bounded stream items, large rows in pieces
(docs/architecture/design.md §9).

A row is unbounded: every write may add cells (each up to ``model.MAX_VALUE``), and a read
must return the row whole (§2: a read of one row is atomic). A frame is bounded
(``frames.DEFAULT_MAX_FRAME``), and a stream's credit window (frames.py) is counted in items,
so the worker keeps every item of a ``read_rows`` stream near :data:`STREAM_ITEM_BYTES`:

* whole rows travel in a ``RowBatch``, closed once it holds about ``STREAM_ITEM_BYTES``
  (the common case: one item, many rows); on the wire a batch is column-wise
  (:data:`ROW_BATCH_FORM`: one array per cell field, so the codec handles a few arrays per
  batch, not an object per row and per cell; in-process it is passed as it is);
* a row larger than ``STREAM_ITEM_BYTES`` travels alone as consecutive ``RowPiece`` items
  (:func:`split_row`), each about ``STREAM_ITEM_BYTES``: the next cells in row order, and a
  value too large for one piece split across several (``split_value``);
* the client puts the pieces back together (:class:`RowAssembler`) and hands out the row only
  once its last piece arrived, so a stream that breaks mid-row resumes after the last whole
  row and reads the large row again, from one snapshot.

``read_row`` (unary, for fast point reads) answers a row larger than
:data:`UNARY_ROW_BYTES` with ``LargeRow`` instead; the client then reads that row through
``read_rows``. Whether a row is large is decided by a quick estimate (:func:`row_bytes`);
pieces are cut by one that errs on the large side per cell (:data:`CELL_OVERHEAD`).
``model``'s key and qualifier limits keep a cell's non-value part far below a piece, so only
values ever need splitting.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import fields, replace
from itertools import repeat
from operator import attrgetter
from typing import Any

from tabletstore import limits
from tabletstore.data.model import Cell, Row
from tabletstore.errors import Unavailable
from tabletstore.rpc.codec import WireForm
from tabletstore.rpc.messages import RowBatch, RowPiece

__all__ = [
    "CELL_OVERHEAD",
    "ROW_BATCH_FORM",
    "STREAM_ITEM_BYTES",
    "UNARY_ROW_BYTES",
    "RowAssembler",
    "row_bytes",
    "split_row",
]

#: Target size of one ``read_rows`` stream item (a batch of rows, or a piece of one row).
STREAM_ITEM_BYTES = limits.STREAM_ITEM_BYTES
#: Largest row ``read_row`` returns in its one reply; a larger one is streamed.
UNARY_ROW_BYTES = limits.UNARY_ROW_BYTES
#: Bytes counted per cell on top of its family, qualifier and value: at least what the codec
#: spends on one (array and type-marker headers, length headers, timestamp, labels' array).
CELL_OVERHEAD = 32


def _cell_head(cell: Cell) -> int:
    """A cell's estimated encoded size, its value excepted."""
    head = CELL_OVERHEAD + len(cell.family) + len(cell.qualifier)
    for label in cell.labels:
        head += len(label) + 2
    return head


def row_bytes(row: Row) -> int:
    """A quick estimate of ``row``'s encoded size (key, qualifiers, values, 16 bytes a cell):
    what decides whether a row travels whole or in pieces. It runs for every row read, so it
    is kept cheap; the limits it is compared with are far below a frame. A row of one cell
    (most rows of most scans) skips the generator: half the cost, measured."""
    cells = row.cells
    if len(cells) == 1:
        cell = cells[0]
        return len(row.key) + len(cell.value) + len(cell.qualifier) + 16
    return len(row.key) + sum(len(c.value) + len(c.qualifier) + 16 for c in cells)


def split_row(row: Row, budget: int = STREAM_ITEM_BYTES) -> Iterator[RowPiece]:
    """``row`` as pieces of about ``budget`` estimated bytes each, in order; the last has
    ``last`` set. A value that does not fit the rest of a piece starts a new one, and a value
    larger than a whole piece is split across pieces (``split_value``). REQUIRES: the row has
    at least one cell."""
    key = row.key
    full = budget - len(key)
    cells: list[Cell] = []
    room = full
    for cell in row.cells:
        head = _cell_head(cell)
        value = cell.value
        if cells and head + len(value) > room:
            yield RowPiece(key, tuple(cells), split_value=False, last=False)
            cells, room = [], full
        start = 0
        # Here ``cells`` is empty unless the whole cell fits: a split value starts a piece.
        while head + len(value) - start > room:
            # At least a quarter budget of value per piece, however large the cell's names
            # (within model's limits they are far smaller than that).
            take = max(room - head, budget // 4, 1)
            part = replace(cell, value=value[start : start + take])
            yield RowPiece(key, (part,), split_value=True, last=False)
            start += take
            room = full
        cells.append(cell if start == 0 else replace(cell, value=value[start:]))
        room -= head + len(value) - start
    yield RowPiece(key, tuple(cells), split_value=False, last=True)


_key = attrgetter("key")
_family = attrgetter("family")
_qualifier = attrgetter("qualifier")
_timestamp = attrgetter("timestamp")
_value = attrgetter("value")
_labels = attrgetter("labels")


def _batch_fields(batch: RowBatch) -> tuple[Any, ...]:
    """A batch column-wise: the keys, each row's cell count, then the cells' families,
    qualifiers, timestamps, values and labels (an empty array when no cell has labels)."""
    rows = batch.rows
    if len(rows) == 1 and len(rows[0].cells) == 1:  # a point read's reply: no maps
        row = rows[0]
        c = row.cells[0]
        lone = (c.labels,) if c.labels else ()
        return (row.key,), (1,), (c.family,), (c.qualifier,), (c.timestamp,), (c.value,), lone
    cells = [c for row in rows for c in row.cells]
    labels = tuple(map(_labels, cells))
    return (
        tuple(map(_key, rows)),
        tuple(len(row.cells) for row in rows),
        tuple(map(_family, cells)),
        tuple(map(_qualifier, cells)),
        tuple(map(_timestamp, cells)),
        tuple(map(_value, cells)),
        labels if any(labels) else (),
    )


# A client decoding a scan builds a Cell and a Row per value: with the frozen dataclasses'
# __init__ (one object.__setattr__ call per field) that was most of its CPU per value
# (py-spy, bench.rpc_ratio scans). Setting the slots through their descriptors builds the
# same objects in about half the time; it holds only while the classes have slots and no
# __post_init__, which _FAST_BUILD checks once (otherwise their constructors are used).
_FAST_BUILD = all(
    "__slots__" in vars(cls) and not hasattr(cls, "__post_init__") for cls in (Cell, Row)
) and [f.name for f in fields(Cell)] == ["family", "qualifier", "timestamp", "value", "labels"]
_new = object.__new__


def _setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    """The function setting slot ``name`` of a ``cls`` instance (its member descriptor's)."""
    setter: Callable[[Any, Any], None] = vars(cls)[name].__set__
    return setter


_set_family = _setter(Cell, "family")
_set_qualifier = _setter(Cell, "qualifier")
_set_timestamp = _setter(Cell, "timestamp")
_set_value = _setter(Cell, "value")
_set_labels = _setter(Cell, "labels")
_set_key = _setter(Row, "key")
_set_cells = _setter(Row, "cells")


def _new_cells(
    families: Iterable[str],
    qualifiers: Iterable[bytes],
    timestamps: Iterable[int],
    values: Iterable[bytes],
    labels: Iterable[tuple[str, ...]],
) -> list[Cell]:
    """``list(map(Cell, families, qualifiers, timestamps, values, labels))``, faster."""
    if not _FAST_BUILD:
        return list(map(Cell, families, qualifiers, timestamps, values, labels))
    cells: list[Cell] = []
    append = cells.append
    for family, qualifier, timestamp, value, label in zip(
        families, qualifiers, timestamps, values, labels, strict=True
    ):
        cell = _new(Cell)
        _set_family(cell, family)
        _set_qualifier(cell, qualifier)
        _set_timestamp(cell, timestamp)
        _set_value(cell, value)
        _set_labels(cell, label)
        append(cell)
    return cells


def _new_rows(keys: Iterable[bytes], cells: Iterable[Cell]) -> tuple[Row, ...]:
    """One row of one cell per key: ``tuple(Row(k, [c]) for k, c in zip(keys, cells))``."""
    if not _FAST_BUILD:
        return tuple(Row(k, [c]) for k, c in zip(keys, cells, strict=True))
    rows: list[Row] = []
    append = rows.append
    for key, cell in zip(keys, cells, strict=True):
        row = _new(Row)
        _set_key(row, key)
        _set_cells(row, [cell])
        append(row)
    return tuple(rows)


def _batch_from_fields(fields: tuple[Any, ...]) -> RowBatch:
    """:func:`_batch_fields` reversed; ValueError naming what does not fit together."""
    if len(fields) != 7:
        raise ValueError(f"a row batch has 7 arrays, got {len(fields)}")
    keys, counts, families, qualifiers, timestamps, values, labels = fields
    n = len(families)
    if len(counts) != len(keys) or not (len(qualifiers) == len(timestamps) == len(values) == n):
        raise ValueError(
            f"unequal arrays: {len(keys)} keys, {len(counts)} counts, {n} families, "
            f"{len(qualifiers)} qualifiers, {len(timestamps)} timestamps, {len(values)} values"
        )
    if labels and len(labels) != n:
        raise ValueError(f"{n} cells carry {len(labels)} label sets")
    cells = _new_cells(families, qualifiers, timestamps, values, labels or repeat((), n))
    if counts.count(1) == n == len(keys):  # one cell a row: the common case
        return RowBatch(_new_rows(keys, cells))
    if min(counts, default=1) < 1 or sum(counts) != n:
        raise ValueError(f"cell counts {counts[:8]}... do not add up to {n} cells")
    rows = []
    start = 0
    for key, count in zip(keys, counts, strict=True):
        rows.append(Row(key, cells[start : start + count]))
        start += count
    return RowBatch(tuple(rows))


#: How a ``RowBatch`` crosses the wire (``rpc.wire`` registers it with this form).
ROW_BATCH_FORM = WireForm(_batch_fields, _batch_from_fields)


class RowAssembler:
    """Turns the items of one ``read_rows`` stream back into whole rows.

    ``rows(item)`` returns the rows an item completes: a batch's rows, nothing for a piece
    that is not a row's last, the whole row for its last piece. Call ``finish()`` when the
    stream ends. A stream that breaks the piece rules (module docstring) raises Unavailable.
    """

    __slots__ = ("_cells", "_key", "_open", "_parts", "_source")

    def __init__(self, source: str = "worker") -> None:
        self._source = source
        self._key: bytes | None = None
        self._cells: list[Cell] = []
        #: The cell whose value continues in the next piece, and its value's parts so far.
        self._open: Cell | None = None
        self._parts: list[bytes] = []

    def rows(self, item: object) -> Sequence[Row]:
        if type(item) is RowBatch:
            if self._key is not None:
                raise self._broken("a batch of rows arrived inside a row sent in pieces")
            return item.rows
        if type(item) is RowPiece:
            return self._add(item)
        raise self._broken(f"unexpected stream item {type(item).__name__}")

    def finish(self) -> None:
        """The stream ended: it must not have ended inside a row."""
        if self._key is not None:
            raise self._broken(f"the stream ended inside row {self._key[:64]!r}")

    def _add(self, piece: RowPiece) -> Sequence[Row]:
        if self._key is None:
            self._key = piece.key
        elif piece.key != self._key:
            raise self._broken(
                f"a piece of row {piece.key[:64]!r} arrived inside row {self._key[:64]!r}"
            )
        cells = piece.cells
        if not cells:
            raise self._broken(f"an empty piece of row {piece.key[:64]!r}")
        if self._open is not None:
            first, opened = cells[0], self._open
            if (first.family, first.qualifier, first.timestamp) != (
                opened.family,
                opened.qualifier,
                opened.timestamp,
            ):
                raise self._broken(f"a split value of row {piece.key[:64]!r} does not continue")
            self._parts.append(first.value)
            cells = cells[1:]
            if cells or not piece.split_value:
                self._close_value()
        if piece.split_value and cells:
            self._cells.extend(cells[:-1])
            self._open, self._parts = cells[-1], [cells[-1].value]
        else:
            self._cells.extend(cells)
        if not piece.last:
            return ()
        if self._open is not None:
            raise self._broken(f"the last piece of row {piece.key[:64]!r} splits a value")
        row = Row(self._key, self._cells)
        self._key, self._cells = None, []
        return (row,)

    def _close_value(self) -> None:
        assert self._open is not None
        self._cells.append(replace(self._open, value=b"".join(self._parts)))
        self._open, self._parts = None, []

    def _broken(self, what: str) -> Unavailable:
        return Unavailable(f"protocol error in a row stream from {self._source}: {what}")
