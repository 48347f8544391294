"""Merging, visibility and compaction of cell streams, checked against a brute-force model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabletstore.data.schema import (
    GcRule,
    IntersectionRule,
    MaxAgeRule,
    MaxVersionsRule,
    UnionRule,
    is_garbage,
)
from tabletstore.engine.iterators import (
    acells,
    acompact_batches,
    acompact_cells,
    agroup_rows,
    amerge_batches,
    amerge_sources,
    avisible_batches,
    avisible_cells,
    compact_cells,
    group_rows,
    merge_sources,
    visible_cells,
)
from tabletstore.errors import Corruption
from tabletstore.keys import TS_MAX, Cell, CellKind, cell_sort_key, decode_ts_range, encode_ts_range

NOW = 10_000_000_000  # microseconds; the fixed "now" of every GC evaluation here
SEC = 1_000_000
FAMILIES = ("a", "b")


def put(row: bytes, fam: str, q: bytes, ts: int, seq: int, value: bytes = b"v") -> Cell:
    return Cell(row, fam, q, ts, seq, CellKind.PUT, value)


def del_col(row: bytes, fam: str, q: bytes, start: int, end: int, seq: int) -> Cell:
    return Cell(row, fam, q, TS_MAX, seq, CellKind.DELETE_COLUMN, encode_ts_range(start, end))


def del_fam(row: bytes, fam: str, seq: int) -> Cell:
    return Cell(row, fam, b"", TS_MAX, seq, CellKind.DELETE_FAMILY, b"")


def del_row(row: bytes, seq: int) -> Cell:
    return Cell(row, "", b"", TS_MAX, seq, CellKind.DELETE_ROW, b"")


# --- the model --------------------------------------------------------------------------------


def masks(d: Cell, c: Cell) -> bool:
    """Whether deletion entry ``d`` masks put ``c`` (keys.py's rules, stated directly)."""
    if d.row != c.row or d.seq <= c.seq:
        return False
    if d.kind == CellKind.DELETE_ROW:
        return True
    if d.family != c.family:
        return False
    if d.kind == CellKind.DELETE_FAMILY:
        return True
    start, end = decode_ts_range(d.value)
    return d.qualifier == c.qualifier and start <= c.ts < end


def model_visible(
    cells: Iterable[Cell],
    gc_rules: Mapping[str, GcRule | None],
    now: int,
    snapshot: int | None = None,
) -> list[Cell]:
    live = {c for c in cells if snapshot is None or c.seq <= snapshot}
    deletions = [c for c in live if c.kind != CellKind.PUT]
    newest: dict[tuple[bytes, str, bytes, int], Cell] = {}
    for c in live:
        if c.kind == CellKind.PUT:
            k = (c.row, c.family, c.qualifier, c.ts)
            if k not in newest or newest[k].seq < c.seq:
                newest[k] = c
    unmasked = [c for c in newest.values() if not any(masks(d, c) for d in deletions)]
    columns: dict[tuple[bytes, str, bytes], list[Cell]] = {}
    for c in unmasked:
        columns.setdefault((c.row, c.family, c.qualifier), []).append(c)
    out = []
    for (_, fam, _), versions in columns.items():
        versions.sort(key=lambda c: -c.ts)
        out.extend(
            c for i, c in enumerate(versions) if not is_garbage(gc_rules.get(fam), i, c.ts, now)
        )
    return sorted(out, key=cell_sort_key)


# --- strategies -------------------------------------------------------------------------------

rule_leaf = st.one_of(
    st.builds(MaxVersionsRule, max_versions=st.integers(1, 3)),
    st.builds(MaxAgeRule, max_age_seconds=st.integers(1, 6).map(float)),
)
gc_rule = st.one_of(
    st.none(),
    rule_leaf,
    st.builds(UnionRule, rules=st.lists(rule_leaf, min_size=1, max_size=2)),
    st.builds(IntersectionRule, rules=st.lists(rule_leaf, min_size=1, max_size=2)),
)
gc_rules_st = st.fixed_dictionaries({f: gc_rule for f in FAMILIES})

entry = st.tuples(
    st.sampled_from([0, 0, 0, 0, 1, 1, 2, 3]),  # kind, puts most often
    st.sampled_from([b"r1", b"r2", b"r3"]),
    st.sampled_from(FAMILIES),
    st.sampled_from([b"", b"x", b"y"]),
    st.integers(0, 6),  # ts = NOW - k seconds
    st.integers(0, 7),  # delete range start (in seconds back from NOW)
    st.integers(0, 4),  # delete range width
)


@st.composite
def histories(draw: st.DrawFn) -> list[Cell]:
    """A tablet's cells with unique seqs (seq order is random relative to timestamps)."""
    entries = draw(st.lists(entry, max_size=40))
    seqs = draw(st.permutations(list(range(1, len(entries) + 1))))
    cells = []
    for (kind, row, fam, q, k, back, width), seq in zip(entries, seqs, strict=True):
        ts = NOW - k * SEC
        if kind == CellKind.PUT:
            cells.append(put(row, fam, q, ts, seq, b"v%d" % seq))
        elif kind == CellKind.DELETE_COLUMN:
            end = NOW - back * SEC + 1
            cells.append(del_col(row, fam, q, end - width * SEC, end, seq))
        elif kind == CellKind.DELETE_FAMILY:
            cells.append(del_fam(row, fam, seq))
        else:
            cells.append(del_row(row, seq))
    # Rewrites of an existing version with a newer seq.
    for c in draw(st.lists(st.sampled_from(cells), max_size=5)) if cells else []:
        if c.kind == CellKind.PUT:
            cells.append(c._replace(seq=len(cells) + 100, value=b"rewrite"))
    return cells


@st.composite
def sourced(draw: st.DrawFn) -> tuple[list[Cell], list[list[Cell]]]:
    """A history split into 1-4 sorted sources (newest first), some cells in two sources."""
    cells = draw(histories())
    n = draw(st.integers(1, 4))
    sources: list[list[Cell]] = [[] for _ in range(n)]
    for c in cells:
        sources[draw(st.integers(0, n - 1))].append(c)
        if draw(st.integers(0, 9)) == 0:
            sources[draw(st.integers(0, n - 1))].append(c)
    return cells, [sorted(set(s), key=cell_sort_key) for s in sources]


# --- properties -------------------------------------------------------------------------------

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(sourced())
def test_merge_is_sorted_union_without_duplicates(
    data: tuple[list[Cell], list[list[Cell]]],
) -> None:
    cells, sources = data
    merged = list(merge_sources(sources))
    assert merged == sorted(set(cells), key=cell_sort_key)


@FAST
@given(sourced(), gc_rules_st, st.none() | st.integers(0, 45))
def test_visible_cells_matches_model(
    data: tuple[list[Cell], list[list[Cell]]],
    rules: dict[str, GcRule | None],
    snapshot: int | None,
) -> None:
    cells, sources = data
    got = list(
        visible_cells(merge_sources(sources), gc_rules=rules, now_micros=NOW, snapshot_seq=snapshot)
    )
    assert got == model_visible(cells, rules, NOW, snapshot)


@FAST
@given(sourced(), gc_rules_st)
def test_major_compaction_equals_visibility(
    data: tuple[list[Cell], list[list[Cell]]], rules: dict[str, GcRule | None]
) -> None:
    _, sources = data
    major = list(compact_cells(merge_sources(sources), gc_rules=rules, now_micros=NOW, major=True))
    assert major == list(visible_cells(merge_sources(sources), gc_rules=rules, now_micros=NOW))
    assert all(c.kind == CellKind.PUT for c in major)


@FAST
@given(sourced(), gc_rules_st, st.data())
def test_minor_compaction_of_newest_sources_preserves_reads(
    data: tuple[list[Cell], list[list[Cell]]],
    rules: dict[str, GcRule | None],
    more: st.DataObject,
) -> None:
    cells, sources = data
    k = more.draw(st.integers(1, len(sources)))
    compacted = list(
        compact_cells(merge_sources(sources[:k]), gc_rules=rules, now_micros=NOW, major=False)
    )
    assert len(compacted) <= len(set().union(*map(set, sources[:k])))
    after = [compacted, *sources[k:]]
    expected = model_visible(cells, rules, NOW)
    assert list(visible_cells(merge_sources(after), gc_rules=rules, now_micros=NOW)) == expected
    # ... and later, when GC has moved on: still the same as never having compacted.
    later = NOW + 3 * SEC
    assert list(
        visible_cells(merge_sources(after), gc_rules=rules, now_micros=later)
    ) == model_visible(cells, rules, later)


@FAST
@given(sourced(), gc_rules_st, st.integers(1, 7))
async def test_async_pipeline_matches_sync(
    data: tuple[list[Cell], list[list[Cell]]], rules: dict[str, GcRule | None], batch: int
) -> None:
    _, sources = data

    async def cells_of(src: list[Cell]) -> AsyncIterator[Cell]:
        for c in src:
            yield c

    async def batches_of(src: list[Cell]) -> AsyncIterator[list[Cell]]:
        for i in range(0, len(src), batch):
            yield src[i : i + batch]
        yield []  # empty batches are skipped

    kinds = [sources[0]] + [
        cells_of(s) if i % 2 else batches_of(s) for i, s in enumerate(sources[1:])
    ]
    expected = list(merge_sources(sources))
    got_batches = [b async for b in amerge_batches(kinds, batch_size=batch)]
    assert all(got_batches)
    assert [c for b in got_batches for c in b] == expected

    def again() -> list[object]:
        return [sources[0]] + [batches_of(s) for s in sources[1:]]

    vis = [
        c
        async for c in acells(
            avisible_batches(amerge_batches(again()), gc_rules=rules, now_micros=NOW)
        )
    ]
    assert vis == list(visible_cells(expected, gc_rules=rules, now_micros=NOW))
    vis2 = [
        c async for c in avisible_cells(amerge_sources(again()), gc_rules=rules, now_micros=NOW)
    ]
    assert vis2 == vis
    for major in (False, True):
        want = list(compact_cells(expected, gc_rules=rules, now_micros=NOW, major=major))
        got = [
            c
            async for c in acells(
                acompact_batches(
                    amerge_batches(again()), gc_rules=rules, now_micros=NOW, major=major
                )
            )
        ]
        assert got == want
        got2 = [
            c
            async for c in acompact_cells(
                amerge_sources(again()), gc_rules=rules, now_micros=NOW, major=major
            )
        ]
        assert got2 == want
    rows = [(r, cs) async for r, cs in agroup_rows(amerge_sources(again()))]
    assert rows == list(group_rows(expected))


# --- examples ---------------------------------------------------------------------------------


def visible(cells: Sequence[Cell], **kw: object) -> list[Cell]:
    rules = kw.pop("gc_rules", {})
    return list(
        visible_cells(sorted(cells, key=cell_sort_key), gc_rules=rules, now_micros=NOW, **kw)  # type: ignore[arg-type]
    )


def test_deletes_mask_only_smaller_seqs() -> None:
    old = put(b"r", "a", b"q", NOW - 5, 1)
    new = put(b"r", "a", b"q", NOW - 9, 3)  # older timestamp, written after the delete
    assert visible([old, new, del_row(b"r", 2)]) == [new]
    assert visible([old, new, del_fam(b"r", "a", 2)]) == [new]
    assert visible([old, new, del_col(b"r", "a", b"q", 0, TS_MAX, 2)]) == [new]
    assert visible([old, new, del_col(b"r", "a", b"q", NOW - 5, NOW - 4, 2)]) == [new]
    assert visible([old, new, del_col(b"r", "a", b"q", NOW - 4, NOW, 2)]) == [old, new]
    assert visible([old, new, del_fam(b"r", "b", 2)]) == [old, new]


def test_rewrite_keeps_newest_seq_and_snapshot_hides_later_writes() -> None:
    a = put(b"r", "a", b"q", 7, 1, b"first")
    b = put(b"r", "a", b"q", 7, 2, b"second")
    assert visible([a, b]) == [b]
    assert visible([a, b], snapshot_seq=1) == [a]
    d = del_row(b"r", 3)
    assert visible([a, b, d], snapshot_seq=2) == [b]
    assert visible([a, b, d], drop_deletions=False) == [d]


def test_gc_counts_only_visible_versions() -> None:
    versions = [put(b"r", "a", b"q", NOW - i, 10 + i) for i in range(4)]
    masked_newest = del_col(b"r", "a", b"q", NOW, NOW + 1, 20)
    got = visible([*versions, masked_newest], gc_rules={"a": MaxVersionsRule(max_versions=2)})
    assert got == versions[1:3]


def test_malformed_entries_are_corruption() -> None:
    with pytest.raises(Corruption, match="kind"):
        visible([Cell(b"r", "a", b"q", 1, 1, 9, b"")])
    with pytest.raises(Corruption, match="range"):
        visible([Cell(b"r", "a", b"q", TS_MAX, 1, CellKind.DELETE_COLUMN, b"short")])


def test_minor_compaction_keeps_deletions_and_drops_subsumed_ones() -> None:
    cells = sorted(
        [
            del_row(b"r", 5),
            del_row(b"r", 2),
            del_fam(b"r", "a", 4),  # subsumed by the row delete with seq 5
            del_fam(b"r", "b", 7),
            del_col(b"r", "b", b"q", 0, 10, 6),  # subsumed by the family delete seq 7
            del_col(b"r", "b", b"z", 0, 10, 9),
            del_col(b"r", "b", b"z", 2, 5, 8),  # inside [0, 10) with a smaller seq
            del_col(b"r", "b", b"z", 5, 15, 8),  # not inside [0, 10): kept
            put(b"r", "b", b"z", 20, 10),
            put(b"r", "b", b"z", 3, 1),  # masked
        ],
        key=cell_sort_key,
    )
    out = list(compact_cells(cells, gc_rules={}, now_micros=NOW, major=False))
    assert out == sorted(
        [
            del_row(b"r", 5),
            del_fam(b"r", "b", 7),
            del_col(b"r", "b", b"z", 0, 10, 9),
            del_col(b"r", "b", b"z", 5, 15, 8),
            put(b"r", "b", b"z", 20, 10),
        ],
        key=cell_sort_key,
    )


def test_group_rows() -> None:
    cells = [put(b"a", "a", b"", 1, 1), put(b"a", "b", b"", 1, 2), put(b"b", "a", b"", 1, 3)]
    assert list(group_rows(cells)) == [(b"a", cells[:2]), (b"b", cells[2:])]
    assert list(group_rows([])) == []


async def test_async_merge_does_not_fetch_blocks_a_limited_reader_never_needs() -> None:
    pulled: list[int] = []

    async def blocks() -> AsyncIterator[list[Cell]]:
        for i in range(3):
            pulled.append(i)
            yield [put(b"r%d" % i, "a", b"", 1, 10 + i)]

    memtable = [put(b"r0", "b", b"", 1, 1), put(b"r9", "a", b"", 1, 2)]
    merged = amerge_sources([memtable, blocks()])
    first = await anext(merged)
    assert (first.row, first.family) == (b"r0", "a")
    assert pulled == [0]  # a reader that stops here never fetched block 1
    second = await anext(merged)
    assert (second.row, second.family) == (b"r0", "b")
    assert pulled == [0, 1]  # ordering r0:b needed block 1's first key
    await merged.aclose()
