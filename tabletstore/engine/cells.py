"""Turning a row's mutations into the engine's cells (§2, §3): sequence numbers and timestamps
assigned, deletions as deletion entries; and the read-modify-write rules' arithmetic."""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence

from tabletstore.data import aggregates
from tabletstore.data.model import (
    MAX_VALUE,
    AddToCell,
    AppendValue,
    DeleteCells,
    DeleteFamily,
    MergeToCell,
    Mutation,
    ReadModifyWriteRule,
    SetCell,
)
from tabletstore.errors import InvalidArgument
from tabletstore.keys import TS_MAX, Cell, CellKind, encode_ts_range

__all__ = ["apply_rmw_rule", "to_cells"]

#: A counter: a 64-bit big-endian two's-complement integer (§3 read-modify-write).
_COUNTER = struct.Struct(">q")
# Cell kinds as plain ints (a CellKind member is a GC-tracked object; engine/memtable.py).
_PUT = int(CellKind.PUT)
_DELETE_COLUMN = int(CellKind.DELETE_COLUMN)
_DELETE_FAMILY = int(CellKind.DELETE_FAMILY)
_DELETE_ROW = int(CellKind.DELETE_ROW)


def apply_rmw_rule(rule: ReadModifyWriteRule, current: bytes | None) -> bytes:
    """The new value a rule writes given the column's newest value (None if absent)."""
    if isinstance(rule, AppendValue):
        size = len(current or b"") + len(rule.value)
        if size > MAX_VALUE:
            raise InvalidArgument(
                f"appending to {rule.family}:{rule.qualifier[:64]!r} would make its value "
                f"{size} bytes; the limit is {MAX_VALUE}"
            )
        return (current or b"") + rule.value
    if current is None or current == b"":
        base = 0
    elif len(current) != 8:
        raise InvalidArgument(
            f"cannot increment {rule.family}:{rule.qualifier!r}: its value is {len(current)} "
            "bytes, not a 64-bit big-endian integer"
        )
    else:
        (base,) = _COUNTER.unpack(current)
    total = base + rule.amount
    # Wrap like a two's-complement 64-bit counter (Cloud Bigtable's behaviour).
    total = (total + 2**63) % 2**64 - 2**63
    return _COUNTER.pack(total)


def to_cells(
    row: bytes,
    mutations: Sequence[Mutation],
    first_seq: int,
    now_micros: int,
    value_types: Mapping[str, str | None] | None = None,
) -> list[Cell]:
    """Engine cells for an already validated row mutation; mutation i gets ``first_seq + i``.
    ``value_types`` maps aggregate families to their value type (AddToCell, MergeToCell)."""
    cells: list[Cell] = []
    seq = first_seq
    for m in mutations:
        if isinstance(m, SetCell):
            ts = now_micros if m.timestamp is None else m.timestamp
            cells.append(Cell(row, m.family, m.qualifier, ts, seq, _PUT, m.value))
        elif isinstance(m, AddToCell | MergeToCell):
            value_type = (value_types or {}).get(m.family)
            if value_type is None:
                raise InvalidArgument(f"column family {m.family!r} is not an aggregate family")
            ts = now_micros if m.timestamp is None else m.timestamp
            state = (
                aggregates.input_state(value_type, m.value)
                if isinstance(m, AddToCell)
                else bytes(m.value)
            )
            kind = aggregates.kind_of(value_type)
            cells.append(Cell(row, m.family, m.qualifier, ts, seq, kind, state))
        elif isinstance(m, DeleteCells):
            start = 0 if m.start is None else m.start
            end = TS_MAX if m.end is None else m.end
            value = encode_ts_range(start, end)
            cells.append(Cell(row, m.family, m.qualifier, TS_MAX, seq, _DELETE_COLUMN, value))
        elif isinstance(m, DeleteFamily):
            cells.append(Cell(row, m.family, b"", TS_MAX, seq, _DELETE_FAMILY, b""))
        else:
            cells.append(Cell(row, "", b"", TS_MAX, seq, _DELETE_ROW, b""))
        seq += 1
    return cells
