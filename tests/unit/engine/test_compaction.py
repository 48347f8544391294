"""The compaction planner and merge (§5.4): pure functions of records and bytes."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.data.schema import MaxAgeRule, MaxVersionsRule
from tabletstore.engine.compaction import (
    CompactionTask,
    GroupSettings,
    merge_sstables,
    overlap_depth,
    plan,
    plan_major,
    rewrite_tablet,
)
from tabletstore.engine.iterators import merge_sources, visible_cells
from tabletstore.errors import Corruption
from tabletstore.keys import TS_MAX, Cell, CellKind, cell_sort_key, encode_ts_range
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tabletstore.options import TabletOptions
from tabletstore.sstable import (
    SSTableCore,
    SSTableInfo,
    iter_sstable_bytes,
    read_sstable_bytes,
    write_sstable,
)

NOW = 1_000_000_000


def ref(key: str, size: int = 100) -> SSTableRef:
    return SSTableRef(key, size, 1, 1, 1, b"a", b"z")


def record(groups: dict[str, int], sizes: dict[str, list[int]] | None = None) -> TabletRecord:
    sizes = sizes or {}
    return TabletRecord(
        "t",
        "t0",
        b"",
        None,
        sstables={
            g: tuple(ref(f"{g}{i}", (sizes.get(g) or [100] * n)[i]) for i in range(n))
            for g, n in groups.items()
        },
    )


def test_plan_leaves_groups_within_the_limit_alone() -> None:
    assert plan(record({"a": 2, "b": 0}), TabletOptions(max_sstables_per_group=2)) == []


def test_plan_merges_sstables_of_equal_size_all_at_once() -> None:
    # Equal sizes: merging all of them rewrites the fewest bytes per SSTable removed.
    tasks = plan(record({"b": 5, "a": 3}), TabletOptions(max_sstables_per_group=2))
    assert tasks == [
        CompactionTask("a", ("a0", "a1", "a2"), major=True),
        CompactionTask("b", ("b0", "b1", "b2", "b3", "b4"), major=True),
    ]


def test_plan_leaves_a_large_old_sstable_alone() -> None:
    # The newest merged table is large: merging the small ones behind it is cheaper than
    # rewriting it again (the old policy merged the newest two at every flush).
    rec = record({"a": 5}, {"a": [10, 400, 10, 10, 1000]})
    tasks = plan(rec, TabletOptions(max_sstables_per_group=4))
    assert tasks == [CompactionTask("a", ("a2", "a3"), major=False)]


def test_plan_prefers_the_newer_window_on_a_tie() -> None:
    rec = record({"a": 4}, {"a": [10, 10, 10, 10]})
    assert plan(rec, TabletOptions(max_sstables_per_group=3)) == [
        CompactionTask("a", ("a0", "a1", "a2", "a3"), major=True)
    ]
    rec = record({"a": 4}, {"a": [50, 10, 10, 50]})
    assert plan(rec, TabletOptions(max_sstables_per_group=3)) == [
        CompactionTask("a", ("a1", "a2"), major=False)
    ]


def test_size_tiered_merges_rewrite_less_as_the_tablet_grows() -> None:
    """Bytes rewritten by merges per byte flushed, over 16 equal flushes with a limit of 4:
    the old newest-first policy rewrote 5.6x, the size-tiered one at most 2x."""
    rewritten, refs = 0, []
    for i in range(16):
        refs.insert(0, ref(f"s{i}", 100))
        rec = TabletRecord("t", "t0", b"", None, sstables={"a": tuple(refs)})
        for task in plan(rec, TabletOptions(max_sstables_per_group=4)):
            taken = [r for r in refs if r.key in task.inputs]
            size = sum(r.size for r in taken)
            rewritten += size
            at = refs.index(taken[0])
            refs = [*refs[:at], ref(f"m{i}", size), *refs[at + len(taken) :]]
        assert len(refs) <= 4
    assert rewritten <= 2 * 16 * 100


def test_plan_taking_every_sstable_is_major() -> None:
    for limit in (0, 1):  # a limit below one means one
        tasks = plan(record({"a": 3}), TabletOptions(max_sstables_per_group=limit))
        assert tasks == [CompactionTask("a", ("a0", "a1", "a2"), major=True)]


def test_plan_major_takes_every_group_with_sstables() -> None:
    assert plan_major(record({"b": 1, "a": 2, "c": 0})) == [
        CompactionTask("a", ("a0", "a1"), major=True),
        CompactionTask("b", ("b0",), major=True),
    ]


def span(key: str, first: bytes, last: bytes, cells: int = 1) -> SSTableRef:
    return SSTableRef(key, 100, cells, 1, 1, first, last)


def test_overlap_depth_counts_the_sstables_that_may_hold_one_row() -> None:
    assert overlap_depth([]) == 0
    assert overlap_depth([span("a", b"a", b"c"), span("b", b"d", b"f")]) == 1
    assert overlap_depth([span("a", b"a", b"c"), span("b", b"c", b"f")]) == 2  # both hold c
    refs = [span("a", b"a", b"z"), span("b", b"b", b"c"), span("c", b"d", b"e")]
    assert overlap_depth(refs) == 2
    assert overlap_depth([span("a", b"a", b"z"), span("e", b"", b"", cells=0)]) == 1


def test_plan_leaves_disjoint_sstables_alone_up_to_the_cap() -> None:
    options = TabletOptions(max_sstables_per_group=2, max_disjoint_sstables_per_group=5)
    disjoint = [span(f"a{i}", b"%02d" % (9 - i), b"%02da" % (9 - i)) for i in range(5)]
    rec = TabletRecord("t", "t0", b"", None, sstables={"a": tuple(disjoint)})
    assert plan(rec, options) == []  # sequential writes: a read looks into one of them
    rec = TabletRecord("t", "t0", b"", None, sstables={"a": (span("n", b"00", b"99"), *disjoint)})
    tasks = plan(rec, options)  # one SSTable spans them all: depth 2, but 6 > the cap of 5
    assert len(tasks) == 1 and len(tasks[0].inputs) >= 5
    overlapping = (span("x", b"00", b"99"), span("y", b"00", b"99"), *disjoint[:1])
    rec = TabletRecord("t", "t0", b"", None, sstables={"a": overlapping})
    assert len(plan(rec, options)) == 1  # three may hold row 09: over the limit of 2


@given(
    st.dictionaries(st.sampled_from("abcd"), st.lists(st.integers(0, 1000), max_size=9)),
    st.integers(1, 5),
)
def test_plan_brings_every_group_to_at_most_the_limit(
    sizes: dict[str, list[int]], limit: int
) -> None:
    groups = {g: len(s) for g, s in sizes.items()}
    rec = record(groups, sizes)
    after = dict(groups)
    for task in plan(rec, TabletOptions(max_sstables_per_group=limit)):
        refs = [r.key for r in rec.sstables[task.group]]
        at = refs.index(task.inputs[0])
        assert list(task.inputs) == refs[at : at + len(task.inputs)]  # consecutive, in order
        assert task.major == (len(task.inputs) == len(refs))
        after[task.group] -= len(task.inputs) - 1
    assert all(n <= limit for n in after.values())
    assert all(after[g] == n for g, n in groups.items() if n <= limit)


# ------------------------------------------------------------------------------------ merging


def put(row: bytes, q: bytes, ts: int, seq: int, family: str = "f") -> Cell:
    return Cell(row, family, q, ts, seq, CellKind.PUT, b"v%d" % seq)


def del_col(row: bytes, q: bytes, start: int, end: int, seq: int) -> Cell:
    return Cell(row, "f", q, TS_MAX, seq, CellKind.DELETE_COLUMN, encode_ts_range(start, end))


def blob(cells: list[Cell]) -> bytes:
    return write_sstable(sorted(cells, key=cell_sort_key), block_size=1024)[0]


def merge(inputs: list[list[Cell]], *, major: bool, **kw: object) -> list[Cell]:
    data, info = merge_sstables(
        [blob(c) for c in inputs],
        gc_rules=kw.pop("gc_rules", {}),  # type: ignore[arg-type]
        now_micros=NOW,
        major=major,
        compression="zstd",
        block_size=1024,
        locality_group="g",
        **kw,  # type: ignore[arg-type]
    )
    cells = read_sstable_bytes(data) if info.cells else []
    assert info.cells == len(cells)
    return cells


def test_major_merge_applies_deletions_and_gc_and_keeps_no_deletion_entries() -> None:
    newer = [del_col(b"r", b"q", 0, 15, 10), put(b"r", b"q", 30, 11)]
    older = [put(b"r", b"q", 10, 1), put(b"r", b"q", 20, 2), put(b"r", b"q", 25, 3)]
    out = merge([newer, older], major=True, gc_rules={"f": MaxVersionsRule(max_versions=2)})
    assert [(c.ts, c.seq) for c in out] == [(30, 11), (25, 3)]
    assert all(c.kind == CellKind.PUT for c in out)


def test_non_major_merge_keeps_deletion_entries_and_version_gc_for_later() -> None:
    newer = [del_col(b"r", b"q", 0, 15, 10)]
    older = [put(b"r", b"q", 10, 1), put(b"r", b"q", 20, 2), put(b"r", b"q", 25, 3)]
    out = merge([newer, older], major=False, gc_rules={"f": MaxVersionsRule(max_versions=1)})
    # The masked put goes, the deletion entry stays (it may mask older SSTables' cells), and
    # no version is dropped by count (newer sources outside the merge change the count).
    assert [(c.kind, c.ts) for c in out] == [(CellKind.DELETE_COLUMN, TS_MAX), (0, 25), (0, 20)]


def test_non_major_merge_drops_what_age_collects_even_as_newest() -> None:
    old = NOW - 10_000_000
    out = merge(
        [[put(b"r", b"q", old, 1), put(b"r", b"p", NOW, 2)]],
        major=False,
        gc_rules={"f": MaxAgeRule(max_age_seconds=5)},
    )
    assert [c.qualifier for c in out] == [b"p"]


def test_merge_with_families_leaves_dropped_families_out() -> None:
    row_del = Cell(b"r", "", b"", TS_MAX, 9, CellKind.DELETE_ROW, b"")
    cells = [row_del, put(b"r", b"q", 5, 10, "gone"), put(b"r", b"q", 5, 11, "f")]
    out = merge([cells], major=False, families={"f"})
    assert [(c.family, c.kind) for c in out] == [("", CellKind.DELETE_ROW), ("f", CellKind.PUT)]
    assert merge([cells], major=True, families={"f"}) == [cells[2]]


def test_merge_of_nothing_visible_is_empty() -> None:
    assert (
        merge([[put(b"r", b"q", 1, 1)], [Cell(b"r", "", b"", TS_MAX, 5, 3, b"")]], major=True) == []
    )


cells_st = st.builds(
    lambda row, q, ts, kind, start, width: (row, q, ts, kind, start, width),
    st.sampled_from([b"a", b"b"]),
    st.sampled_from([b"x", b"y"]),
    st.integers(0, 5),
    st.sampled_from(["put", "put", "col", "row"]),
    st.integers(0, 5),
    st.integers(0, 4),
)


# No per-example deadline: each example writes and reads up to six SSTables, which takes over
# hypothesis' default 200 ms on a loaded 2-core machine (a timing assertion, not a property).
@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(cells_st, max_size=8), min_size=1, max_size=4), st.booleans())
def test_merge_reads_like_its_inputs(specs: list[list[tuple]], gc: bool) -> None:  # type: ignore[type-arg]
    seq = 0
    sources: list[list[Cell]] = []
    for spec in reversed(specs):  # oldest first, so newer sources get larger seqs
        src = []
        for row, q, ts, kind, start, width in spec:
            seq += 1
            if kind == "put":
                src.append(put(row, q, ts, seq))
            elif kind == "col":
                src.append(del_col(row, q, start, start + width, seq))
            else:
                src.append(Cell(row, "", b"", TS_MAX, seq, CellKind.DELETE_ROW, b""))
        sources.insert(0, sorted(src, key=cell_sort_key))
    rules = {"f": MaxVersionsRule(max_versions=2)} if gc else {}
    expected = list(visible_cells(merge_sources(sources), gc_rules=rules, now_micros=NOW))
    assert merge(sources, major=True, gc_rules=rules) == expected
    # A non-major merge of the newest two, read together with the rest, reads the same.
    k = min(2, len(sources))
    partial = merge(sources[:k], major=False, gc_rules=rules)
    again = merge_sources([partial, *sources[k:]])
    assert list(visible_cells(again, gc_rules=rules, now_micros=NOW)) == expected


# ------------------------------------------------------------------- streaming through the merge


_BLOCK = 256 * 1024


def _big_inputs(n_inputs: int, cells_each: int) -> list[bytes]:
    """SSTables of 40,000-byte values that compress to almost nothing: large as Python cells,
    small as bytes (few cells in large blocks: tracemalloc slows every allocation)."""
    blobs = []
    for i in range(n_inputs):
        cells = [
            Cell(
                b"r%06d" % (j * n_inputs + i), "f", b"q", 1, j * n_inputs + i + 1, 0, b"v" * 40_000
            )
            for j in range(cells_each)
        ]
        blobs.append(write_sstable(cells, block_size=_BLOCK)[0])
    return blobs


def _traced_peak(call: Callable[[], object]) -> int:
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        call()
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_merge_holds_a_block_of_each_input_not_every_cell() -> None:
    """Four inputs of 250 cells of 40,000 bytes: 40 MB of values once decoded. Decoded one
    block at a time as the merge consumes them, the merge's Python memory stays at the
    writer's chunk of cells (4 MiB) and a block per input, however large the inputs."""
    inputs = _big_inputs(4, 250)
    out: list[tuple[bytes, SSTableInfo]] = []
    peak = _traced_peak(
        lambda: out.append(
            merge_sstables(
                inputs,
                gc_rules={},
                now_micros=NOW,
                major=False,
                compression="zstd",
                block_size=_BLOCK,
                locality_group="g",
            )
        )
    )
    assert out[0][1].cells == 1_000
    assert peak < 15_000_000, f"the merge held {peak / 1e6:.1f} MB of Python objects"


