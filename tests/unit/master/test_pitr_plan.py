"""pitr_plan: the pure decisions of a point-in-time restore: which instants and checkpoints
are usable, which segments of a log are read (as recovery reads a log), and which cells a
rebuilt tablet holds, which checkpoint SSTables a clone shares, and which bulk-load parts a
restore adds."""

from __future__ import annotations

import pytest

from tabletstore.commitlog.format import LogRecord
from tabletstore.commitlog.runs import SortPlan, TabletRange
from tabletstore.data.schema import TableSchema
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import Cell, CellKind
from tabletstore.master import pitr_plan as plan
from tabletstore.master.bulk_load import DONE, LOADING, LoadRecord
from tabletstore.master.checkpoints import checkpoint_interval, checkpoint_ttl, retention
from tabletstore.metadata.load_part import LoadPart
from tabletstore.metadata.record import LogRef, SSTableRef
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot

NOW = 1_800_000_000.0
REF = LogRef("w", 1)


def _manifest(sid: str, at: float, expires: float | None = None) -> SnapshotManifest:
    tablet = TabletSnapshot("t0", b"", None, 10, {})
    return SnapshotManifest(sid, "t", "t-1", at, expires, TableSchema(name="t"), (tablet,))


def test_the_instant_must_be_in_the_window() -> None:
    plan.check_instant("t", NOW - 100, NOW, 3600)
    with pytest.raises(InvalidArgument, match="keeps no history"):
        plan.check_instant("t", NOW, NOW, None)
    with pytest.raises(InvalidArgument, match="in the future"):
        plan.check_instant("t", NOW + 1, NOW, 3600)
    with pytest.raises(InvalidArgument, match="outside the history window"):
        plan.check_instant("t", NOW - 3601, NOW, 3600)


def test_the_newest_usable_checkpoint_at_or_before_the_instant_is_chosen() -> None:
    ms = [_manifest("a", NOW - 3000), _manifest("b", NOW - 1000), _manifest("c", NOW - 10)]
    assert plan.choose_checkpoint("t", ms, NOW - 500, NOW, 3600).snapshot_id == "b"
    assert plan.choose_checkpoint("t", ms, NOW - 1000, NOW, 3600).snapshot_id == "b"
    with pytest.raises(InvalidArgument, match="earliest instant"):
        plan.choose_checkpoint("t", ms, NOW - 3500, NOW, 3600)
    with pytest.raises(InvalidArgument, match="no checkpoint yet"):
        plan.choose_checkpoint("t", [], NOW, NOW, 3600)
    # A snapshot older than the log's retention (a manual one from long ago) is not usable:
    # the log after it may be gone.
    old = _manifest("old", NOW - retention(3600))
    with pytest.raises(InvalidArgument, match="no checkpoint yet"):
        plan.choose_checkpoint("t", [old], NOW - 100, NOW, 3600)
    expired = _manifest("x", NOW - 100, expires=NOW - 1)
    with pytest.raises(InvalidArgument, match="no checkpoint yet"):
        plan.choose_checkpoint("t", [expired], NOW - 50, NOW, 3600)


def test_retention_covers_the_window_and_a_missed_checkpoint() -> None:
    assert checkpoint_interval(86400) == 3600 and checkpoint_interval(60) == 30
    assert checkpoint_ttl(86400) == 86400 + 7200
    assert retention(86400) > checkpoint_ttl(86400)


def _segs(numbers: range, at: float = 100.0, skip: tuple[int, ...] = ()) -> list[plan.SegmentStamp]:
    return [plan.SegmentStamp(n, 10, at + n) for n in numbers if n not in skip]


def test_segments_are_chosen_by_stamp_in_runs() -> None:
    assert plan.select_segments(REF, _segs(range(10)), 103, 106) == [[3, 4, 5, 6]]
    stamps = _segs(range(10))
    stamps[5] = plan.SegmentStamp(5, 10, 500.0)  # a clock step: chosen by its own stamp
    assert plan.select_segments(REF, stamps, 103, 106) == [[3, 4], [6]]
    assert plan.select_segments(REF, [], 0, 1) == []


def test_a_log_is_read_to_its_first_fence_and_never_past_a_lost_segment() -> None:
    fenced = [*_segs(range(5)), plan.SegmentStamp(5, 0, 105), *_segs(range(6, 8))]
    assert plan.select_segments(REF, fenced, 0, 1000) == [[0, 1, 2, 3, 4]]
    # Missing within the in-flight window of the last segment: the log ends there.
    assert plan.select_segments(REF, _segs(range(20), skip=(17,)), 0, 1000) == [list(range(17))]
    with pytest.raises(Corruption, match="segment 3 is missing"):
        plan.select_segments(REF, _segs(range(20), skip=(3,)), 0, 1000)


def _cell(row: bytes, seq: int, kind: CellKind = CellKind.PUT, family: str = "f") -> Cell:
    return Cell(row, family, b"q", 5, seq, kind, b"v%d" % seq)


