"""Server-side row filters: Cloud Bigtable's RowFilter set, evaluated inside the tablet server.

§3 of the paper: clients select rows, columns and timestamps, and the selection runs where the
data lives, so only matching cells cross the wire. This module owns the filter language -- one
frozen value object per Cloud Bigtable ``RowFilter`` kind (``google.bigtable.v2.RowFilter`` in
``data.proto``) -- its validation, its JSON-safe wire form and its pure evaluator::

    apply_filter(f, row_key, cells, *, rng=None) -> list[Cell]

``cells`` are one row's *visible* cells (after deletions and garbage collection), sorted by family
asc, qualifier asc, timestamp desc; the output is in the same order, with ``ApplyLabel`` labels
added. Every filter maps its sorted input to a sorted output, so composition preserves the order.

Semantics (as documented for Cloud Bigtable; where the emulator differs, the documentation wins):

* Regex filters are RE2 full matches over raw bytes, evaluated by RE2 itself
  (:mod:`tabletstore.data.regex`): ``.`` does not match ``\\n``; use ``\\C`` for any byte.
  ``FamilyNameRegex`` may not contain ``:``. RE2 never backtracks, but its worst case is still
  bytes matched times program size: :func:`regex_cost` gives a filter's factor so the caller can
  keep big rows off its event loop.
* ``Chain`` feeds each filter's output to the next. ``Interleave`` gives every branch the same
  input and merges the outputs in row order *keeping duplicates*: a cell output by two branches
  appears twice (ties keep branch order). ``Chain([])`` passes everything, ``Interleave([])``
  outputs nothing, and a one-element ``Chain``/``Interleave`` is its element -- exactly what the
  official Java client sends (the server itself rejects fewer than two sub-filters, so the
  official clients unwrap them; so do we, by evaluating them as such).
* ``Condition(predicate, true_filter, false_filter)``: if the predicate outputs any cell of the
  row's input, ``true_filter`` is applied to that *input*, else ``false_filter``; the predicate's
  own output is discarded. A missing branch outputs nothing.
* ``Sink`` copies its input straight to the final result of the read, bypassing every filter
  after it, and outputs nothing to its parent. It may not appear inside a ``Condition``. A
  top-level ``Sink`` therefore returns the whole row.
* ``CellsPerRowOffset``/``CellsPerRowLimit`` count cells in row order and
  ``CellsPerColumnLimit`` counts per (family, qualifier), each duplicate copy separately.
  Limits must be > 0 and the offset >= 0 (as the service checks).
* ``TimestampRange`` is ``[start, end)`` in microseconds; 0/None are unbounded. Cloud Bigtable
  tables use millisecond granularity and reject finer filter bounds; tabletstore keeps
  microseconds, so any bound is accepted.
* ``ApplyLabel`` labels must match ``[a-z0-9-]+`` and be at most 15 characters. A cell may carry
  only one label, so a ``Chain`` may contain at most one sub-filter that can apply a label (an
  ``Interleave`` may contain many: they label separate copies). ``RowSample`` needs
  ``0 < p < 1``. Every violation is :class:`InvalidArgument`, raised when the filter is built.

A filter's cost is bounded before it runs, so that no request can stall a tablet server's event
loop (and with it the lease that keeps the server alive, §5.2) or fill its memory. When a filter
is built, each composite adds up its parts and refuses, naming the limit and its value, more
than :data:`MAX_FILTER_DEPTH` levels of nesting, :data:`MAX_FILTER_NODES` filters in all,
:data:`MAX_FILTER_REGEXES` regexes, :data:`MAX_FILTER_REGEX_BYTES` bytes of patterns, more than
:data:`MAX_FILTER_COPIES` copies of one input cell (each ``Interleave`` multiplies what a
``Chain`` feeds on: twenty two-branch interleaves in a chain would make a million copies), or
more than :data:`MAX_FILTER_CELL_WORK` filter steps per input cell. Patterns are compiled
afterwards, by :func:`compile_filter` (RE2, through a shared cache): their programs may total
at most :data:`MAX_FILTER_PROGRAM` instructions, which bounds both the time compiling takes
and the regex work per byte matched (:func:`regex_cost`). :func:`uncompiled` tells a server
whether anything is left to compile, so that it compiles off its event loop only when needed;
:func:`apply_filter` compiles whatever is left itself. An invalid pattern is therefore refused
when the filter is compiled (a server does it before reading anything), not when it is built.

Checked against Google's ``cbtemulator`` (through the google-cloud-bigtable 2.50 client), which
agreed on: Interleave keeping duplicates and labelling separate copies; ``CellsPerColumnLimit``
and ``CellsPerRowLimit`` counting each duplicate copy; Condition chosen per row on its input,
with an absent branch outputting nothing and predicate labels discarded; ColumnRange, ValueRange
and TimestampRange bounds; StripValue; ``.`` versus ``\\C`` on newlines and raw ``\\xff`` pattern
bytes; and the validity checks on limits (> 0), offset (>= 0), ``RowSample`` (0 < p < 1) and
label syntax. Where the emulator departs from data.proto we follow data.proto: the emulator
passes a Sink's input on to the parent (so in the documented example the sinked ``A:A`` copy is
lost, and ``Chain([Sink(), BlockAll()])`` returns nothing), accepts two labels in a Chain (the
last wins), a Sink inside a Condition, and ``:`` in a family regex. It also orders a row's
families arbitrarily, so row-level limits there pick different cells; here families are in
name order.
"""

from __future__ import annotations

import base64
import heapq
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from tabletstore.clock import Random
from tabletstore.data.model import Cell
from tabletstore.data.regex import Pattern, cached, compile_re2, program_size
from tabletstore.errors import InvalidArgument

