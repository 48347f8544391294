"""The engine's read rules over Arrow columns: the batch reader's vectorised path (§5.3, §8).

A read sees "a merged view of the sequence of SSTables" (§5.3) after deletions, versions and
the families' garbage-collection rules (§5.4). The engine decides that cell by cell
(``engine/iterators.py``, ``_Visibility``); a batch job reads whole tablets, so this module
decides the same thing for a whole merged table at once with numpy and ``pyarrow.compute``,
with no Python object per cell. The rules are the engine's, restated column-wise; the
randomized differential test (tests/batch/test_arrow_rules.py) holds both to the same output.

:func:`visible_table` takes the merged entries of a split (SSTable schema, in
``keys.cell_sort_key`` order, exact duplicates removed) and keeps what a read at the
snapshot's ``cut_seq`` sees:

* entries with a seq past the cut are ignored;
* a DELETE_ROW masks the row's entries with a smaller seq; a DELETE_FAMILY those of its
  family; a DELETE_COLUMN those of its column whose timestamp is in its ``[start, end)``;
* of two puts of one (row, family, qualifier, timestamp), the newest seq counts (the other is
  an older rewrite);
* a family's GC rule (max versions, max age, unions and intersections of them) is applied
  with the version index counted among the column's visible versions, newest first, at the
  snapshot's instant.

Aggregate families' parts (kinds 4-7) are folded per bucket by the engine's combiner: a split
holding any is left to the per-cell path (None).

:func:`filter_table` applies a :mod:`tabletstore.data.filters` row filter to cells already in
the ``cells`` shape, as ``apply_filter`` does row by row. :func:`vectorisable` says which
filters it takes: ``PassAll``, ``BlockAll``, ``Chain``, ``RowKeyRegex``,
``FamilyNameRegex``, ``ColumnQualifierRegex``, ``ValueRegex`` (ASCII patterns: pyarrow's
``match_substring_regex`` is RE2 too, in Latin-1 mode over binary columns, the engine's mode;
the pattern is anchored with ``\\A(?:...)\\z`` for the engine's full match; a non-ASCII
pattern's bytes would reach RE2 UTF-8 encoded), ``ColumnRange``, ``TimestampRange``,
``ValueRange``, ``StripValue``, ``CellsPerRowOffset``, ``CellsPerRowLimit`` and
``CellsPerColumnLimit``. Not vectorised, left to the per-cell path: ``Interleave`` and
``Condition`` (per-row branching and merging of branch outputs), ``Sink``, ``ApplyLabel``
(labels are not in the output shapes) and ``RowSample`` (one random draw per row).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tabletstore.data.filters import (
    BlockAll,
    CellsPerColumnLimit,
    CellsPerRowLimit,
    CellsPerRowOffset,
    Chain,
    ColumnQualifierRegex,
    ColumnRange,
    FamilyNameRegex,
    PassAll,
    RowFilter,
    RowKeyRegex,
    StripValue,
    TimestampRange,
    ValueRange,
    ValueRegex,
)
from tabletstore.data.schema import (
    GcRule,
    IntersectionRule,
    MaxAgeRule,
    MaxVersionsRule,
    UnionRule,
)
from tabletstore.errors import Corruption
from tabletstore.keys import CellKind

__all__ = ["filter_table", "vectorisable", "visible_table"]

_PUT = int(CellKind.PUT)
_DELETE_COLUMN = int(CellKind.DELETE_COLUMN)
_DELETE_FAMILY = int(CellKind.DELETE_FAMILY)
_DELETE_ROW = int(CellKind.DELETE_ROW)


def _np(col: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return col.to_numpy(zero_copy_only=False)  # type: ignore[no-any-return]


def _changes(*cols: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """True where any of ``cols`` differs from the previous entry (and at 0)."""
    n = len(cols[0])
    out = np.ones(n, dtype=bool)
    if n > 1:
        differs = np.zeros(n - 1, dtype=bool)
        for col in cols:
            differs |= _np(pc.not_equal(col.slice(1), col.slice(0, n - 1)))
        out[1:] = differs
    return out


def _groups(starts_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(group id of each entry, first entry of each group, end of each group)."""
    ids = np.cumsum(starts_mask) - 1
    starts = np.flatnonzero(starts_mask)
    ends = np.append(starts[1:], len(starts_mask))
    return ids, starts, ends


def _group_max(values: np.ndarray, starts: np.ndarray, ids: np.ndarray) -> np.ndarray:
    if not len(values):
        return values
    return np.maximum.reduceat(values, starts)[ids]  # type: ignore[no-any-return]


