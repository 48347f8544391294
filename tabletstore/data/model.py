"""User-facing values of the data model (§2) and API (§3): mutations, cells, rows, queries.

These are plain frozen dataclasses: cheap to build in hot paths, easy to put on the wire.
Filters live in :mod:`tabletstore.data.filters`.

A :class:`RowMutation` is applied atomically (§2: "every read or write of data under a single
row key is atomic"). Its mutations apply in order, so ``[SetCell(...), DeleteRow()]`` leaves
nothing and ``[DeleteRow(), SetCell(...)]`` leaves the new cell.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "MAX_MUTATION_BYTES",
    "MAX_QUALIFIER",
    "MAX_ROW_KEY",
    "MAX_VALUE",
    "AddToCell",
    "AppendValue",
    "Cell",
    "DeleteCells",
    "DeleteFamily",
    "DeleteRow",
    "IncrementValue",
    "MergeToCell",
    "Mutation",
    "ReadModifyWriteRule",
    "Row",
    "RowMutation",
    "SetCell",
]

# The size limits of what a write may carry are stated once, in ``tabletstore.limits`` (with the
# request and frame limits derived from them), and re-exported here for the data model's users.
# ``validation.validate_row_mutation`` enforces them on client and server; reads stream rows of
# any size in bounded pieces (``rpc.row_pieces``), so no read is limited by a frame.
from tabletstore.limits import MAX_MUTATION_BYTES, MAX_QUALIFIER, MAX_ROW_KEY, MAX_VALUE


@dataclass(frozen=True, slots=True)
class SetCell:
    """Write ``value`` at family:qualifier. ``timestamp`` in microseconds; None = server time."""

    family: str
    qualifier: bytes
    value: bytes
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteCells:
    """Delete the versions of family:qualifier with ``start <= ts < end`` (None = unbounded)."""

    family: str
    qualifier: bytes
    start: int | None = None
    end: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteFamily:
    """Delete every cell of a family in the row."""

    family: str


@dataclass(frozen=True, slots=True)
class DeleteRow:
    """Delete every cell of the row."""


@dataclass(frozen=True, slots=True)
class AddToCell:
    """Add an input to the aggregate cell family:qualifier at ``timestamp`` (a family with a
    value type, ``data.aggregates``): an int for sum/min/max, bytes for hll. ``timestamp`` in
    microseconds names the bucket; None = server time."""

    family: str
    qualifier: bytes
    value: int | bytes
    timestamp: int | None = None


@dataclass(frozen=True, slots=True)
class MergeToCell:
    """Merge a state (as a read of an aggregate cell returns it) into family:qualifier at
    ``timestamp`` (None = server time)."""

    family: str
    qualifier: bytes
    value: bytes
    timestamp: int | None = None


Mutation = SetCell | DeleteCells | DeleteFamily | DeleteRow | AddToCell | MergeToCell


@dataclass(frozen=True, slots=True)
class RowMutation:
    """Mutations of one row, applied atomically and in order."""

    row: bytes
    mutations: tuple[Mutation, ...]


@dataclass(frozen=True, slots=True)
class Cell:
    """One version of one column as a read returns it."""

    family: str
    qualifier: bytes
    timestamp: int
    value: bytes
    labels: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Row:
    """A row as a read returns it: cells sorted by family, qualifier, timestamp descending."""

    key: bytes
    cells: list[Cell] = field(default_factory=list)

    def cells_of(self, family: str, qualifier: bytes | None = None) -> list[Cell]:
        """The cells of a family (and qualifier), newest first."""
        return [
            c
            for c in self.cells
            if c.family == family and (qualifier is None or c.qualifier == qualifier)
        ]

    def latest(self, family: str, qualifier: bytes) -> bytes | None:
        """The newest value of family:qualifier, or None."""
        for c in self.cells:
            if c.family == family and c.qualifier == qualifier:
                return c.value
        return None

    def to_dict(self) -> dict[str, dict[bytes, list[tuple[int, bytes]]]]:
        """``{family: {qualifier: [(timestamp, value), ...]}}``, newest first."""
        out: dict[str, dict[bytes, list[tuple[int, bytes]]]] = {}
        for c in self.cells:
            out.setdefault(c.family, {}).setdefault(c.qualifier, []).append((c.timestamp, c.value))
        return out


@dataclass(frozen=True, slots=True)
class AppendValue:
    """Read-modify-write: append ``value`` to the newest value of family:qualifier (§3)."""

    family: str
    qualifier: bytes
    value: bytes


@dataclass(frozen=True, slots=True)
class IncrementValue:
    """Read-modify-write: add ``amount`` to a 64-bit big-endian signed counter (§3).

    A missing cell counts as 0; an existing value that is not 8 bytes is an InvalidArgument.
    """

    family: str
    qualifier: bytes
    amount: int


ReadModifyWriteRule = AppendValue | IncrementValue