__all__ = [
    "MAX_FILTER_CELL_WORK",
    "MAX_FILTER_COPIES",
    "MAX_FILTER_DEPTH",
    "MAX_FILTER_NODES",
    "MAX_FILTER_PROGRAM",
    "MAX_FILTER_REGEXES",
    "MAX_FILTER_REGEX_BYTES",
    "ApplyLabel",
    "BlockAll",
    "CellsPerColumnLimit",
    "CellsPerRowLimit",
    "CellsPerRowOffset",
    "Chain",
    "ColumnQualifierRegex",
    "ColumnRange",
    "Condition",
    "FamilyNameRegex",
    "Interleave",
    "PartsBudget",
    "PassAll",
    "RowFilter",
    "RowKeyRegex",
    "RowSample",
    "Sink",
    "StripValue",
    "TimestampRange",
    "ValueRange",
    "ValueRegex",
    "apply_filter",
    "b64_text",
    "charge_part",
    "check_mapping",
    "compile_filter",
    "filter_from_dict",
    "iter_filters",
    "regex_cost",
    "text_b64",
    "uncompiled",
]

#: Deepest nesting of Chain/Interleave/Condition the service accepts.
MAX_FILTER_DEPTH = 20
#: Filters in one filter, composites and leaves alike.
MAX_FILTER_NODES = 1000
#: Regex filters in one filter.
MAX_FILTER_REGEXES = 64
#: Bytes of regex patterns in one filter, all patterns together (and so each one).
MAX_FILTER_REGEX_BYTES = 64 * 1024
#: RE2 program instructions of one filter's patterns together: compiling them takes about a
#: microsecond per instruction (one pattern at a time, each bounded by ``regex.MAX_MEM``), and
#: matching costs at most this many steps per byte.
MAX_FILTER_PROGRAM = 100_000
#: Copies of one input cell a filter may output (``Interleave`` keeps duplicates).
MAX_FILTER_COPIES = 64
#: Filter steps one input cell may cost: each filter applied to each copy reaching it.
MAX_FILTER_CELL_WORK = 4096
_INT32_MAX = 2**31 - 1
_LABEL = re.compile(r"[a-z0-9\-]{1,15}")


# -- validation helpers ------------------------------------------------------------------------
def _require_bytes(name: str, value: object) -> None:
    if not isinstance(value, bytes):
        raise InvalidArgument(f"{name} must be bytes, got {type(value).__name__}")


def _require_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{name} must be an int, got {type(value).__name__}")
    if not minimum <= value <= _INT32_MAX:
        raise InvalidArgument(f"{name} must be in [{minimum}, {_INT32_MAX}], got {value}")


def _check_pattern(name: str, pattern: bytes) -> None:
    _require_bytes(name, pattern)
    if len(pattern) > MAX_FILTER_REGEX_BYTES:
        raise InvalidArgument(
            f"{name}: a pattern of {len(pattern)} bytes is over the limit of "
            f"MAX_FILTER_REGEX_BYTES={MAX_FILTER_REGEX_BYTES}"
        )


def _compile(name: str, pattern: bytes) -> Pattern:
    try:
        return compile_re2(pattern)
    except InvalidArgument as exc:
        raise type(exc)(f"{name}: {exc}") from None


def _set(obj: object, name: str, value: object) -> None:
    """Assign a derived attribute of a frozen dataclass (only ever from ``__post_init__``)."""
    object.__setattr__(obj, name, value)


