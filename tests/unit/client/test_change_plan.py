"""Change streams' pure decisions (client/change_plan.py): tokens and their errors, the
readable end of each log, the order of a batch, lanes and the partitions replacing one."""

from __future__ import annotations

import dataclasses

import pytest

from tabletstore.client import change_plan as plan
from tabletstore.client.change_plan import ChangePartition, Cursor, Lane, Logged, SegmentStamp
from tabletstore.commitlog.format import LogRecord
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import Cell, CellKind

NOW = 1_800_000_000.0


def _cursor(*lanes: Lane, since: float = 0.0, **kw: object) -> Cursor:
    return Cursor("t-1", lanes, since=since, made_at=NOW, **kw)  # type: ignore[arg-type]


def _logged(log: str, segment: int, index: int, at: float, row: bytes, seq: int) -> Logged:
    cell = Cell(row, "f", b"q", 1, seq, CellKind.PUT, b"v%d" % seq)
    return Logged(log, segment, index, at, LogRecord(segment, "t-1", row, seq, seq, [cell]))


def test_a_token_round_trips_and_names_its_table() -> None:
    c = _cursor(
        Lane(b"", b"m", {"w1/1": 3}),
        Lane(b"m", None, {"w1/1": 4, "w2/7": 0}),
        since=5.0,
        batch={"w1/1": 9},
        delivered=2,
        watermark=7.5,
    )
    assert plan.decode_token(plan.encode_token(c), "t-1", "t") == c
    with pytest.raises(InvalidArgument, match="another table"):
        plan.decode_token(plan.encode_token(c), "t-2", "t")
    with pytest.raises(InvalidArgument, match="not a change-stream token of table 't'"):
        plan.decode_token("bm90IGEgdG9rZW4", "t-1", "t")


def test_tokens_and_start_times_outside_the_retention_are_refused() -> None:
    plan.check_window("t", 3600.0, NOW - 3599, NOW)
    with pytest.raises(InvalidArgument, match="outside the change retention"):
        plan.check_window("t", 3600.0, NOW - 3601, NOW)
    with pytest.raises(InvalidArgument, match="keeps no changes"):
        plan.check_window("t", None, NOW, NOW)
    with pytest.raises(InvalidArgument, match="outside the change retention"):
        plan.check_since("t", 60.0, NOW - 61, NOW)
    with pytest.raises(InvalidArgument, match="in the future"):
        plan.check_since("t", 60.0, NOW + 60, NOW)


def _segs(*spec: tuple[int, int, float]) -> list[SegmentStamp]:
    return [SegmentStamp(n, size, at) for n, size, at in spec]


def test_readable_ends_stop_at_a_gap_a_fence_and_the_cut() -> None:
    logs = {
        # 2 missing within the in-flight window of 3: in flight, read up to it
        "a/1": _segs((0, 9, 1.0), (1, 9, 2.0), (3, 9, 3.0)),
        # a fence at 2: read up to it, whatever follows
        "b/1": _segs((0, 9, 1.0), (1, 9, 2.0), (2, 0, 2.5), (3, 9, 2.6)),
        # the cut at 5.0 ends it after segment 1
        "c/1": _segs((0, 9, 4.0), (1, 9, 5.0), (2, 9, 6.0)),
        # read from position 1 (segment 0's stamp is unknown: below every lane)
        "d/1": _segs((0, 9, None), (1, 9, 1.0)),  # type: ignore[arg-type]
    }
    ends = plan.readable_ends(logs, {"d/1": 1}, 5.0)
    assert ends == {"a/1": 2, "b/1": 2, "c/1": 2, "d/1": 2}
    lost = {"e/1": _segs((0, 9, 1.0), *((n, 9, 1.0) for n in range(2, 20)))}
    with pytest.raises(Corruption, match="segment 1 is missing below segment 19"):
        plan.readable_ends(lost, {}, 5.0)


def _landed(*spec: tuple[int, float, float]) -> list[SegmentStamp]:
    """Segments (number, stamp, landing time by the store's clock)."""
    return [SegmentStamp(n, 9, at, landed) for n, at, landed in spec]


