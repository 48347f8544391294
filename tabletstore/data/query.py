"""Read queries: which rows to read (row ranges and keys) and what to return from them (§3).

§3: clients "iterate over a subset of the data", "limit the rows, columns and timestamps
produced by a scan". This module owns the row-selection half of that as values:

* :class:`RowRange` -- a contiguous range of row keys, each end open or closed or unbounded, with
  :meth:`RowRange.prefix` (the keys starting with a prefix) and clipping to a tablet.
* :class:`RowSet` -- single keys plus ranges, always held in normal form (below), split by
  tablet boundaries so a client sends each tablet server only its part (§5.1, §5.2).
* :class:`ReadQuery` -- a row set, a :mod:`tabletstore.data.filters` filter and a row limit.

Row keys order as unsigned bytes. The key just after ``k`` is ``k + b"\\x00"``, so every range has
an exact half-open form ``[lo, hi)`` (``hi`` None: unbounded): an open start ``k`` is
``lo = k + b"\\x00"`` and a closed end ``k`` is ``hi = k + b"\\x00"``. Normal form of a row set:
ranges in that half-open form, sorted, non-empty, with overlapping or touching ranges merged;
keys sorted, deduplicated, non-empty, and dropped when a range covers them.

An empty :class:`RowSet` selects *no* rows. (Cloud Bigtable reads the whole table when a request
names no rows; its translation is ``RowSet.all()``, which is also :class:`ReadQuery`'s default.)
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tabletstore.data.filters import RowFilter, filter_from_dict
from tabletstore.data.filters import b64_text as _b64
from tabletstore.data.filters import check_mapping as _mapping
from tabletstore.data.filters import text_b64 as _unb64
from tabletstore.errors import InvalidArgument

__all__ = ["ReadQuery", "RowRange", "RowSet", "prefix_successor"]


def prefix_successor(prefix: bytes) -> bytes | None:
    """The smallest key greater than every key starting with ``prefix`` (None: no such key).

    Trailing 0xff bytes cannot be incremented, so they are dropped first:
    ``b"a\\xff" -> b"b"``, ``b"\\xff\\xff" -> None``, ``b"" -> None``.
    """
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return None
    return stripped[:-1] + bytes([stripped[-1] + 1])


@dataclass(frozen=True, slots=True)
class RowRange:
    """Row keys from ``start`` to ``end``; None is unbounded on that side.

    Defaults give the half-open ``[start, end)``. ``start > end`` is an InvalidArgument; a range
    that selects nothing (``[a, a)``) is allowed and :meth:`is_empty`.
    """

    start: bytes | None = None
    end: bytes | None = None
    start_inclusive: bool = True
    end_inclusive: bool = False

    def __post_init__(self) -> None:
        for name, v in (("start", self.start), ("end", self.end)):
            if v is not None and not isinstance(v, bytes):
                raise InvalidArgument(f"row range {name} must be bytes, got {type(v).__name__}")
        if not isinstance(self.start_inclusive, bool) or not isinstance(self.end_inclusive, bool):
            raise InvalidArgument("row range start_inclusive and end_inclusive must be bools")
        if self.start is not None and self.end is not None and self.start > self.end:
            raise InvalidArgument(f"row range start {self.start!r} > end {self.end!r}")
        # An absent bound's inclusiveness means nothing: fix it so equal ranges compare equal.
        if self.start is None:
            object.__setattr__(self, "start_inclusive", True)
        if self.end is None:
            object.__setattr__(self, "end_inclusive", False)

    @classmethod
    def all(cls) -> RowRange:
        """Every row key."""
        return cls()

    @classmethod
    def prefix(cls, prefix: bytes) -> RowRange:
        """The keys that start with ``prefix``."""
        if not isinstance(prefix, bytes):
            raise InvalidArgument(f"row prefix must be bytes, got {type(prefix).__name__}")
        return cls(prefix or None, prefix_successor(prefix))

    @classmethod
    def half_open(cls, lo: bytes, hi: bytes | None) -> RowRange:
        """``[lo, hi)`` in normal form (``lo == b""`` is stored as an unbounded start)."""
        return cls(lo or None, hi)

    def bounds(self) -> tuple[bytes, bytes | None]:
        """This range as half-open ``[lo, hi)``; ``hi`` None means unbounded."""
        if self.start is None:
            lo = b""
        else:
            lo = self.start if self.start_inclusive else self.start + b"\x00"
        if self.end is None:
            return lo, None
        return lo, self.end + b"\x00" if self.end_inclusive else self.end

    def normalized(self) -> RowRange:
        """The same range in half-open normal form."""
        return RowRange.half_open(*self.bounds())

    def is_empty(self) -> bool:
        lo, hi = self.bounds()
        return hi is not None and lo >= hi

    def contains(self, key: bytes) -> bool:
        lo, hi = self.bounds()
        return lo <= key and (hi is None or key < hi)

    def intersect(self, other: RowRange) -> RowRange | None:
        """The keys in both ranges (normal form), or None if there are none."""
        lo1, hi1 = self.bounds()
        lo2, hi2 = other.bounds()
        return _half_open_or_none(max(lo1, lo2), _min_end(hi1, hi2))

    def clip(self, tablet_start: bytes, tablet_end: bytes | None) -> RowRange | None:
        """The part inside a tablet's ``[tablet_start, tablet_end)`` (normal form), or None."""
        lo, hi = self.bounds()
        return _half_open_or_none(max(lo, tablet_start), _min_end(hi, tablet_end))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.start is not None:
            out["start"] = _b64(self.start)
            out["start_inclusive"] = self.start_inclusive
        if self.end is not None:
            out["end"] = _b64(self.end)
            out["end_inclusive"] = self.end_inclusive
        return out

    @classmethod
    def from_dict(cls, d: object) -> RowRange:
        m = _mapping("row range", d, {"start", "end", "start_inclusive", "end_inclusive"})
        return cls(
            _unb64("row range start", m["start"]) if "start" in m else None,
            _unb64("row range end", m["end"]) if "end" in m else None,
            m.get("start_inclusive", True),
            m.get("end_inclusive", False),
        )