# -- the filter classes ------------------------------------------------------------------------
class RowFilter:
    """Base of every filter. Subclasses are frozen dataclasses; build them, never mutate them."""

    __slots__ = ()
    #: The key of this filter in its wire dict (the proto oneof field, shortened).
    kind: ClassVar[str]

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe wire form: ``{kind: argument}``; bytes are base64 strings."""
        return {self.kind: self._argument()}

    def _argument(self) -> Any:
        return True

    # Derived properties used by the composition rules and the cost limits.
    @property
    def depth(self) -> int:
        """Nesting depth: 0 for a leaf, 1 + the deepest child for a composite."""
        return 0

    @property
    def shape(self) -> Shape:
        """What this filter costs: its size, its regexes, its copies and work per cell."""
        return _LEAF

    @property
    def may_label(self) -> bool:
        """True if cells leaving this filter may carry a label it applied."""
        return False

    @property
    def has_sink(self) -> bool:
        """True if a Sink appears anywhere inside this filter."""
        return False


@dataclass(frozen=True, slots=True)
class Shape:
    """The measures of a filter that its cost limits apply to (composites add them up)."""

    nodes: int = 1
    regexes: int = 0
    regex_bytes: int = 0
    #: Copies of one input cell the filter may output.
    copies: int = 1
    #: Filter steps one input cell may cost (each filter applied to each copy that reaches it).
    work: int = 1


_LEAF = Shape()
_NO_OUTPUT = Shape(copies=0)


def _regex_shape(pattern: bytes) -> Shape:
    return Shape(regexes=1, regex_bytes=len(pattern))


def _over(name: str, what: str, value: int, limit_name: str, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"{name}: the filter has {value} {what}, over the limit of {limit_name}={limit}"
    )


def _checked(name: str, shape: Shape) -> Shape:
    """``shape`` if it is within every limit; else InvalidArgument naming the limit."""
    for what, value, limit_name, limit in (
        ("filters", shape.nodes, "MAX_FILTER_NODES", MAX_FILTER_NODES),
        ("regexes", shape.regexes, "MAX_FILTER_REGEXES", MAX_FILTER_REGEXES),
        (
            "bytes of regex patterns",
            shape.regex_bytes,
            "MAX_FILTER_REGEX_BYTES",
            MAX_FILTER_REGEX_BYTES,
        ),
        ("copies of an input cell", shape.copies, "MAX_FILTER_COPIES", MAX_FILTER_COPIES),
        ("filter steps per input cell", shape.work, "MAX_FILTER_CELL_WORK", MAX_FILTER_CELL_WORK),
    ):
        if value > limit:
            raise _over(name, what, value, limit_name, limit)
    return shape


def _sum_parts(children: Iterable[RowFilter | None]) -> tuple[int, int, int]:
    nodes = regexes = regex_bytes = 0
    for c in children:
        if c is not None:
            s = c.shape
            nodes += s.nodes
            regexes += s.regexes
            regex_bytes += s.regex_bytes
    return 1 + nodes, regexes, regex_bytes


def _chain_shape(children: Sequence[RowFilter]) -> Shape:
    # Each filter of a chain sees the copies the filters before it made.
    nodes, regexes, regex_bytes = _sum_parts(children)
    copies, work = 1, 1
    for c in children:
        s = c.shape
        work += copies * s.work
        # Capped so that a huge product is refused by the check, not computed without end.
        copies = min(copies * s.copies, MAX_FILTER_COPIES + 1)
        work = min(work, MAX_FILTER_CELL_WORK + 1)
    return _checked("chain", Shape(nodes, regexes, regex_bytes, copies, work))


def _interleave_shape(children: Sequence[RowFilter]) -> Shape:
    # Every branch sees the input; the outputs are merged, each copy once more.
    nodes, regexes, regex_bytes = _sum_parts(children)
    copies = sum(c.shape.copies for c in children)
    work = 1 + sum(c.shape.work for c in children) + copies
    return _checked("interleave", Shape(nodes, regexes, regex_bytes, copies, work))


def _condition_shape(
    predicate: RowFilter, true_filter: RowFilter | None, false_filter: RowFilter | None
) -> Shape:
    nodes, regexes, regex_bytes = _sum_parts((predicate, true_filter, false_filter))
    branches = [b.shape for b in (true_filter, false_filter) if b is not None]
    copies = max((b.copies for b in branches), default=0)
    work = 1 + predicate.shape.work + max((b.work for b in branches), default=0)
    return _checked("condition", Shape(nodes, regexes, regex_bytes, copies, work))


@dataclass(frozen=True, slots=True)
class PassAll(RowFilter):
    """Outputs every input cell."""

    kind: ClassVar[str] = "pass_all"


@dataclass(frozen=True, slots=True)
class BlockAll(RowFilter):
    """Outputs nothing."""

    kind: ClassVar[str] = "block_all"

    @property
    def shape(self) -> Shape:
        return _NO_OUTPUT


@dataclass(frozen=True, slots=True)
class Sink(RowFilter):
    """Copies its input to the final result, bypassing later filters; outputs nothing."""

    kind: ClassVar[str] = "sink"

    @property
    def shape(self) -> Shape:
        return _NO_OUTPUT  # its input goes to the result, not on through the filter

    @property
    def has_sink(self) -> bool:
        return True


@dataclass(frozen=True, slots=True)
class StripValue(RowFilter):
    """Replaces every value with ``b""``."""

    kind: ClassVar[str] = "strip_value"


@dataclass(frozen=True, slots=True)
class ApplyLabel(RowFilter):
    """Adds ``label`` (``[a-z0-9-]{1,15}``) to every cell."""

    label: str
    kind: ClassVar[str] = "apply_label"

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not _LABEL.fullmatch(self.label):
            raise InvalidArgument(
                f"apply_label: label must match [a-z0-9-]+ and be at most 15 characters, "
                f"got {self.label!r}"
            )

    def _argument(self) -> Any:
        return self.label

    @property
    def may_label(self) -> bool:
        return True


def _composite_depth(children: Iterable[RowFilter | None]) -> int:
    depth = 1 + max((c.depth for c in children if c is not None), default=0)
    if depth > MAX_FILTER_DEPTH:
        raise InvalidArgument(f"filters may be nested at most {MAX_FILTER_DEPTH} levels deep")
    return depth


def _check_children(name: str, children: Sequence[object]) -> None:
    for child in children:
        if not isinstance(child, RowFilter):
            raise InvalidArgument(f"{name}: sub-filters must be filters, got {child!r}")


@dataclass(frozen=True, slots=True)
class Chain(RowFilter):
    """Applies ``filters`` in sequence, each to the previous one's output."""

    filters: Sequence[RowFilter]
    _depth: int = field(init=False, repr=False, compare=False)
    _shape: Shape = field(init=False, repr=False, compare=False)
    kind: ClassVar[str] = "chain"

    def __post_init__(self) -> None:
        _set(self, "filters", tuple(self.filters))
        _check_children("chain", self.filters)
        if sum(1 for f in self.filters if f.may_label) > 1:
            raise InvalidArgument(
                "chain: at most one sub-filter may apply a label (a cell can carry one label)"
            )
        _set(self, "_depth", _composite_depth(self.filters))
        _set(self, "_shape", _chain_shape(self.filters))

    def _argument(self) -> Any:
        return [f.to_dict() for f in self.filters]

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def may_label(self) -> bool:
        return any(f.may_label for f in self.filters)

    @property
    def has_sink(self) -> bool:
        return any(f.has_sink for f in self.filters)