def test_cells_are_routed_by_row_and_cut_and_merged_once() -> None:
    a = TabletSnapshot("a", b"", b"m", 10, {})
    b = TabletSnapshot("b", b"m", None, 20, {})
    records = [
        LogRecord(0, "t-1", b"c", 9, 12, [_cell(b"c", 9), _cell(b"c", 12)]),
        LogRecord(0, "t-1", b"x", 15, 25, [_cell(b"x", 15), _cell(b"x", 25)]),
        LogRecord(0, "other", b"c", 30, 30, [_cell(b"c", 30)]),
    ]
    routed = plan.route([b, a], "t-1", records)
    assert routed == {"a": [_cell(b"c", 12)], "b": [_cell(b"x", 25)]}
    checkpoint = [_cell(b"c", 3), _cell(b"c", 11), _cell(b"z", 4)]  # 11: after a's cut
    merged = plan.merge_cells(a, checkpoint, [*routed["a"], *routed["a"]])
    assert merged == [_cell(b"c", 12), _cell(b"c", 3)]  # ts equal: seq descending


def test_row_deletions_go_to_every_locality_group() -> None:
    schema = TableSchema.model_validate(
        {
            "name": "t",
            "families": {
                "f": {"name": "f"},
                "g": {"name": "g", "locality_group": "other"},
            },
            "locality_groups": {"default": {"name": "default"}, "other": {"name": "other"}},
        }
    )
    row_delete = Cell(b"r", "", b"", 2**63 - 1, 9, CellKind.DELETE_ROW, b"")
    groups = plan.group_cells([row_delete, _cell(b"r", 3), _cell(b"r", 4, family="g")], schema)
    assert groups == {
        "default": [row_delete, _cell(b"r", 3)],
        "other": [row_delete, _cell(b"r", 4, family="g")],
    }
    assert plan.group_cells([_cell(b"r", 3, family="dropped")], schema) == {}


def _ref(key: str, max_seq: int) -> SSTableRef:
    return SSTableRef(key, 10, 1, 1, max_seq, b"a", b"z")


def test_a_clone_shares_a_checkpoint_tablet_only_when_all_its_cells_are_at_its_cut() -> None:
    at_cut = TabletSnapshot("t0", b"", None, 10, {"default": (_ref("b", 10), _ref("a", 7))})
    past = TabletSnapshot("t0", b"", None, 10, {"default": (_ref("b", 11),)})
    assert plan.shareable(at_cut) and not plan.shareable(past)
    tail = {"default": _ref("tail", 15), "other": _ref("tail2", 12)}
    stacked = plan.stacked(at_cut, tail)
    assert [r.key for r in stacked["default"]] == ["tail", "b", "a"]  # newest first
    assert [r.key for r in stacked["other"]] == ["tail2"]


def _part(load: str, at: float, cells: int = 1) -> LoadPart:
    return LoadPart(load, "t-1", "t0", b"", None, at, cells, {})


def _load(load: str, started: float, cells: int, state: str = DONE) -> LoadRecord:
    return LoadRecord(load, "t-1", "url", state, started, started + 1, 1, cells)


def test_bulk_load_parts_are_taken_by_commit_instant_and_whole_loads_checked() -> None:
    parts = [_part("a", 100.0), _part("b", 200.0), _part("b", 201.0)]
    assert plan.select_parts(parts, 50.0, 200.0) == parts[:2]
    assert plan.select_parts(parts, 150.0, 300.0) == parts[1:]
    plan.check_loads("t", [_load("a", 99.0, 1), _load("b", 199.0, 2)], parts, 50.0, 300.0)
    with pytest.raises(Corruption, match=r"bulk load 'b' .* loaded 3 cells, but only 2"):
        plan.check_loads("t", [_load("b", 199.0, 3)], parts, 50.0, 300.0)
    # Not checked: a load begun outside the span, or one not finished.
    plan.check_loads("t", [_load("b", 199.0, 3)], parts, 50.0, 150.0)
    plan.check_loads("t", [_load("b", 199.0, 3, LOADING)], parts, 50.0, 300.0)
    tablets = [TabletSnapshot("t0", b"", b"m", 10, {}), TabletSnapshot("t1", b"m", None, 20, {})]
    cells = [_cell(b"a", 10), _cell(b"b", 11), _cell(b"n", 20), _cell(b"z", 21)]
    routed = plan.route_cells(tablets, cells)
    assert routed == {"t0": [cells[1]], "t1": [cells[3]]}


def test_a_restores_sort_plan_cuts_tasks_within_runs_under_its_scope() -> None:
    ranges = [TabletRange("T", "b", b"m", None), TabletRange("T", "a", b"", b"m")]
    sizes = {n: 10 for n in range(20)}
    p = plan.sort_plan(
        REF, [[3, 4, 5, 6, 7], [9, 10]], sizes, ranges, task_bytes=25, task_segments=100, scope="r1"
    )
    assert p is not None and p.scope == "r1"
    assert [(t.first, t.stop, t.size) for t in p.tasks] == [(3, 6, 30), (6, 8, 20), (9, 11, 20)]
    assert p.fence == 11 and [t.tablet_id for t in p.tablets] == ["a", "b"]
    assert SortPlan.from_bytes(p.to_bytes()) == p
    few = plan.sort_plan(
        REF, [[0, 1, 2]], sizes, ranges, task_bytes=10**9, task_segments=2, scope="r1"
    )
    assert few is not None and [(t.first, t.stop) for t in few.tasks] == [(0, 2), (2, 3)]
    assert plan.sort_plan(REF, [], sizes, ranges, task_bytes=1, task_segments=1, scope="r") is None
    with pytest.raises(InvalidArgument, match="task_bytes"):
        plan.sort_plan(REF, [[0]], sizes, ranges, task_bytes=0, task_segments=1, scope="r")