def _ranges(values: pa.ChunkedArray | pa.Array, where: np.ndarray) -> np.ndarray:
    """The ``(start, end)`` timestamp ranges of the DELETE_COLUMN entries at ``where``
    (``keys.encode_ts_range``: two big-endian int64 each), shape (n, 2)."""
    arr = values.take(pa.array(where))
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if (_np(pc.binary_length(arr)) != 16).any():
        raise Corruption("a DELETE_COLUMN entry has a malformed range value")
    _, offsets, data = arr.buffers()
    assert offsets is not None and data is not None
    first = int(np.frombuffer(offsets, dtype=np.int32)[arr.offset])
    raw = np.frombuffer(data, dtype=np.uint8)[first : first + 16 * len(arr)]
    return raw.view(">i8").astype(np.int64).reshape(-1, 2)


def visible_table(
    merged: pa.Table,
    cut_seq: int,
    gc_rules: Mapping[str, GcRule | None],
    now_micros: int,
) -> pa.Table | None:
    """The entries of ``merged`` a read at ``cut_seq`` sees (module docstring; columns row,
    family, qualifier, ts, value), or None when it holds aggregate parts (the per-cell path
    folds them)."""
    kind = _np(merged.column("kind"))
    if len(kind) and (kind.min() < _PUT or kind.max() > _DELETE_ROW):
        return None
    seq = _np(merged.column("seq"))
    if len(seq) and seq.max() > cut_seq:
        after = seq <= cut_seq
        merged = merged.filter(pa.array(after))
        kind, seq = kind[after], seq[after]
    n = merged.num_rows
    if not n:
        return merged.select(["row", "family", "qualifier", "ts", "value"])
    rows, fam, qual = merged.column(0), merged.column(1), merged.column(2)
    ts = _np(merged.column(3))
    new_row = _changes(rows)
    new_fam = new_row | _changes(fam)
    new_col = new_fam | _changes(qual)
    row_id, row_starts, _ = _groups(new_row)
    fam_id, fam_starts, _ = _groups(new_fam)
    col_id, col_starts, col_ends = _groups(new_col)
    # Row and family floors: the largest seq of a deletion entry of the scope.
    row_floor = _group_max(np.where(kind == _DELETE_ROW, seq, -1), row_starts, row_id)
    fam_floor = np.maximum(
        _group_max(np.where(kind == _DELETE_FAMILY, seq, -1), fam_starts, fam_id), row_floor
    )
    put = kind == _PUT
    masked = seq < fam_floor
    dels = np.flatnonzero(kind == _DELETE_COLUMN)
    if len(dels):
        # Each DELETE_COLUMN against every entry of its column: (delete, entry) pairs.
        rng = _ranges(merged.column("value"), dels)
        lo, hi = col_starts[col_id[dels]], col_ends[col_id[dels]]
        counts = hi - lo
        pair_d = np.repeat(np.arange(len(dels)), counts)
        pair_e = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
        pair_e += np.repeat(lo, counts)
        hit = (
            (seq[pair_e] < seq[dels][pair_d])
            & (ts[pair_e] >= rng[pair_d, 0])
            & (ts[pair_e] < rng[pair_d, 1])
        )
        masked[pair_e[hit]] = True
    # An older rewrite: a put right after a put of the same column and timestamp (deletion
    # entries of a column carry TS_MAX and sort first, so the predecessor is a put).
    rewrite = np.zeros(n, dtype=bool)
    rewrite[1:] = ts[1:] == ts[:-1]
    rewrite &= ~new_col
    live = put & ~rewrite & ~masked
    # The version index among the column's visible versions, newest first.
    count = np.cumsum(live)
    before = (count - live)[col_starts]
    index = count - 1 - before[col_id]
    garbage = np.zeros(n, dtype=bool)
    names = pc.unique(fam.filter(pa.array(live))).to_pylist() if live.any() else []
    for name in names:
        rule = gc_rules.get(name)
        if rule is None:
            continue
        mine = live & _np(pc.equal(fam, pa.scalar(name, pa.string())))
        garbage[mine] = _is_garbage(rule, index[mine], ts[mine], now_micros)
    return merged.select(["row", "family", "qualifier", "ts", "value"]).filter(
        pa.array(live & ~garbage)
    )


def _is_garbage(rule: GcRule, index: np.ndarray, ts: np.ndarray, now: int) -> np.ndarray:
    """``data.schema.is_garbage`` over arrays of version indexes and timestamps."""
    if isinstance(rule, MaxVersionsRule):
        return index >= rule.max_versions  # type: ignore[no-any-return]
    if isinstance(rule, MaxAgeRule):
        return ts < now - int(rule.max_age_seconds * 1_000_000)  # type: ignore[no-any-return]
    parts = [_is_garbage(r, index, ts, now) for r in rule.rules]
    if isinstance(rule, UnionRule):
        return np.logical_or.reduce(parts)  # type: ignore[no-any-return]
    assert isinstance(rule, IntersectionRule)
    return np.logical_and.reduce(parts)  # type: ignore[no-any-return]