@dataclass(frozen=True, slots=True)
class Interleave(RowFilter):
    """Applies every filter to the same input; outputs all their cells merged, duplicates kept."""

    filters: Sequence[RowFilter]
    _depth: int = field(init=False, repr=False, compare=False)
    _shape: Shape = field(init=False, repr=False, compare=False)
    kind: ClassVar[str] = "interleave"

    def __post_init__(self) -> None:
        _set(self, "filters", tuple(self.filters))
        _check_children("interleave", self.filters)
        _set(self, "_depth", _composite_depth(self.filters))
        _set(self, "_shape", _interleave_shape(self.filters))

    def _argument(self) -> Any:
        return [f.to_dict() for f in self.filters]

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def may_label(self) -> bool:
        return any(f.may_label for f in self.filters)

    @property
    def has_sink(self) -> bool:
        return any(f.has_sink for f in self.filters)


@dataclass(frozen=True, slots=True)
class Condition(RowFilter):
    """``true_filter(input)`` if ``predicate(input)`` outputs any cell, else ``false_filter(input)``.

    A missing branch (None) outputs nothing. No Sink may appear anywhere inside.
    """

    predicate: RowFilter
    true_filter: RowFilter | None = None
    false_filter: RowFilter | None = None
    _depth: int = field(init=False, repr=False, compare=False)
    _shape: Shape = field(init=False, repr=False, compare=False)
    kind: ClassVar[str] = "condition"

    def __post_init__(self) -> None:
        children = [self.predicate, self.true_filter, self.false_filter]
        _check_children("condition", [c for c in children if c is not None])
        if any(c is not None and c.has_sink for c in children):
            raise InvalidArgument("condition: a Sink cannot be used inside a Condition")
        _set(self, "_depth", _composite_depth(children))
        _set(self, "_shape", _condition_shape(self.predicate, self.true_filter, self.false_filter))

    def _argument(self) -> Any:
        out: dict[str, Any] = {"predicate": self.predicate.to_dict()}
        if self.true_filter is not None:
            out["true"] = self.true_filter.to_dict()
        if self.false_filter is not None:
            out["false"] = self.false_filter.to_dict()
        return out

    @property
    def depth(self) -> int:
        return self._depth

    @property
    def shape(self) -> Shape:
        return self._shape

    @property
    def may_label(self) -> bool:
        # The predicate's output is discarded, so only the branches can label output cells.
        return any(f is not None and f.may_label for f in (self.true_filter, self.false_filter))


@dataclass(frozen=True, slots=True)
class _BytesRegex(RowFilter):
    """A regex filter over bytes (row keys, qualifiers, values): RE2 ``pattern``, compiled
    once the filter's limits passed (:func:`compile_filter`)."""

    pattern: bytes
    _regex: Pattern | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _check_pattern(self.kind, self.pattern)

    @property
    def shape(self) -> Shape:
        return _regex_shape(self.pattern)

    @property
    def regex_pattern(self) -> bytes:
        """The RE2 pattern, as bytes."""
        return self.pattern

    def _argument(self) -> Any:
        return b64_text(self.pattern)


@dataclass(frozen=True, slots=True)
class RowKeyRegex(_BytesRegex):
    """Outputs the whole row if its key fully matches the RE2 ``pattern``, else nothing."""

    kind: ClassVar[str] = "row_key_regex"


@dataclass(frozen=True, slots=True)
class RowSample(RowFilter):
    """Outputs the whole row with probability ``probability`` (0 < p < 1), else nothing."""

    probability: float
    kind: ClassVar[str] = "row_sample"

    def __post_init__(self) -> None:
        p = self.probability
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0.0 < p < 1.0:
            raise InvalidArgument(f"row_sample: probability must be in (0, 1), got {p!r}")
        _set(self, "probability", float(p))

    def _argument(self) -> Any:
        return self.probability


@dataclass(frozen=True, slots=True)
class FamilyNameRegex(RowFilter):
    """Outputs the cells whose family name fully matches the RE2 ``pattern`` (no ``:``)."""

    pattern: str
    _regex: Pattern | None = field(default=None, init=False, repr=False, compare=False)
    kind: ClassVar[str] = "family_name_regex"

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str):
            raise InvalidArgument(
                f"family_name_regex must be str, got {type(self.pattern).__name__}"
            )
        if ":" in self.pattern:
            raise InvalidArgument(f"family_name_regex {self.pattern!r} must not contain ':'")
        _check_pattern(self.kind, self.regex_pattern)

    @property
    def shape(self) -> Shape:
        return _regex_shape(self.regex_pattern)

    @property
    def regex_pattern(self) -> bytes:
        """The RE2 pattern, as bytes."""
        return self.pattern.encode()

    def _argument(self) -> Any:
        return self.pattern


@dataclass(frozen=True, slots=True)
class ColumnQualifierRegex(_BytesRegex):
    """Outputs the cells whose qualifier fully matches the RE2 ``pattern``."""

    kind: ClassVar[str] = "column_qualifier_regex"


@dataclass(frozen=True, slots=True)
class ValueRegex(_BytesRegex):
    """Outputs the cells whose value fully matches the RE2 ``pattern``."""

    kind: ClassVar[str] = "value_regex"


def _check_bounds(name: str, start: object, end: object, *flags: object) -> None:
    if start is not None:
        _require_bytes(f"{name} start", start)
    if end is not None:
        _require_bytes(f"{name} end", end)
    if not all(isinstance(f, bool) for f in flags):
        raise InvalidArgument(f"{name}: start_inclusive and end_inclusive must be bools")


def _normalize_bounds(obj: ColumnRange | ValueRange) -> None:
    """An absent bound's inclusiveness means nothing: fix it so equal ranges compare equal."""
    if obj.start is None:
        _set(obj, "start_inclusive", True)
    if obj.end is None:
        _set(obj, "end_inclusive", False)