def _min_end(a: bytes | None, b: bytes | None) -> bytes | None:
    if a is None:
        return b
    return a if b is None else min(a, b)


def _half_open_or_none(lo: bytes, hi: bytes | None) -> RowRange | None:
    if hi is not None and lo >= hi:
        return None
    return RowRange.half_open(lo, hi)


def _merge(ranges: Sequence[RowRange]) -> tuple[RowRange, ...]:
    """Half-open, sorted, non-empty ranges with overlapping and touching ones merged."""
    spans = sorted((r.bounds() for r in ranges if not r.is_empty()), key=lambda span: span[0])
    merged: list[tuple[bytes, bytes | None]] = []
    for lo, hi in spans:
        if merged:
            last_lo, last_hi = merged[-1]
            if last_hi is None:
                break  # the last merged range is unbounded: it covers everything after it
            if lo <= last_hi:
                merged[-1] = (last_lo, None if hi is None else max(hi, last_hi))
                continue
        merged.append((lo, hi))
    return tuple(RowRange.half_open(lo, hi) for lo, hi in merged)


def _covered(key: bytes, ranges: Sequence[RowRange], los: Sequence[bytes]) -> bool:
    """True if normalized, sorted ``ranges`` (whose starts are ``los``) contain ``key``."""
    i = bisect.bisect_right(los, key) - 1
    return i >= 0 and ranges[i].contains(key)


