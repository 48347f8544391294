"""The pure state transitions of compactions (tabletstore.engine.state, §5.4): what a minor,
merging or major compaction does to a tablet's state, including to changes made between the
freeze (or the choice of inputs) and the apply -- new writes in a new memtable, a new log."""

from __future__ import annotations

from dataclasses import replace
from typing import cast

import pytest

from tabletstore.engine.memtable import MemTable
from tabletstore.engine.state import (
    AdoptedMajor,
    MajorResult,
    MergeResult,
    MinorResult,
    TabletState,
    adoptable,
    apply_adopted,
    apply_major,
    apply_merge,
    apply_minor,
    freeze,
    redo_point,
)
from tabletstore.errors import PreconditionFailed
from tabletstore.keys import Cell, CellKind
from tabletstore.metadata.record import LogRef, SSTableRef, TabletRecord
from tabletstore.sstable import SSTable

OLD_LOG, FREEZE_LOG, NEW_LOG = LogRef("w1", 1), LogRef("w2", 1), LogRef("w2", 2)


def _memtable(*seqs: int) -> MemTable:
    m = MemTable()
    m.add([Cell(b"r%d" % s, "f", b"q", 1, s, CellKind.PUT, b"v") for s in seqs])
    return m


def _ref(key: str) -> SSTableRef:
    return SSTableRef(key, 10, 1, 1, 1, b"a", b"z")


def _table(key: str) -> SSTable:
    """A stand-in for an opened SSTable: the transitions only carry it along."""
    return cast(SSTable, key)


def _state(sstables: dict[str, list[str]], logs: tuple[LogRef, ...] = ()) -> TabletState:
    record = TabletRecord(
        "t",
        "t1",
        b"",
        None,
        sstables={g: tuple(_ref(k) for k in keys) for g, keys in sstables.items()},
        redo_seq=3,
        logs=logs,
    )
    opened = {g: tuple(_table(k) for k in keys) for g, keys in sstables.items()}
    return TabletState(record, MemTable(), (), opened)


def _keys(state: TabletState, group: str) -> list[str]:
    refs = [r.key for r in state.record.sstables.get(group, ())]
    assert refs == [cast(str, t) for t in state.sstables.get(group, ())]  # kept parallel
    return refs


def test_freeze_moves_the_memtable_in_front_of_the_frozen_ones() -> None:
    older = _memtable(1)
    state = _state({})
    state = TabletState(state.record, _memtable(2), (older,), {})
    frozen = freeze(state)
    assert frozen.frozen == (state.memtable, older)
    assert len(frozen.memtable) == 0
    empty = TabletState(state.record, MemTable(), (older,), {})
    assert freeze(empty) is empty


def test_redo_point_stays_below_writes_in_flight() -> None:
    flushed = [_memtable(4, 9), _memtable(7)]
    assert redo_point(flushed, []) == 9
    assert redo_point(flushed, [8, 12]) == 7
    assert redo_point(flushed, [20]) == 9


def _minor_after_freeze() -> tuple[TabletState, MinorResult]:
    """A tablet frozen with OLD_LOG and FREEZE_LOG listed and FREEZE_LOG current."""
    state = _state({"g": ["s1"]}, logs=(OLD_LOG, FREEZE_LOG))
    state = freeze(TabletState(state.record, _memtable(4, 5), (), state.sstables))
    result = MinorResult(
        flushed=state.frozen,
        written={"g": (_ref("m1"), _table("m1")), "h": (_ref("m2"), _table("m2"))},
        redo_seq=redo_point(state.frozen, []),
        log_at_freeze=FREEZE_LOG,
        listed_at_freeze=state.record.logs,
    )
    return state, result


def test_minor_puts_new_sstables_first_and_moves_the_redo_point() -> None:
    state, result = _minor_after_freeze()
    after = apply_minor(state, result, now=5.0)
    assert _keys(after, "g") == ["m1", "s1"]
    assert _keys(after, "h") == ["m2"]
    assert after.record.redo_seq == 5
    assert after.frozen == ()
    # Every log listed before the freeze but the current one holds nothing past the redo point.
    assert after.record.logs == (FREEZE_LOG,)
    assert after.record.events[-1].kind == "minor_compaction"
    assert after.record.events[-1].detail == "2 cells"
    assert state.record.redo_seq == 3  # the input is not modified