def _in_bounds(
    x: bytes, start: bytes | None, end: bytes | None, start_incl: bool, end_incl: bool
) -> bool:
    if start is not None and (x < start if start_incl else x <= start):
        return False
    return end is None or (x <= end if end_incl else x < end)


def _bounds_dict(
    start: bytes | None, end: bytes | None, start_incl: bool, end_incl: bool
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if start is not None:
        out["start"] = b64_text(start)
        out["start_inclusive"] = start_incl
    if end is not None:
        out["end"] = b64_text(end)
        out["end_inclusive"] = end_incl
    return out


@dataclass(frozen=True, slots=True)
class ColumnRange(RowFilter):
    """Outputs the cells of ``family`` whose qualifier lies between ``start`` and ``end``.

    None bounds are unbounded (an absent start is ``b""`` inclusive). An inverted range matches
    nothing, as in the service.
    """

    family: str
    start: bytes | None = None
    end: bytes | None = None
    start_inclusive: bool = True
    end_inclusive: bool = False
    kind: ClassVar[str] = "column_range"

    def __post_init__(self) -> None:
        if not isinstance(self.family, str) or not self.family:
            raise InvalidArgument(f"column_range: family must be a non-empty str: {self.family!r}")
        _check_bounds(
            "column_range", self.start, self.end, self.start_inclusive, self.end_inclusive
        )
        _normalize_bounds(self)

    def _argument(self) -> Any:
        return {"family": self.family} | _bounds_dict(
            self.start, self.end, self.start_inclusive, self.end_inclusive
        )

    def matches(self, family: str, qualifier: bytes) -> bool:
        """True if family:qualifier lies in this range."""
        return family == self.family and _in_bounds(
            qualifier, self.start, self.end, self.start_inclusive, self.end_inclusive
        )


@dataclass(frozen=True, slots=True)
class TimestampRange(RowFilter):
    """Outputs the cells with ``start <= timestamp < end`` (microseconds; 0/None unbounded)."""

    start: int | None = None
    end: int | None = None
    kind: ClassVar[str] = "timestamp_range"

    def __post_init__(self) -> None:
        for name, v in (("start", self.start), ("end", self.end)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise InvalidArgument(f"timestamp_range {name} must be an int >= 0, got {v!r}")
        # Normalize so equal ranges compare equal: start None == 0, end 0 == None (unbounded).
        _set(self, "start", self.start or 0)
        _set(self, "end", self.end or None)

    def _argument(self) -> Any:
        return {"start": self.start, "end": self.end}


@dataclass(frozen=True, slots=True)
class ValueRange(RowFilter):
    """Outputs the cells whose value lies between ``start`` and ``end`` (None: unbounded)."""

    start: bytes | None = None
    end: bytes | None = None
    start_inclusive: bool = True
    end_inclusive: bool = False
    kind: ClassVar[str] = "value_range"

    def __post_init__(self) -> None:
        _check_bounds("value_range", self.start, self.end, self.start_inclusive, self.end_inclusive)
        _normalize_bounds(self)

    def _argument(self) -> Any:
        return _bounds_dict(self.start, self.end, self.start_inclusive, self.end_inclusive)


@dataclass(frozen=True, slots=True)
class CellsPerRowOffset(RowFilter):
    """Skips the first ``n`` cells of the row (n >= 0)."""

    n: int
    kind: ClassVar[str] = "cells_per_row_offset"

    def __post_init__(self) -> None:
        _require_count("cells_per_row_offset", self.n, 0)

    def _argument(self) -> Any:
        return self.n


@dataclass(frozen=True, slots=True)
class CellsPerRowLimit(RowFilter):
    """Outputs only the first ``n`` cells of the row (n > 0)."""

    n: int
    kind: ClassVar[str] = "cells_per_row_limit"

    def __post_init__(self) -> None:
        _require_count("cells_per_row_limit", self.n, 1)

    def _argument(self) -> Any:
        return self.n


@dataclass(frozen=True, slots=True)
class CellsPerColumnLimit(RowFilter):
    """Outputs only the first (newest) ``n`` cells of each column (n > 0)."""

    n: int
    kind: ClassVar[str] = "cells_per_column_limit"

    def __post_init__(self) -> None:
        _require_count("cells_per_column_limit", self.n, 1)

    def _argument(self) -> Any:
        return self.n


# -- evaluation --------------------------------------------------------------------------------
def _order(cell: Cell) -> tuple[str, bytes, int]:
    """The row order: family asc, qualifier asc, timestamp desc."""
    return (cell.family, cell.qualifier, -cell.timestamp)


@dataclass(slots=True)
class _Context:
    row_key: bytes
    rng: Random
    #: Inputs that reached a Sink, in evaluation order; merged into the result at the end.
    sinks: list[list[Cell]]


_DEFAULT_RNG = Random()


def apply_filter(
    f: RowFilter | None,
    row_key: bytes,
    cells: Sequence[Cell],
    *,
    rng: Random | None = None,
) -> list[Cell]:
    """The cells of row ``row_key`` that ``f`` outputs, in row order (None: all cells).

    REQUIRES: ``cells`` are sorted by family asc, qualifier asc, timestamp desc.
    ``rng`` decides ``RowSample`` (one draw per RowSample per row); inject a seeded one in tests.
    Copies that reached a ``Sink`` are merged in; on ties, the main output comes first.
    """
    if f is None:
        return list(cells)
    ctx = _Context(row_key, rng if rng is not None else _DEFAULT_RNG, [])
    out = _eval(f, cells if isinstance(cells, list) else list(cells), ctx)
    if ctx.sinks:
        return list(heapq.merge(out, *ctx.sinks, key=_order))
    return out if out is not cells else list(out)


def _eval(f: RowFilter, cells: list[Cell], ctx: _Context) -> list[Cell]:
    """``f``'s output for ``cells``. Never mutates ``cells``; may return it unchanged."""
    handler = _HANDLERS.get(type(f))
    if handler is None:
        raise InvalidArgument(f"unknown filter {f!r}")
    return handler(f, cells, ctx)


def _eval_chain(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    for sub in f.filters:
        if not cells:
            break  # every filter maps no cells to no cells (and a Sink of nothing adds nothing)
        cells = _eval(sub, cells, ctx)
    return cells


def _eval_interleave(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    outputs = [out for sub in f.filters if (out := _eval(sub, cells, ctx))]
    if len(outputs) <= 1:
        return outputs[0] if outputs else []
    # heapq.merge is stable: equal cells keep the order of the branches.
    return list(heapq.merge(*outputs, key=_order))


def _eval_condition(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    if not cells:
        return []
    # Sinks are forbidden inside a Condition, so the predicate needs no sink list of its own.
    matched = bool(_eval(f.predicate, cells, ctx))
    branch = f.true_filter if matched else f.false_filter
    return [] if branch is None else _eval(branch, cells, ctx)


def _eval_sink(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    if cells:
        ctx.sinks.append(cells)
    return []


def _eval_family_regex(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    # Cells are grouped by family, so each family name is matched once.
    match: dict[str, bool] = {}
    fullmatch = _regex(f).fullmatch
    out = []
    for c in cells:
        ok = match.get(c.family)
        if ok is None:
            ok = match[c.family] = fullmatch(c.family.encode()) is not None
        if ok:
            out.append(c)
    return out


def _eval_qualifier_regex(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    # Cells of one column are adjacent, so the previous answer is reused across versions.
    fullmatch = _regex(f).fullmatch
    out = []
    last: bytes | None = None
    ok = False
    for c in cells:
        if c.qualifier is not last and c.qualifier != last:
            last, ok = c.qualifier, fullmatch(c.qualifier) is not None
        if ok:
            out.append(c)
    return out


def _value_regex(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    fullmatch = _regex(f).fullmatch
    return [c for c in cells if fullmatch(c.value) is not None]


def _eval_column_limit(f: Any, cells: list[Cell], ctx: _Context) -> list[Cell]:
    out = []
    column: tuple[str, bytes] | None = None
    count = 0
    for c in cells:
        if column is None or c.qualifier != column[1] or c.family != column[0]:
            column, count = (c.family, c.qualifier), 0
        count += 1
        if count <= f.n:
            out.append(c)
    return out


def _row_filter(keep: Callable[[Any, _Context], bool]) -> Callable[..., list[Cell]]:
    """A handler for a filter that keeps or drops the whole row."""
    return lambda f, cells, ctx: cells if keep(f, ctx) else []


def _cell_filter(keep: Callable[[Any, Cell], bool]) -> Callable[..., list[Cell]]:
    """A handler for a filter that decides each cell on its own."""
    return lambda f, cells, ctx: [c for c in cells if keep(f, c)]


def _cell_map(fn: Callable[[Any, Cell], Cell]) -> Callable[..., list[Cell]]:
    """A handler for a transformer of each cell."""
    return lambda f, cells, ctx: [fn(f, c) for c in cells]


_HANDLERS: dict[type[RowFilter], Callable[[Any, list[Cell], _Context], list[Cell]]] = {
    PassAll: lambda f, cells, ctx: cells,
    BlockAll: lambda f, cells, ctx: [],
    Sink: _eval_sink,
    Chain: _eval_chain,
    Interleave: _eval_interleave,
    Condition: _eval_condition,
    RowKeyRegex: _row_filter(lambda f, ctx: _regex(f).fullmatch(ctx.row_key) is not None),
    RowSample: _row_filter(lambda f, ctx: ctx.rng.random() < f.probability),
    FamilyNameRegex: _eval_family_regex,
    ColumnQualifierRegex: _eval_qualifier_regex,
    ColumnRange: _cell_filter(lambda f, c: f.matches(c.family, c.qualifier)),
    TimestampRange: _cell_filter(
        lambda f, c: f.start <= c.timestamp and (f.end is None or c.timestamp < f.end)
    ),
    ValueRegex: _value_regex,
    ValueRange: _cell_filter(
        lambda f, c: _in_bounds(c.value, f.start, f.end, f.start_inclusive, f.end_inclusive)
    ),
    CellsPerRowOffset: lambda f, cells, ctx: cells[f.n :] if f.n else cells,
    CellsPerRowLimit: lambda f, cells, ctx: cells[: f.n],
    CellsPerColumnLimit: _eval_column_limit,
    StripValue: _cell_map(lambda f, c: Cell(c.family, c.qualifier, c.timestamp, b"", c.labels)),
    ApplyLabel: _cell_map(
        lambda f, c: Cell(c.family, c.qualifier, c.timestamp, c.value, (*c.labels, f.label))
    ),
}


# -- wire form ---------------------------------------------------------------------------------
# These three helpers are shared with query.py's wire form (one copy, here).


def b64_text(data: bytes) -> str:
    """Bytes as a base64 string (the JSON-safe wire form of keys, patterns and values)."""
    return base64.b64encode(data).decode("ascii")


def text_b64(what: str, text: object) -> bytes:
    """The inverse of :func:`b64_text`; InvalidArgument naming ``what`` on bad input."""
    if not isinstance(text, str):
        raise InvalidArgument(f"{what} must be a base64 string, got {text!r}")
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError) as exc:
        raise InvalidArgument(f"{what} is not valid base64: {text!r}") from exc


def check_mapping(what: str, value: object, allowed: set[str]) -> Mapping[str, Any]:
    """``value`` if it is a mapping with no keys outside ``allowed``; else InvalidArgument."""
    if not isinstance(value, Mapping):
        raise InvalidArgument(f"{what} must be an object, got {value!r}")
    unknown = set(value) - allowed
    if unknown:
        raise InvalidArgument(f"{what} has unknown fields {sorted(unknown)}")
    return value


def _bounds_from(what: str, d: Mapping[str, Any]) -> dict[str, Any]:
    start = text_b64(f"{what} start", d["start"]) if "start" in d else None
    end = text_b64(f"{what} end", d["end"]) if "end" in d else None
    return {
        "start": start,
        "end": end,
        "start_inclusive": d.get("start_inclusive", True),
        "end_inclusive": d.get("end_inclusive", False),
    }


_BOUND_FIELDS = {"start", "end", "start_inclusive", "end_inclusive"}


def _list_of_filters(what: str, value: object) -> list[RowFilter]:
    if not isinstance(value, list):
        raise InvalidArgument(f"{what} must be a list of filters, got {value!r}")
    return [_filter_from_dict(v) for v in value]


def _condition_from(value: object) -> Condition:
    d = check_mapping("condition", value, {"predicate", "true", "false"})
    if "predicate" not in d:
        raise InvalidArgument("condition needs a predicate")
    return Condition(
        _filter_from_dict(d["predicate"]),
        _filter_from_dict(d["true"]) if d.get("true") is not None else None,
        _filter_from_dict(d["false"]) if d.get("false") is not None else None,
    )


def _column_range_from(value: object) -> ColumnRange:
    d = check_mapping("column_range", value, {"family"} | _BOUND_FIELDS)
    return ColumnRange(d.get("family", ""), **_bounds_from("column_range", d))


def _timestamp_range_from(value: object) -> TimestampRange:
    d = check_mapping("timestamp_range", value, {"start", "end"})
    return TimestampRange(d.get("start"), d.get("end"))


def _flag(cls: Callable[[], RowFilter]) -> Callable[[Any], RowFilter]:
    """A parser for a filter without arguments, whose wire argument must be ``true``."""

    def parse(value: object) -> RowFilter:
        f = cls()
        if value is not True:
            raise InvalidArgument(f"{f.kind} must be true if set, got {value!r}")
        return f

    return parse


_PARSERS: dict[str, Callable[[Any], RowFilter]] = {
    "pass_all": _flag(PassAll),
    "block_all": _flag(BlockAll),
    "sink": _flag(Sink),
    "strip_value": _flag(StripValue),
    "apply_label": ApplyLabel,
    "chain": lambda v: Chain(_list_of_filters("chain", v)),
    "interleave": lambda v: Interleave(_list_of_filters("interleave", v)),
    "condition": _condition_from,
    "row_key_regex": lambda v: RowKeyRegex(text_b64("row_key_regex", v)),
    "row_sample": RowSample,
    "family_name_regex": FamilyNameRegex,
    "column_qualifier_regex": lambda v: ColumnQualifierRegex(text_b64("column_qualifier_regex", v)),
    "value_regex": lambda v: ValueRegex(text_b64("value_regex", v)),
    "column_range": _column_range_from,
    "timestamp_range": _timestamp_range_from,
    "value_range": lambda v: ValueRange(
        **_bounds_from("value_range", check_mapping("value_range", v, _BOUND_FIELDS))
    ),
    "cells_per_row_offset": CellsPerRowOffset,
    "cells_per_row_limit": CellsPerRowLimit,
    "cells_per_column_limit": CellsPerColumnLimit,
}


class PartsBudget:
    """Counts a filter's parts while its wire form is walked, before any part is built, and
    refuses as soon as a count passes :data:`MAX_FILTER_NODES`, :data:`MAX_FILTER_REGEXES` or
    :data:`MAX_FILTER_REGEX_BYTES`: refusing a request of thousands of parts then costs what
    its first few hundred do, not building them all (a client sending such requests back to
    back would otherwise spend the server's CPU milliseconds at a time). Malformed parts are
    left to the parser, which names them."""

    __slots__ = ("nodes", "regex_bytes", "regexes")

    def __init__(self) -> None:
        self.nodes = self.regexes = self.regex_bytes = 0

    def node(self) -> None:
        self.nodes += 1
        if self.nodes > MAX_FILTER_NODES:
            raise _over_walked("filters", "MAX_FILTER_NODES", MAX_FILTER_NODES)

    def regex(self, size: int) -> None:
        self.regexes += 1
        self.regex_bytes += size
        if self.regexes > MAX_FILTER_REGEXES:
            raise _over_walked("regexes", "MAX_FILTER_REGEXES", MAX_FILTER_REGEXES)
        if self.regex_bytes > MAX_FILTER_REGEX_BYTES:
            raise _over_walked(
                "bytes of regex patterns", "MAX_FILTER_REGEX_BYTES", MAX_FILTER_REGEX_BYTES
            )


def charge_part(cls: type[RowFilter]) -> Callable[[PartsBudget, Sequence[object]], None]:
    """How a decoder charges a filter of class ``cls``, about to be built from ``fields`` (its
    init fields as received, unchecked), to the :class:`PartsBudget` of the message holding
    it: the decoder builds the parts first and their composite last, so the budget refuses at
    the first part over a limit, before the rest are built. A regex's pattern is counted by
    its length (for a family name, in characters: never more than its bytes)."""
    if cls in _REGEX_FILTERS:
        return _charge_regex
    return _charge_node


def _charge_node(budget: PartsBudget, fields: Sequence[object]) -> None:
    budget.node()


def _charge_regex(budget: PartsBudget, fields: Sequence[object]) -> None:
    budget.node()
    pattern = fields[0] if fields else None
    budget.regex(len(pattern) if isinstance(pattern, bytes | str) else 0)


def _over_walked(what: str, limit_name: str, limit: int) -> InvalidArgument:
    return InvalidArgument(
        f"the filter has more than {limit} {what}, over the limit of {limit_name}={limit}"
    )


#: Wire kinds holding a regex, and whether the pattern is base64 text (else plain text).
_WIRE_REGEX_KINDS = {
    "row_key_regex": True,
    "family_name_regex": False,
    "column_qualifier_regex": True,
    "value_regex": True,
}


def _walk_parts(d: object) -> None:
    """Walk the wire form with a :class:`PartsBudget`, stopping at the first limit passed."""
    budget = PartsBudget()
    stack = [d]
    while stack:
        node = stack.pop()
        budget.node()
        if not isinstance(node, Mapping) or len(node) != 1:
            continue
        ((kind, value),) = node.items()
        if kind in ("chain", "interleave") and isinstance(value, list):
            stack.extend(value)
        elif kind == "condition" and isinstance(value, Mapping):
            stack.extend(v for k in ("predicate", "true", "false") if (v := value.get(k)))
        elif kind in _WIRE_REGEX_KINDS and isinstance(value, str):
            # a lower bound of the decoded size for base64 (exactness is the parser's)
            size = len(value) * 3 // 4 - 2 if _WIRE_REGEX_KINDS[kind] else len(value)
            budget.regex(max(size, 0))


def filter_from_dict(d: object) -> RowFilter:
    """Parse the wire form written by :meth:`RowFilter.to_dict`; InvalidArgument if malformed
    or over a cost limit (the parts are counted before any is built)."""
    _walk_parts(d)
    return _filter_from_dict(d)


def _filter_from_dict(d: object) -> RowFilter:
    if not isinstance(d, Mapping) or len(d) != 1:
        raise InvalidArgument(f"a filter must be an object with exactly one key, got {d!r}")
    ((kind, value),) = d.items()
    parser = _PARSERS.get(kind)
    if parser is None:
        raise InvalidArgument(f"unknown filter kind {kind!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise InvalidArgument(f"{kind}: {value!r} is not a finite number")
    return parser(value)


def iter_filters(f: RowFilter) -> Iterator[RowFilter]:
    """``f`` and every filter nested in it, depth first."""
    yield f
    children: Iterable[RowFilter | None] = ()
    if isinstance(f, Chain | Interleave):
        children = f.filters
    elif isinstance(f, Condition):
        children = (f.predicate, f.true_filter, f.false_filter)
    for child in children:
        if child is not None:
            yield from iter_filters(child)


_REGEX_FILTERS = (RowKeyRegex, FamilyNameRegex, ColumnQualifierRegex, ValueRegex)
_RegexFilter = RowKeyRegex | FamilyNameRegex | ColumnQualifierRegex | ValueRegex


def _regex(f: _RegexFilter) -> Pattern:
    """``f``'s compiled pattern, compiling it (through the shared cache) the first time."""
    compiled = f._regex
    if compiled is None:
        compiled = _compile(f.kind, f.regex_pattern)
        _set(f, "_regex", compiled)
    return compiled


def _regex_leaves(f: RowFilter | None) -> list[_RegexFilter]:
    if f is None or not f.shape.regexes:
        return []
    return [x for x in iter_filters(f) if isinstance(x, _REGEX_FILTERS)]


def uncompiled(f: RowFilter | None) -> bool:
    """True if compiling ``f`` needs RE2's compiler: a pattern is neither compiled nor cached.

    Takes what the cache holds without compiling anything, so a server can compile on its
    event loop when this is False and elsewhere when it is True.
    """
    missing = False
    for x in _regex_leaves(f):
        if x._regex is None:
            compiled = cached(x.regex_pattern)
            if compiled is None:
                missing = True
            else:
                _set(x, "_regex", compiled)
    return missing


def compile_filter(f: RowFilter | None) -> int:
    """Compile every pattern of ``f``; return its :func:`regex_cost`.

    Patterns are compiled one at a time while their programs total at most
    :data:`MAX_FILTER_PROGRAM` instructions; past it, InvalidArgument naming the limit (so a
    filter compiles at most one pattern beyond the limit). An invalid pattern is InvalidArgument
    naming the filter kind, the pattern and RE2's reason.
    """
    total = 0
    for x in _regex_leaves(f):
        total += program_size(_regex(x))
        if total > MAX_FILTER_PROGRAM:
            raise InvalidArgument(
                f"the filter's regexes compile to more than {total} RE2 instructions, over the "
                f"limit of MAX_FILTER_PROGRAM={MAX_FILTER_PROGRAM}"
            )
    return total


def regex_cost(f: RowFilter | None) -> int:
    """Worst-case RE2 work per byte of a row (its key, names and values) when ``f`` evaluates it.

    The sum of the RE2 program sizes of every regex filter in ``f`` (0 when there is none):
    each filter node runs at most once per row and an RE2 match costs at most about program
    size steps per byte of text, so ``regex_cost(f) * row_bytes`` bounds the regex work of one
    :func:`apply_filter` call -- whatever the pattern, since RE2 cannot backtrack. Compiles
    what is not compiled yet (:func:`compile_filter`, with its limit).
    """
    return compile_filter(f)