def test_a_writer_whose_clock_was_stepped_back_loses_nothing_after_the_start() -> None:
    # Worker w5's clock is stepped 30 s back at 110 while a reader follows from 105: its
    # later segments are stamped before the read's start time, but come after its position.
    logs = {
        "w5/1": _landed((0, 100.0, 100.2), (1, 106.0, 106.2), (2, 81.0, 111.2), (3, 82.0, 112.2))
    }
    positions = plan.start_positions(logs, 105.0)
    assert positions == {"w5/1": 1}
    cut, _ = plan.cut_of(120.0)
    ends = plan.readable_ends(logs, positions, cut)
    assert ends == {"w5/1": 4}
    read = [
        _logged("w5/1", 1, 0, 106.0, b"a", 1),
        _logged("w5/1", 2, 0, 81.0, b"b", 2),
        _logged("w5/1", 3, 0, 82.0, b"a", 3),
    ]
    c = _cursor(Lane(b"", None, positions), since=105.0)
    got = [(x.record.row, x.record.first_seq) for x in plan.order_changes(c, ends, read)]
    assert sorted(got) == [(b"a", 1), (b"a", 3), (b"b", 2)]
    assert [s for r, s in got if r == b"a"] == [1, 3]
    # A read from 105 that starts after the step: the segments that landed after the start
    # time are read, whatever their stamps.
    stepped = {"w5/1": _landed((0, 100.0, 100.2), (1, 76.0, 106.2), (2, 77.0, 107.2))}
    assert plan.start_positions(stepped, 105.0) == {"w5/1": 1}


def test_a_writer_whose_clock_runs_ahead_is_read_once_its_segments_landed() -> None:
    # Worker w5's clock is 30 s ahead: its segments landed before the cut by the store's
    # clock, so they are read now, and the watermark (which counts them) is not a lie.
    logs = {
        "w5/1": _landed((0, 130.0, 100.0), (1, 131.0, 101.0), (2, 140.0, 110.0)),
        "w6/1": _landed((0, 100.5, 100.5), (1, 112.0, 111.9)),
    }
    cut, watermark = plan.cut_of(107.0)
    assert plan.readable_ends(logs, {}, cut) == {"w5/1": 2, "w6/1": 1}
    # Every segment a write acknowledged before the watermark is in landed before the cut.
    assert watermark + plan.CLOCK_SKEW + plan.LANDED_RESOLUTION <= cut


def test_start_positions_begin_at_the_first_segment_stamped_at_the_start() -> None:
    logs = {
        "a/1": _segs((0, 9, 1.0), (1, 9, 5.0), (2, 9, 6.0)),
        "b/1": _segs((0, 9, 1.0)),
        "c/1": _segs((0, 9, 1.0), (1, 0, 2.0)),
    }
    assert plan.start_positions(logs, 5.0) == {"a/1": 1, "b/1": 1, "c/1": 1}


def test_a_batch_keeps_each_rows_seq_order_across_logs_whatever_their_clocks() -> None:
    # Row r moved from worker a (clock ahead) to worker b: b's records of r have larger seqs
    # but earlier stamps. Row x on a, row y on b.
    read = [
        _logged("a/1", 0, 0, 10.0, b"r", 5),
        _logged("a/1", 0, 1, 10.0, b"x", 6),
        _logged("b/1", 0, 0, 9.0, b"r", 40),
        _logged("b/1", 1, 0, 9.5, b"y", 41),
        _logged("b/1", 1, 1, 9.5, b"r", 42),
    ]
    c = _cursor(Lane(b"", None, {}))
    got = [
        (x.record.row, x.record.first_seq)
        for x in plan.order_changes(c, {"a/1": 1, "b/1": 2}, read)
    ]
    assert [s for r, s in got if r == b"r"] == [5, 40, 42]
    assert sorted(got) == sorted((x.record.row, x.record.first_seq) for x in read)
    # The same segments give the same order (what a token mid-batch relies on).
    assert plan.order_changes(c, {"a/1": 1, "b/1": 2}, list(reversed(read))) == (
        plan.order_changes(c, {"a/1": 1, "b/1": 2}, read)
    )