def test_minor_keeps_what_changed_after_the_freeze() -> None:
    state, result = _minor_after_freeze()
    # Meanwhile writes went to the new memtable, and the worker moved to a new log and
    # listed it in the record (hold_writes/add_log).
    newer = _memtable(6)
    moved = TabletState(
        replace(state.record, logs=(*state.record.logs, NEW_LOG)),
        newer,
        state.frozen,
        state.sstables,
    )
    after = apply_minor(moved, result, now=5.0)
    assert after.memtable is newer  # the writes since the freeze stay in memory
    assert after.record.logs == (FREEZE_LOG, NEW_LOG)  # and the logs that hold them listed


def test_minor_records_the_log_position_at_freeze_and_keeps_later_logs_positions() -> None:
    """§5.3 log positions: the log at freeze is read from where the writes not flushed may
    start; a log listed after the freeze keeps the position it was listed with; the logs
    listed before the freeze are dropped with their positions."""
    state, result = _minor_after_freeze()
    state = replace(state, record=replace(state.record, log_starts={OLD_LOG: 4, FREEZE_LOG: 2}))
    result = replace(result, log_start=40)
    after = apply_minor(state, result, now=5.0)
    assert after.record.log_starts == {FREEZE_LOG: 40}
    assert after.record.log_start(FREEZE_LOG) == 40 and after.record.log_start(NEW_LOG) == 0
    moved = replace(
        state,
        record=replace(
            state.record,
            logs=(*state.record.logs, NEW_LOG),
            log_starts={**state.record.log_starts, NEW_LOG: 7},
        ),
    )
    after = apply_minor(moved, result, now=5.0)
    assert after.record.log_starts == {FREEZE_LOG: 40, NEW_LOG: 7}
    # The record keeps them across its JSON form; positions of logs not listed are not kept.
    again = TabletRecord.from_bytes(after.record.to_bytes())
    assert again.log_starts == {FREEZE_LOG: 40, NEW_LOG: 7}
    stale = replace(after.record, logs=(NEW_LOG,))
    assert TabletRecord.from_bytes(stale.to_bytes()).log_starts == {NEW_LOG: 7}


def test_minor_leaves_a_memtable_frozen_after_it() -> None:
    state, result = _minor_after_freeze()
    later = _memtable(8)
    refrozen = TabletState(state.record, MemTable(), (later, *state.frozen), state.sstables)
    after = apply_minor(refrozen, result, now=5.0)
    assert after.frozen == (later,)


def test_minor_never_moves_the_redo_point_back() -> None:
    state, result = _minor_after_freeze()
    record = replace(state.record, redo_seq=50)
    after = apply_minor(replace(state, record=record), result, now=5.0)
    assert after.record.redo_seq == 50


def test_merge_takes_the_place_of_its_newest_input() -> None:
    state = _state({"g": ["n", "a", "b", "c"], "h": ["x"]})
    out = (_ref("ab"), _table("ab"))
    after = apply_merge(state, MergeResult("g", ("a", "b"), out), now=1.0)
    assert _keys(after, "g") == ["n", "ab", "c"]
    assert _keys(after, "h") == ["x"]
    assert after.record.events[-1].kind == "merging_compaction"
    assert after.record.events[-1].detail == "g: 2 -> 1"


def test_merge_keeps_an_sstable_added_after_the_inputs_were_chosen() -> None:
    chosen = _state({"g": ["a", "b", "c"]})
    later = _state({"g": ["new", "a", "b", "c"]})  # a minor compaction committed meanwhile
    out = (_ref("abc"), _table("abc"))
    after = apply_merge(later, MergeResult("g", ("a", "b", "c"), out, major=True), now=1.0)
    assert _keys(after, "g") == ["new", "abc"]
    assert after.record.events[-1].kind == "major_compaction"
    assert _keys(chosen, "g") == ["a", "b", "c"]


