"""Aggregate column families: value types, their states, and how states combine (§2 data
model, extended with Cloud Bigtable's aggregates).

A family may declare a value type (``ColumnFamily.value_type``): ``sum``, ``min`` or ``max``
of 64-bit signed integers, or ``hll`` (a HyperLogLog++ distinct count of byte strings,
:mod:`tabletstore.data.hll`). Its cells are then *aggregate* cells, written only by
:class:`~tabletstore.data.model.AddToCell` (an input: an integer, or a byte string for
``hll``) and :class:`~tabletstore.data.model.MergeToCell` (a state, as a read returns it).
Every write to one (row, family, qualifier, timestamp) -- a *bucket* -- is combined into one
cell, as Cloud Bigtable documents: a sum adds, min and max keep the extreme, hll unions.

States as reads return them (Cloud Bigtable's encodings for Int64): ``sum``/``min``/``max``
an 8-byte big-endian two's-complement integer; ``hll`` the sketch serialization of
:mod:`tabletstore.data.hll`. Sums wrap around at 64 bits, like ``IncrementValue``.

Each aggregation is commutative, associative and (except for ``sum``) idempotent, so the
engine may combine parts of a bucket in any grouping; what it must never do is combine one
write twice (see ``keys.py`` and ``engine/log_replay.py`` on replay).
"""

from __future__ import annotations

import struct
from typing import Literal

from tabletstore.data import hll
from tabletstore.keys import CellKind

__all__ = [
    "VALUE_TYPES",
    "ValueType",
    "combine",
    "input_state",
    "kind_of",
    "validate_state",
]

ValueType = Literal["sum", "min", "max", "hll"]
#: The value types a family may declare.
VALUE_TYPES: tuple[ValueType, ...] = ("sum", "min", "max", "hll")

_KIND: dict[str, int] = {
    "sum": int(CellKind.AGGREGATE_SUM),
    "min": int(CellKind.AGGREGATE_MIN),
    "max": int(CellKind.AGGREGATE_MAX),
    "hll": int(CellKind.AGGREGATE_HLL),
}
_INT64 = struct.Struct(">q")
_SUM = int(CellKind.AGGREGATE_SUM)
_MIN = int(CellKind.AGGREGATE_MIN)
_MAX = int(CellKind.AGGREGATE_MAX)
_HLL = int(CellKind.AGGREGATE_HLL)


def kind_of(value_type: str) -> int:
    """The cell kind that stores parts of a family of ``value_type``."""
    return _KIND[value_type]


def _wrap(n: int) -> int:
    return (n + 2**63) % 2**64 - 2**63


def input_state(value_type: str, value: int | bytes) -> bytes:
    """The state of one ``AddToCell`` input. ValueError naming the problem for a bad input."""
    if value_type == "hll":
        if not isinstance(value, bytes):
            raise ValueError(f"an hll family adds byte strings, not {type(value).__name__}")
        return hll.add_values([value])
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"a {value_type} family adds 64-bit integers, not {type(value).__name__}")
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"{value} does not fit in a signed 64-bit integer")
    return _INT64.pack(value)


def validate_state(value_type: str, state: bytes) -> None:
    """ValueError unless ``state`` is a state of ``value_type`` (a ``MergeToCell`` input)."""
    if not isinstance(state, bytes):
        raise ValueError(f"an aggregate state is bytes, not {type(state).__name__}")
    if value_type == "hll":
        sketch = hll.parse(state)
        if sketch.precision != hll.PRECISION:
            raise ValueError(f"an hll state has precision {hll.PRECISION}, not {sketch.precision}")
        return
    if len(state) != 8:
        raise ValueError(
            f"a {value_type} state is an 8-byte big-endian integer, not {len(state)} bytes"
        )


def combine(kind: int, newer: bytes, older: bytes) -> bytes:
    """The state of a bucket holding both states (``kind``: an aggregate cell kind)."""
    if kind == _HLL:
        return hll.merge_states(newer, older)
    (a,) = _INT64.unpack(newer)
    (b,) = _INT64.unpack(older)
    if kind == _SUM:
        return _INT64.pack(_wrap(a + b))
    if kind == _MIN:
        return newer if a <= b else older
    if kind == _MAX:
        return newer if a >= b else older
    raise ValueError(f"cell kind {kind} is not an aggregate kind")