@dataclass(frozen=True, slots=True)
class RowSet:
    """Row keys and row ranges, held in normal form (see the module docstring)."""

    keys: Sequence[bytes] = ()
    ranges: Sequence[RowRange] = ()

    def __post_init__(self) -> None:
        for k in self.keys:
            if not isinstance(k, bytes) or not k:
                raise InvalidArgument(f"row set keys must be non-empty bytes, got {k!r}")
        for r in self.ranges:
            if not isinstance(r, RowRange):
                raise InvalidArgument(f"row set ranges must be RowRange, got {r!r}")
        if not self.ranges and len(self.keys) <= 1:
            # Fast path: a point read builds several of these per request (client, clip,
            # worker); one key and no range is already in normal form.
            object.__setattr__(self, "ranges", ())
            object.__setattr__(self, "keys", tuple(self.keys))
            return
        ranges = _merge(self.ranges)
        los = [r.bounds()[0] for r in ranges]
        keys = tuple(k for k in sorted(set(self.keys)) if not _covered(k, ranges, los))
        object.__setattr__(self, "ranges", ranges)
        object.__setattr__(self, "keys", keys)

    @classmethod
    def all(cls) -> RowSet:
        """Every row of the table."""
        return cls(ranges=[RowRange.all()])

    @classmethod
    def prefix(cls, prefix: bytes) -> RowSet:
        """Every row whose key starts with ``prefix``."""
        return cls(ranges=[RowRange.prefix(prefix)])

    def is_empty(self) -> bool:
        return not self.keys and not self.ranges

    def contains(self, key: bytes) -> bool:
        i = bisect.bisect_left(self.keys, key)
        if i < len(self.keys) and self.keys[i] == key:
            return True
        return _covered(key, self.ranges, [r.bounds()[0] for r in self.ranges])

    def pieces(self) -> list[bytes | RowRange]:
        """Keys and ranges merged in key order: the order a scan visits them."""
        items: list[tuple[bytes, bytes | RowRange]] = [(k, k) for k in self.keys]
        items += [(r.bounds()[0], r) for r in self.ranges]
        items.sort(key=lambda item: item[0])
        return [piece for _, piece in items]

    def clip(self, tablet_start: bytes, tablet_end: bytes | None) -> RowSet:
        """The part of this set inside a tablet's ``[tablet_start, tablet_end)``."""
        keys = [
            k for k in self.keys if tablet_start <= k and (tablet_end is None or k < tablet_end)
        ]
        ranges = [c for r in self.ranges if (c := r.clip(tablet_start, tablet_end)) is not None]
        return RowSet(keys, ranges)

    def split(self, boundaries: Sequence[bytes]) -> list[RowSet]:
        """Split by tablet boundaries: one (possibly empty) row set per tablet.

        ``boundaries`` are the sorted, distinct, non-empty start keys of every tablet but the
        first; tablet ``i`` covers ``[boundaries[i-1], boundaries[i])`` with ``b""`` before the
        first and no limit after the last, so the result has ``len(boundaries) + 1`` entries.
        """
        _check_boundaries(boundaries)
        n = len(boundaries) + 1
        keys: list[list[bytes]] = [[] for _ in range(n)]
        ranges: list[list[RowRange]] = [[] for _ in range(n)]
        for k in self.keys:
            keys[bisect.bisect_right(boundaries, k)].append(k)
        for r in self.ranges:
            lo, hi = r.bounds()
            first = bisect.bisect_right(boundaries, lo)
            last = n - 1 if hi is None else bisect.bisect_left(boundaries, hi)
            for i in range(first, last + 1):
                start = boundaries[i - 1] if i > 0 else b""
                end = boundaries[i] if i < n - 1 else None
                if (c := r.clip(start, end)) is not None:
                    ranges[i].append(c)
        return [RowSet(keys[i], ranges[i]) for i in range(n)]

    def to_dict(self) -> dict[str, Any]:
        return {"keys": [_b64(k) for k in self.keys], "ranges": [r.to_dict() for r in self.ranges]}

    @classmethod
    def from_dict(cls, d: object) -> RowSet:
        m = _mapping("row set", d, {"keys", "ranges"})
        keys, ranges = m.get("keys", []), m.get("ranges", [])
        if not isinstance(keys, list) or not isinstance(ranges, list):
            raise InvalidArgument("row set keys and ranges must be lists")
        return cls(
            [_unb64("row set key", k) for k in keys], [RowRange.from_dict(r) for r in ranges]
        )


def _check_boundaries(boundaries: Sequence[bytes]) -> None:
    for i, b in enumerate(boundaries):
        if not isinstance(b, bytes) or not b:
            raise InvalidArgument(f"tablet boundaries must be non-empty bytes, got {b!r}")
        if i and boundaries[i - 1] >= b:
            raise InvalidArgument("tablet boundaries must be sorted and distinct")


@dataclass(frozen=True, slots=True)
class ReadQuery:
    """Read the rows of ``row_set`` in key order, each through ``filter``, at most ``limit``.

    ``filter`` None returns every visible cell. ``limit`` None is unlimited; otherwise it counts
    rows that have at least one cell after filtering (rows the filter empties are not returned).
    """

    row_set: RowSet = field(default_factory=RowSet.all)
    filter: RowFilter | None = None
    limit: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.row_set, RowSet):
            raise InvalidArgument(f"read row_set must be a RowSet, got {self.row_set!r}")
        if self.filter is not None and not isinstance(self.filter, RowFilter):
            raise InvalidArgument(f"read filter must be a RowFilter, got {self.filter!r}")
        lim = self.limit
        if lim is not None and (isinstance(lim, bool) or not isinstance(lim, int) or lim <= 0):
            raise InvalidArgument(f"read limit must be a positive int or None, got {lim!r}")

    def clip(self, tablet_start: bytes, tablet_end: bytes | None) -> ReadQuery:
        """The same query restricted to one tablet's rows (the limit still applies overall)."""
        return ReadQuery(self.row_set.clip(tablet_start, tablet_end), self.filter, self.limit)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"rows": self.row_set.to_dict()}
        if self.filter is not None:
            out["filter"] = self.filter.to_dict()
        if self.limit is not None:
            out["limit"] = self.limit
        return out

    @classmethod
    def from_dict(cls, d: object) -> ReadQuery:
        m = _mapping("read query", d, {"rows", "filter", "limit"})
        if "rows" not in m:
            raise InvalidArgument("read query needs rows")
        f = m.get("filter")
        return cls(
            RowSet.from_dict(m["rows"]),
            None if f is None else filter_from_dict(f),
            m.get("limit"),
        )