def test_merge_with_nothing_left_drops_its_inputs() -> None:
    state = _state({"g": ["a", "b", "c"]})
    after = apply_merge(state, MergeResult("g", ("b", "c"), None), now=1.0)
    assert _keys(after, "g") == ["a"]
    assert after.record.events[-1].detail == "g: 2 -> 0"


def test_major_replaces_every_sstable_and_keeps_the_memtable() -> None:
    state = _state({"g": ["a", "b"], "h": ["c"]}, logs=(FREEZE_LOG,))
    newer = _memtable(9)
    state = TabletState(state.record, newer, (), state.sstables)
    result = MajorResult({"g": ("a", "b"), "h": ("c",)}, {"g": (_ref("G"), _table("G"))})
    after = apply_major(state, result, now=1.0)
    assert _keys(after, "g") == ["G"]
    assert "h" not in after.record.sstables and "h" not in after.sstables
    assert after.memtable is newer
    assert after.record.logs == (FREEZE_LOG,)
    assert after.record.events[-1].detail == "3 -> 1"


def test_major_keeps_the_sstables_minor_compactions_added_during_it_in_front() -> None:
    # The rewrite runs with no lock held: "n" and "m" were flushed meanwhile.
    state = _state({"g": ["n", "a", "b"], "h": ["m"]})
    result = MajorResult({"g": ("a", "b")}, {"g": (_ref("G"), _table("G"))})
    after = apply_major(state, result, now=1.0)
    assert _keys(after, "g") == ["n", "G"]
    assert _keys(after, "h") == ["m"]
    assert after.sstables["g"][0] is state.sstables["g"][0]


def test_major_after_a_merge_of_its_inputs_is_refused() -> None:
    state = _state({"g": ["M"]})
    result = MajorResult({"g": ("a", "b")}, {"g": (_ref("G"), _table("G"))})
    with pytest.raises(PreconditionFailed):
        apply_major(state, result, now=1.0)


# -- a major compaction run elsewhere (master/remote_compaction.py) ---------------------------


def test_adopted_output_goes_behind_what_was_flushed_since_the_read() -> None:
    read = {"g": ("a", "b"), "h": ("c",)}
    # Since the read: a minor compaction added n1 to g and n2 to a group read had none of.
    later = _state({"g": ["n1", "a", "b"], "h": ["c"], "k": ["n2"]})
    newer = _memtable(9)
    later = TabletState(later.record, newer, (), later.sstables)
    assert adoptable(later.record, read) == {"g": 1, "h": 0, "k": 1}
    out = AdoptedMajor(read, {"g": (_ref("G"), _table("G"))})  # h's cells all deleted
    after = apply_adopted(later, out, now=1.0)
    assert (_keys(after, "g"), _keys(after, "h"), _keys(after, "k")) == (["n1", "G"], [], ["n2"])
    assert "h" not in after.record.sstables
    assert after.memtable is newer  # writes since the read stay where they are
    assert after.record.events[-1].kind == "major_compaction"
    assert after.record.redo_seq == later.record.redo_seq


@pytest.mark.parametrize(
    "now",
    [
        {"g": ["ab"], "h": ["c"]},  # a merging compaction of the inputs since
        {"g": ["b"], "h": ["c"]},  # an input gone
        {"g": ["a", "b", "x"], "h": ["c"]},  # something behind the inputs
        {"g": ["b", "a"], "h": ["c"]},  # another order
        {"g": ["a", "b"], "h": ["c", "a"]},  # an input in front elsewhere
        {"g": ["a", "b"]},  # a whole group gone
    ],
)
def test_adoption_is_refused_when_the_read_sstables_changed(now: dict[str, list[str]]) -> None:
    state = _state(now)
    with pytest.raises(PreconditionFailed, match="changed since the compaction read"):
        adoptable(state.record, {"g": ("a", "b"), "h": ("c",)})
    with pytest.raises(PreconditionFailed):
        apply_adopted(state, AdoptedMajor({"g": ("a", "b"), "h": ("c",)}, {}), now=1.0)
