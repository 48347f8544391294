"""The split and merge planners (§5, §5.2): pure functions of records and block indexes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletstore.engine import split_key as splitting
from tabletstore.engine.split_key import BlockSpan, choose_split_key
from tabletstore.master import tablet_merges as merging
from tabletstore.master.assignment import TabletLoad, plan
from tabletstore.metadata.record import LogRef, SSTableRef, TabletRecord


def ref(key: str, size: int, first: bytes, last: bytes) -> SSTableRef:
    return SSTableRef(key, size, 1, 1, 1, first, last)


def rec(
    tid: str, start: bytes, end: bytes | None, *refs: SSTableRef, table: str = "T"
) -> TabletRecord:
    return TabletRecord(table, tid, start, end, sstables={"g": tuple(refs)} if refs else {})


# ---------------------------------------------------------------- split key


def test_split_key_halves_the_bytes() -> None:
    blocks = [BlockSpan(b"a", b"b", 10), BlockSpan(b"c", b"d", 10), BlockSpan(b"e", b"f", 10)]
    blocks.append(BlockSpan(b"g", b"h", 10))
    assert choose_split_key(b"", None, blocks) == b"e"


def test_split_key_weighs_bytes_not_blocks() -> None:
    blocks = [BlockSpan(b"a", b"a", 100), BlockSpan(b"b", b"b", 1), BlockSpan(b"c", b"c", 1)]
    assert choose_split_key(b"", None, blocks) == b"b"


def test_a_single_row_never_splits() -> None:
    # One huge row spread over many blocks: every block starts with the same row.
    blocks = [BlockSpan(b"row", b"row", 1000) for _ in range(5)]
    assert choose_split_key(b"", None, blocks) is None
    assert choose_split_key(b"", None, []) is None


def test_split_key_ignores_blocks_outside_the_range() -> None:
    # A child still sharing its parent's SSTable: only its own part counts.
    blocks = [BlockSpan(bytes([c]), bytes([c]), 10) for c in b"abcdefgh"]
    key = choose_split_key(b"e", None, blocks)
    assert key in (b"f", b"g")
    assert choose_split_key(b"", b"c", blocks) == b"b"
    assert choose_split_key(b"", b"b", blocks) is None  # only row a left


@given(
    rows=st.lists(st.binary(min_size=1, max_size=3), min_size=1, max_size=30),
    sizes=st.lists(st.integers(1, 1000), min_size=30, max_size=30),
    start=st.binary(max_size=2),
)
def test_split_key_leaves_rows_on_both_sides(
    rows: list[bytes], sizes: list[int], start: bytes
) -> None:
    ordered = sorted(rows)
    blocks = [
        BlockSpan(ordered[i], ordered[min(i + 1, len(ordered) - 1)], sizes[i])
        for i in range(len(ordered))
    ]
    key = choose_split_key(start, None, blocks)
    present = [r for r in ordered if r >= start]
    if key is None:
        assert len(set(present)) <= 1 or all(
            b.first_row <= min(present) for b in blocks if b.first_row >= start
        )
        return
    assert key > start
    assert any(r < key for r in present), "left side empty"
    assert any(r >= key for r in present), "right side empty"


# ---------------------------------------------------------------- should split / children


def test_should_split_only_tablets_owning_their_sstables() -> None:
    big = rec("p", b"", None, ref("k1", 1000, b"a", b"z"))
    assert splitting.should_split(big, 1000)
    assert not splitting.should_split(big, 1001)
    child = rec("c", b"m", None, ref("k1", 1000, b"a", b"z"))
    assert not splitting.owns_its_sstables(child)
    assert not splitting.should_split(child, 10)
    left = rec("l", b"", b"m", ref("k1", 1000, b"a", b"z"))
    assert not splitting.should_split(left, 10)
    assert splitting.owns_its_sstables(rec("l", b"", b"m", ref("k2", 5, b"a", b"l")))


def test_split_records_share_sstables_redo_point_and_logs() -> None:
    parent = TabletRecord(
        "T",
        "p",
        b"b",
        b"y",
        sstables={"g": (ref("k1", 10, b"b", b"x"),)},
        redo_seq=42,
        logs=(LogRef("w", 3),),
        epoch=7,
    )
    left, right = splitting.split_records(
        parent,
        b"m",
        left_id="l",
        right_id="r",
        left_epoch=8,
        right_epoch=9,
        location="addr",
        at=1.0,
    )
    assert (left.start_row, left.end_row, right.start_row, right.end_row) == (
        b"b",
        b"m",
        b"m",
        b"y",
    )
    assert right.row_key == parent.row_key  # the right child keeps the parent's METADATA row
    for child, epoch in ((left, 8), (right, 9)):
        assert child.sstables == parent.sstables
        assert (child.redo_seq, child.logs, child.epoch) == (42, parent.logs, epoch)
        assert child.location == "addr"
        assert child.events[-1].kind == "split"
    with pytest.raises(ValueError, match="both sides"):
        splitting.split_records(
            parent, b"b", left_id="l", right_id="r", left_epoch=1, right_epoch=2,
            location=None, at=0.0,
        )  # fmt: skip
    with pytest.raises(ValueError, match="both sides"):
        splitting.split_records(
            parent, b"z", left_id="l", right_id="r", left_epoch=1, right_epoch=2,
            location=None, at=0.0,
        )  # fmt: skip


# ---------------------------------------------------------------- merges


SPLIT = 8000  # small < 1000, combined < 4000


def test_small_adjacent_pairs() -> None:
    a = rec("a", b"", b"c", ref("ka", 100, b"a", b"b"))
    b = rec("b", b"c", b"f", ref("kb", 100, b"d", b"e"))
    c = rec("c", b"f", b"k", ref("kc", 5000, b"g", b"h"))
    d = rec("d", b"k", None)
    pairs = merging.small_pairs([c, a, d, b], SPLIT)
    assert [(p.left.tablet_id, p.right.tablet_id) for p in pairs] == [("a", "b")]
    # A child still sharing SSTables with its sibling never merges.
    shared = rec("s", b"k", None, ref("kc", 10, b"a", b"z"))
    e = rec("e", b"f", b"k")
    assert merging.small_pairs([e, shared], SPLIT) == []
    # Two small ones that are too big together.
    x = rec("x", b"", b"m", ref("kx", 900, b"a", b"b"))
    y = rec("y", b"m", None, ref("ky", 900, b"n", b"o"))
    assert merging.small_pairs([x, y], 3000) == []


def test_plan_merges_waits_and_throttles() -> None:
    recs = [rec(str(i), bytes([97 + i]), bytes([98 + i])) for i in range(4)]
    pairs = merging.small_pairs(recs, SPLIT)
    assert len(pairs) == 3
    since = {p.key: 100.0 for p in pairs}
    assert merging.plan_merges(pairs, since, now=150.0, merge_after=60.0) == []
    assert merging.plan_merges(pairs, {}, now=150.0, merge_after=60.0) == []
    chosen = merging.plan_merges(pairs, since, now=160.0, merge_after=60.0, limit=3)
    # No tablet in two merges at once: (0,1) and (2,3), not (1,2).
    assert [(p.left.tablet_id, p.right.tablet_id) for p in chosen] == [("0", "1"), ("2", "3")]
    assert len(merging.plan_merges(pairs, since, now=160.0, merge_after=60.0)) == 1


def test_merged_record_unions_sstables() -> None:
    a = TabletRecord(
        "T", "a", b"", b"m", sstables={"g": (ref("k1", 1, b"a", b"b"),)}, redo_seq=5, epoch=3
    )
    b = TabletRecord(
        "T",
        "b",
        b"m",
        None,
        sstables={"g": (ref("k2", 1, b"n", b"o"),), "h": (ref("k3", 1, b"n", b"n"),)},
        redo_seq=9,
        epoch=4,
    )
    m = merging.merged_record(merging.MergePair(a, b), tablet_id="m", at=2.0)
    assert (m.start_row, m.end_row, m.row_key) == (b"", None, b.row_key)
    assert [r.key for r in m.sstables["g"]] == ["k1", "k2"]
    assert [r.key for r in m.sstables["h"]] == ["k3"]
    assert (m.redo_seq, m.logs, m.location, m.epoch) == (9, (), None, 4)
    assert m.events[-1].kind == "merged"


# ---------------------------------------------------------------- balancing


def test_balancing_moves_to_a_new_worker_but_not_unmovable_tablets() -> None:
    tablets = [TabletLoad("T", f"t{i}", "w1", size=100) for i in range(6)]
    moves = plan(["w1", "w2"], tablets, balance=True, max_moves=2)
    assert len(moves) == 2 and all(m.source == "w1" and m.worker == "w2" for m in moves)
    pinned = [TabletLoad("T", f"t{i}", "w1", size=100, movable=False) for i in range(6)]
    assert plan(["w1", "w2"], pinned, balance=True) == []


def test_a_split_inside_one_block_takes_its_middle_row() -> None:
    # One block holds the whole tablet: no key between blocks, so the worker reads the widest
    # block's rows and splits at the middle one.
    one = [BlockSpan(b"a", b"z", 500)]
    assert choose_split_key(b"", None, one) is None
    assert splitting.widest_block(b"", None, one) == one[0]
    assert splitting.widest_block(b"", None, [BlockSpan(b"k", b"k", 9)]) is None
    assert splitting.middle_row([b"a", b"b", b"c", b"d"], b"") == b"c"
    assert splitting.middle_row([b"a"], b"") is None
    assert splitting.middle_row([b"m", b"n"], b"n") is None


def test_balancing_leaves_small_imbalances_alone() -> None:
    # 2 tablets against 1: within a ratio of 2, nothing moves; a ratio of 1 moves the lighter.
    tablets = [
        TabletLoad("T", "a", "w1", size=400),
        TabletLoad("T", "b", "w1", size=50),
        TabletLoad("T", "c", "w2", size=300),
    ]
    assert plan(["w1", "w2"], tablets, balance=True, ratio=2.0) == []
    moves = plan(["w1", "w2"], tablets, balance=True, ratio=1.0)
    assert [(m.tablet_id, m.worker) for m in moves] == [("b", "w2")]
