"""Cells as the engine stores them, and the one order they sort in (§2, §4, §5.3).

A Bigtable cell is addressed by (row, family:qualifier, timestamp) (§2). The engine adds two
things to every stored cell:

* ``seq`` — the sequence number the tablet server assigned when the mutation was applied. It
  decides which of two entries is newer when their timestamps do not (a rewrite of the same
  version; a delete followed by a write with an older client timestamp).
* ``kind`` — a put, or one of the deletion entries the paper's compactions drop (§5.4).

Sort order (the order of memtables, SSTables and log replays)::

    row asc, family asc, qualifier asc, ts desc, seq desc

Deletion entries are stored so that they sort *before* every cell they can mask:

=================  ========  ==========  ============  ==============================
kind               family    qualifier   ts            value
=================  ========  ==========  ============  ==============================
PUT                family    qualifier   timestamp     the value
AGGREGATE_*        family    qualifier   timestamp     an aggregate state (see below)
DELETE_COLUMN      family    qualifier   ``TS_MAX``    ``encode_ts_range(start, end)``
DELETE_FAMILY      family    ``b""``     ``TS_MAX``    ``b""``
DELETE_ROW         ``""``    ``b""``     ``TS_MAX``    ``b""``
=================  ========  ==========  ============  ==============================

A deletion entry masks the cells in its scope whose ``seq`` is *smaller* than its own and, for
DELETE_COLUMN, whose timestamp lies in ``[start, end)``. Deleting one version is a
DELETE_COLUMN over ``[ts, ts + 1)``. Put timestamps are limited to ``[0, TS_MAX)`` so no put can
sort before a deletion entry of its scope. Family names are never empty, so DELETE_ROW's ``""``
sorts before every family of the row.

Aggregate cells (kinds 4-7, ``data.aggregates``) are parts of the one cell Cloud Bigtable shows
per (row, family, qualifier, timestamp) of an aggregate family: every part of that bucket that
no deletion entry masks is combined into one value by reads and compactions (and by the
memtable as it takes writes). A part's ``seq`` is the largest seq of the writes folded into it,
and masking compares that seq, so parts are never combined across a deletion entry.
"""

from __future__ import annotations

import struct
from enum import IntEnum
from typing import NamedTuple

__all__ = [
    "AGGREGATE_KINDS",
    "TS_MAX",
    "Cell",
    "CellFields",
    "CellKind",
    "cell_sort_key",
    "decode_ts_range",
    "encode_ts_range",
]

#: Largest timestamp; reserved for deletion entries (puts use [0, TS_MAX)).
TS_MAX = (1 << 63) - 1

_RANGE = struct.Struct(">qq")


class CellKind(IntEnum):
    """What a stored entry is. The values are part of the SSTable and commit-log formats."""

    PUT = 0
    DELETE_COLUMN = 1
    DELETE_FAMILY = 2
    DELETE_ROW = 3
    #: Parts of an aggregate cell (a family with a ``value_type``); the kind names the
    #: aggregation, so cells combine without the schema (``data.aggregates``).
    AGGREGATE_SUM = 4
    AGGREGATE_MIN = 5
    AGGREGATE_MAX = 6
    AGGREGATE_HLL = 7


#: The kinds of aggregate cells.
AGGREGATE_KINDS = frozenset(
    {CellKind.AGGREGATE_SUM, CellKind.AGGREGATE_MIN, CellKind.AGGREGATE_MAX, CellKind.AGGREGATE_HLL}
)


class Cell(NamedTuple):
    """One stored entry: a value or a deletion entry (see the module docstring)."""

    row: bytes
    family: str
    qualifier: bytes
    ts: int
    seq: int
    kind: int
    value: bytes


#: A cell's seven fields as a plain tuple, in :class:`Cell`'s order (a Cell is one too): what a
#: memtable holds and the minor compaction writes without making Cells (engine/memtable.py).
CellFields = tuple[bytes, str, bytes, int, int, int, bytes]


def cell_sort_key(cell: CellFields) -> tuple[bytes, str, bytes, int, int]:
    """The engine's total order: row, family, qualifier ascending; ts, seq descending."""
    return (cell[0], cell[1], cell[2], -cell[3], -cell[4])


def encode_ts_range(start: int, end: int) -> bytes:
    """The value of a DELETE_COLUMN entry: the half-open timestamp range it deletes."""
    return _RANGE.pack(start, end)


def decode_ts_range(value: bytes) -> tuple[int, int]:
    """Inverse of :func:`encode_ts_range`."""
    start, end = _RANGE.unpack(value)
    return int(start), int(end)