def test_a_major_rewrite_streams_into_each_locality_group() -> None:
    """The major compaction's rewrite feeds one builder per group from the one merged stream:
    both groups' SSTables are whole and right, and the rewrite never held every cell."""
    inputs = _big_inputs(2, 500)
    other = write_sstable(
        [Cell(b"r%06d" % j, "g", b"q", 1, 100_000 + j, 0, b"w" * 40_000) for j in range(500)],
        block_size=_BLOCK,
    )[0]
    out: list[dict[str, tuple[bytes, SSTableInfo]]] = []
    peak = _traced_peak(
        lambda: out.append(
            rewrite_tablet(
                [*inputs, other],
                family_groups={"f": "one", "g": "two"},
                groups={"one": GroupSettings("zstd", _BLOCK), "two": GroupSettings("lz4", _BLOCK)},
                gc_rules={},
                now_micros=NOW,
                start_row=b"r000010",
                end_row=b"r000900",
            )
        )
    )
    result = out[0]
    assert sorted(result) == ["one", "two"]
    one = read_sstable_bytes(result["one"][0])
    two = read_sstable_bytes(result["two"][0])
    assert [c.row for c in one] == [b"r%06d" % j for j in range(10, 900)]
    assert [c.row for c in two] == [b"r%06d" % j for j in range(10, 500)]
    assert {c.family for c in one} == {"f"} and {c.family for c in two} == {"g"}
    assert result["two"][1].compression == "lz4" and result["one"][1].compression == "zstd"
    assert peak < 15_000_000, f"the rewrite held {peak / 1e6:.1f} MB of Python objects"