def test_a_batch_takes_each_lanes_rows_from_its_own_positions_whatever_their_stamps() -> None:
    read = [
        _logged("a/1", 0, 0, 1.0, b"b", 1),  # before lane [a, m)'s position 1
        _logged("a/1", 1, 0, 2.0, b"c", 2),
        _logged("a/1", 0, 1, 1.0, b"p", 3),  # lane [m, end) reads from 0
        _logged("a/1", 2, 0, 3.0, b"q", 4),  # past the batch's end
        _logged("a/1", 1, 1, 0.5, b"z", 5),  # stamped before the start time: still after it
    ]
    c = _cursor(Lane(b"a", b"m", {"a/1": 1}), Lane(b"m", None, {}), since=0.9)
    got = [x.record.row for x in plan.order_changes(c, {"a/1": 2}, read)]
    assert got == [b"z", b"p", b"c"]
    other = dataclasses.replace(read[2], record=read[2].record._replace(table_id="t-9"))
    assert plan.order_changes(c, {"a/1": 2}, [other]) == []


def test_settle_brings_lanes_level_and_joins_them() -> None:
    c = _cursor(Lane(b"", b"m", {"a/1": 1}), Lane(b"m", None, {"a/1": 3, "b/1": 2}))
    after = plan.settle(replace_batch(c), {"a/1": 4, "b/1": 2})
    assert after.lanes == (Lane(b"", None, {"a/1": 4, "b/1": 2}),)
    assert after.batch is None and after.delivered == 0
    ahead = plan.settle(c, {"a/1": 2})
    assert [dict(x.positions) for x in ahead.lanes] == [{"a/1": 2}, {"a/1": 3, "b/1": 2}]


def replace_batch(c: Cursor) -> Cursor:
    return Cursor(c.table_id, c.lanes, c.since, c.made_at, {"a/1": 4}, 3)


def test_a_split_hands_each_half_its_part_and_a_merge_needs_every_token() -> None:
    pos = {"a/1": 7}
    parent = _cursor(Lane(b"c", b"k", pos))
    assert (
        plan.successors(parent, [ChangePartition(b"", b"c"), ChangePartition(b"c", b"k")]) is None
    )
    halves = plan.successors(
        parent,
        [ChangePartition(b"c", b"f"), ChangePartition(b"f", b"k"), ChangePartition(b"k", None)],
    )
    assert halves is not None
    assert [(p, [(x.start, x.end) for x in c.lanes]) for p, c in halves] == [
        (ChangePartition(b"c", b"f"), [(b"c", b"f")]),
        (ChangePartition(b"f", b"k"), [(b"f", b"k")]),
    ]
    # Half-way (a gap in the tablets): not yet.
    assert plan.successors(parent, [ChangePartition(b"c", b"f")]) is None
    # A merge of [c, f) and [f, k) into [c, k): each parent hands its part.
    merged = ChangePartition(b"c", b"k")
    left = plan.successors(_cursor(Lane(b"c", b"f", {"a/1": 2})), [merged])
    right = plan.successors(_cursor(Lane(b"f", b"k", {"a/1": 5})), [merged])
    assert left is not None and right is not None
    assert left[0][0] == merged == right[0][0]
    joined = plan.join_tokens([right[0][1], left[0][1]], merged)
    assert [(x.start, x.end, dict(x.positions)) for x in joined.lanes] == [
        (b"c", b"f", {"a/1": 2}),
        (b"f", b"k", {"a/1": 5}),
    ]
    with pytest.raises(InvalidArgument, match="do not tile partition"):
        plan.join_tokens([left[0][1]], merged)
    with pytest.raises(InvalidArgument, match="do not tile partition"):
        plan.join_tokens([left[0][1], left[0][1], right[0][1]], merged)
    with pytest.raises(InvalidArgument, match="middle of a batch"):
        plan.join_tokens([replace_batch(left[0][1]), right[0][1]], merged)


def test_positions_below_a_logs_first_segment_were_collected() -> None:
    c = _cursor(Lane(b"", None, {"a/1": 2}))
    plan.check_retained(c, {"a/1": _segs((2, 9, 1.0))})
    plan.check_retained(c, {})  # the whole log collected: nothing more can come of it
    with pytest.raises(InvalidArgument, match="no longer retained"):
        plan.check_retained(c, {"a/1": _segs((3, 9, 1.0))})
    assert plan.forget_logs(c, ["b/1"]).lanes[0].positions == {}


def test_the_cut_and_the_watermark_allow_for_the_clocks() -> None:
    cut, watermark = plan.cut_of(100.0)
    assert cut == 100.0 - 2 * plan.CLOCK_SKEW
    assert watermark == cut - plan.CLOCK_SKEW - plan.LANDED_RESOLUTION