# -- row filters --------------------------------------------------------------------------------

_REGEX = (RowKeyRegex, FamilyNameRegex, ColumnQualifierRegex, ValueRegex)
_SIMPLE = (
    PassAll,
    BlockAll,
    ColumnRange,
    TimestampRange,
    ValueRange,
    StripValue,
    CellsPerRowOffset,
    CellsPerRowLimit,
    CellsPerColumnLimit,
)


def vectorisable(f: RowFilter | None) -> bool:
    """Whether :func:`filter_table` takes ``f`` (module docstring)."""
    if f is None or isinstance(f, _SIMPLE):
        return True
    if isinstance(f, Chain):
        return all(vectorisable(sub) for sub in f.filters)
    if isinstance(f, _REGEX):
        pattern = f.pattern.encode() if isinstance(f.pattern, str) else f.pattern
        return pattern.isascii()
    return False


def filter_table(cells: pa.Table, f: RowFilter | None) -> pa.Table:
    """``cells`` (the ``cells`` shape, in row order) through ``f``, as ``apply_filter`` on
    each row's cells; ``f`` must be :func:`vectorisable`."""
    if f is None or not cells.num_rows:
        return cells
    if isinstance(f, Chain):
        for sub in f.filters:
            cells = filter_table(cells, sub)
            if not cells.num_rows:
                break
        return cells
    if isinstance(f, StripValue):
        empty = pa.array(np.zeros(cells.num_rows + 1, dtype=np.int32))
        blank = pa.BinaryArray.from_buffers(
            pa.binary(), cells.num_rows, [None, empty.buffers()[1], pa.py_buffer(b"")]
        )
        return cells.set_column(4, "value", blank)
    return cells.filter(pa.array(_keep(cells, f)))


def _keep(cells: pa.Table, f: RowFilter) -> np.ndarray:
    n = cells.num_rows
    rows, fam, qual, ts, value = cells.columns
    if isinstance(f, PassAll):
        return np.ones(n, dtype=bool)
    if isinstance(f, BlockAll):
        return np.zeros(n, dtype=bool)
    if isinstance(f, RowKeyRegex):
        return _full_match(rows, f.pattern)
    if isinstance(f, FamilyNameRegex):
        return _full_match(pc.cast(fam, pa.binary()), f.pattern.encode())
    if isinstance(f, ColumnQualifierRegex):
        return _full_match(qual, f.pattern)
    if isinstance(f, ValueRegex):
        return _full_match(value, f.pattern)
    if isinstance(f, ColumnRange):
        keep = _np(pc.equal(fam, pa.scalar(f.family, pa.string())))
        in_range = _in_bounds(qual, f.start, f.end, f.start_inclusive, f.end_inclusive)
        return keep & in_range  # type: ignore[no-any-return]
    if isinstance(f, TimestampRange):
        t = _np(ts)
        keep = t >= (f.start or 0)
        return keep if f.end is None else keep & (t < f.end)
    if isinstance(f, ValueRange):
        return _in_bounds(value, f.start, f.end, f.start_inclusive, f.end_inclusive)
    if isinstance(f, CellsPerRowOffset | CellsPerRowLimit):
        ids, starts, _ = _groups(_changes(rows))
        rank = np.arange(n) - starts[ids]
        return rank >= f.n if isinstance(f, CellsPerRowOffset) else rank < f.n  # type: ignore[no-any-return]
    if isinstance(f, CellsPerColumnLimit):
        ids, starts, _ = _groups(_changes(rows, fam, qual))
        return np.arange(n) - starts[ids] < f.n  # type: ignore[no-any-return]
    raise AssertionError(f"filter {f!r} is not vectorisable")


def _full_match(col: Any, pattern: bytes) -> np.ndarray:
    anchored = "\\A(?:" + pattern.decode("ascii") + ")\\z"
    return _np(pc.match_substring_regex(col, pattern=anchored))


def _in_bounds(
    col: Any, start: bytes | None, end: bytes | None, start_incl: bool, end_incl: bool
) -> np.ndarray:
    keep = np.ones(len(col), dtype=bool)
    if start is not None:
        s = pa.scalar(start, pa.binary())
        keep &= _np((pc.greater_equal if start_incl else pc.greater)(col, s))
    if end is not None:
        e = pa.scalar(end, pa.binary())
        keep &= _np((pc.less_equal if end_incl else pc.less)(col, e))
    return keep