def test_iter_sstable_bytes_clips_to_a_range_across_blocks() -> None:
    cells = [Cell(b"r%04d" % j, "f", b"q", 1, j + 1, 0, b"x" * 100) for j in range(2000)]
    data = write_sstable(cells, block_size=4096)[0]
    assert list(iter_sstable_bytes(data)) == cells
    assert list(iter_sstable_bytes(data, start_row=b"r0500", end_row=b"r1500")) == cells[500:1500]
    assert list(iter_sstable_bytes(data, start_row=b"r1999x")) == []
    assert list(iter_sstable_bytes(data, end_row=b"r")) == []
    assert [c.seq for c in iter_sstable_bytes(data, seq_base=10, end_row=b"r0001")] == [11]


def test_a_block_that_fails_its_checksum_fails_the_merge_when_reached() -> None:
    """Blocks are verified as the merge reaches them: a damaged block late in an input fails
    the whole merge with Corruption, and no SSTable comes out."""
    cells = [Cell(b"r%04d" % j, "f", b"q", 1, j + 1, 0, b"x" * 100) for j in range(2000)]
    data = bytearray(write_sstable(cells, block_size=4096)[0])
    core = SSTableCore.from_tail("t", len(data), bytes(data))
    last = core.blocks[-1]
    data[last.offset + last.length // 2] ^= 0xFF
    with pytest.raises(Corruption, match="checksum"):
        merge_sstables(
            [bytes(data), blob([put(b"a", b"q", 1, 5000)])],
            gc_rules={},
            now_micros=NOW,
            major=False,
            compression="zstd",
            block_size=4096,
            locality_group="g",
        )
