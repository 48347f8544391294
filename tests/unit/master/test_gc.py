"""gc.plan: the garbage collector's pure planner (docs/architecture/design.md §6 rule 5, §9).

Property tests pin what it must never delete (a referenced SSTable, a needed log, a live
incarnation, anything younger than the grace period, a young fence, an unrecognized key) and
what it must delete (old garbage); examples pin each rule's reason.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.errors import InvalidArgument
from tabletstore.master import gc_plan as gc
from tabletstore.metadata.record import LogRef
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo

NOW = 100_000.0
TABLES = ["ta", "tb", "tc"]
WORKERS = ["w1", "w2", "w3"]
UNKNOWN = [
    "junk",
    "tables/ta/x.parquet",
    "logs/w1/1/2.log",
    "logs/w1/00000000000000000001/seg.log",
    "recovery/w1/00000000000000000001/run.run",
    "snapshots/ta/x/y.json",
]


def _sstable(t: str, i: int) -> str:
    return layout.sstable_key(t, f"tab{i % 2}", "default", f"s{i}")


ages = st.floats(min_value=0.0, max_value=20_000.0)


@st.composite
def universes(draw: st.DrawFn) -> tuple[gc.LiveSet, list[ObjectInfo], float, float]:
    objects: dict[str, ObjectInfo] = {}

    def add(key: str, size: int) -> None:
        objects[key] = ObjectInfo(key, size, NOW - draw(ages))

    sstables = [_sstable(t, i) for t in TABLES for i in range(draw(st.integers(0, 4)))]
    for key in sstables:
        add(key, draw(st.integers(1, 1000)))
    refs = [LogRef(w, i) for w in WORKERS for i in range(3)]
    for ref in draw(st.lists(st.sampled_from(refs), unique=True)):
        n = draw(st.integers(0, 5))
        for seq in range(n):
            add(layout.log_segment_key(ref.worker_id, ref.incarnation, seq), 10)
        for extra in range(draw(st.integers(0, 2))):  # fences
            add(layout.log_segment_key(ref.worker_id, ref.incarnation, n + extra), 0)
        if draw(st.booleans()):
            add(layout.recovery_run_key(ref.worker_id, ref.incarnation, 0, "t", "tab0"), 5)
            add(layout.recovery_manifest_key(ref.worker_id, ref.incarnation, 0), 2)
            add(layout.recovery_plan_key(ref.worker_id, ref.incarnation), 2)
    snapshots = []
    for t in draw(st.lists(st.sampled_from(TABLES), unique=True)):
        key = layout.snapshot_key(t, "snap")
        snapshots.append(key)
        add(key, 20)
    for key in draw(st.lists(st.sampled_from(UNKNOWN), unique=True)):
        add(key, 1)
    pins: dict[str, frozenset[str] | None] = {
        k: draw(st.none() | st.frozensets(st.sampled_from(sstables or ["none"]))) for k in snapshots
    }
    logs = frozenset(draw(st.lists(st.sampled_from(refs), unique=True)))
    live_workers = draw(st.dictionaries(st.sampled_from(WORKERS), st.none() | st.integers(0, 2)))
    current = sorted(
        (r for r in logs if live_workers.get(r.worker_id) == r.incarnation),
        key=lambda r: (r.worker_id, r.incarnation),
    )
    live = gc.LiveSet(
        tables=frozenset(draw(st.lists(st.sampled_from(TABLES), unique=True))),
        sstables=frozenset(draw(st.lists(st.sampled_from(sstables or ["none"]), unique=True))),
        logs=logs,
        live_workers=live_workers,
        snapshots=pins,
        history=draw(st.sampled_from([0.0, 3_000.0])),
        log_floors={r: draw(st.integers(0, 7)) for r in current if draw(st.booleans())},
    )
    grace = draw(st.sampled_from([0.0, 100.0, 5_000.0]))
    fence_grace = draw(st.sampled_from([0.0, 1_000.0, 15_000.0]))
    listed = draw(st.permutations(sorted(objects.values(), key=lambda o: o.key)))
    return live, listed, grace, fence_grace


def _ref(key: str) -> LogRef | None:
    for parse in (layout.parse_log_segment_key, layout.parse_recovery_key):
        try:
            k = parse(key)
        except InvalidArgument:
            continue
        return LogRef(k.worker_id, k.incarnation)
    return None


def _needed(live: gc.LiveSet, ref: LogRef) -> bool:
    if ref in live.logs:
        return True
    return ref.worker_id in live.live_workers and live.live_workers[ref.worker_id] in (
        None,
        ref.incarnation,
    )


def _pins(live: gc.LiveSet, listed: list[ObjectInfo]) -> tuple[set[str], set[str]]:
    """(SSTable keys, table ids) that the listed snapshot manifests pin."""
    pinned: set[str] = set()
    pinned_tables: set[str] = set()
    keys = {o.key for o in listed}
    for key, names in live.snapshots.items():
        if key in keys:
            if names is None:
                pinned_tables.add(layout.parse_snapshot_key(key).table_id)
            else:
                pinned |= names
    return pinned, pinned_tables


def _check_safety(
    live: gc.LiveSet, listed: list[ObjectInfo], p: gc.GcPlan, grace: float, fence_grace: float
) -> None:
    by_key = {o.key: o for o in listed}
    deleted = set(p.delete)
    pinned, pinned_tables = _pins(live, listed)
    for key in deleted:
        info = by_key[key]
        assert NOW - info.last_modified >= grace, f"{key} is younger than the grace period"
        assert key not in live.sstables, f"{key} is referenced"
        assert key not in pinned, f"{key} is named by a snapshot"
        assert key not in UNKNOWN, f"{key} is not a layout key"
        if key.startswith(layout.TABLES):
            assert layout.parse_sstable_key(key).table_id not in pinned_tables
        ref = _ref(key)
        if ref is not None and p.reasons[key] is gc.Reason.DELETE_TRIMMED_LOG:
            _check_trimmed(live, listed, p, ref, info, grace)
        elif ref is not None:
            assert not _needed(live, ref), f"{key} belongs to a needed log"
            if key.startswith(layout.LOGS) and info.size == 0:
                assert NOW - info.last_modified >= fence_grace, f"young fence {key} deleted"
        if key.startswith(layout.SNAPSHOTS):
            assert layout.parse_snapshot_key(key).table_id not in live.tables
    # A log's segments go together: all of its non-fence segments, or none; a live log may
    # lose a prefix of them (rule 3a).
    for ref in {r for r in map(_ref, by_key) if r is not None}:
        segments = [k for _, k in _segments(listed, ref)]
        if ref in live.log_floors:
            gone = [k in deleted for k in segments]
            assert gone == sorted(gone, reverse=True), f"live log {ref} trimmed with a gap"
        else:
            assert len({k in deleted for k in segments}) <= 1, f"log {ref} partly deleted"
    assert p.delete_bytes == sum(by_key[k].size for k in deleted)
    assert sum(p.counts.values()) == len(listed)
    assert set(p.unknown) == {k for k in by_key if k in UNKNOWN}


def _segments(listed: list[ObjectInfo], ref: LogRef) -> list[tuple[int, str]]:
    """(number, key) of the log's non-fence segments, ascending."""
    prefix = layout.log_prefix(ref.worker_id, ref.incarnation)
    return sorted(
        (layout.parse_log_segment_key(o.key).seq, o.key)
        for o in listed
        if o.key.startswith(prefix) and o.size > 0 and o.key not in UNKNOWN
    )


def _check_trimmed(
    live: gc.LiveSet,
    listed: list[ObjectInfo],
    p: gc.GcPlan,
    ref: LogRef,
    info: ObjectInfo,
    grace: float,
) -> None:
    """A segment trimmed from a live log: below every position, never its newest segment,
    never from a log with a fence, and older than the history retention."""
    number = layout.parse_log_segment_key(info.key).seq
    assert ref in live.log_floors and number < live.log_floors[ref], f"{info.key} is needed"
    assert number < _segments(listed, ref)[-1][0], f"{info.key} is its log's newest segment"
    prefix = layout.log_prefix(ref.worker_id, ref.incarnation)
    assert not any(o.size == 0 and o.key.startswith(prefix) for o in listed), "log has a fence"
    assert NOW - info.last_modified >= max(grace, live.history), f"{info.key} is within history"


@settings(max_examples=300, deadline=None)
@given(universes())
def test_plan_never_deletes_what_is_needed(
    u: tuple[gc.LiveSet, list[ObjectInfo], float, float],
) -> None:
    live, listed, grace, fence_grace = u
    p = gc.plan(live, listed, NOW, grace=grace, fence_grace=fence_grace)
    _check_safety(live, listed, p, grace, fence_grace)


@settings(max_examples=200, deadline=None)
@given(universes(), st.data())
def test_plan_with_since_deletes_only_after_a_grace_of_being_deletable(
    u: tuple[gc.LiveSet, list[ObjectInfo], float, float], data: st.DataObject
) -> None:
    live, listed, grace, fence_grace = u
    keys = [o.key for o in listed]
    since = data.draw(
        st.dictionaries(st.sampled_from(keys or ["none"]), ages.map(lambda a: NOW - a))
    )
    p = gc.plan(live, listed, NOW, grace=grace, fence_grace=fence_grace, since=since)
    _check_safety(live, listed, p, grace, fence_grace)
    for key in p.delete:
        assert NOW - since.get(key, NOW) >= grace
    assert not set(p.since) & set(p.delete)


@settings(max_examples=200, deadline=None)
@given(universes())
def test_plan_deletes_old_garbage(u: tuple[gc.LiveSet, list[ObjectInfo], float, float]) -> None:
    """Liveness: what no rule keeps is deleted (the invariant's "will delete")."""
    live, listed, grace, fence_grace = u
    p = gc.plan(live, listed, NOW, grace=grace, fence_grace=fence_grace)
    pinned, pinned_tables = _pins(live, listed)
    for o in listed:
        if o.key.startswith(layout.TABLES) and o.key not in UNKNOWN:
            table = layout.parse_sstable_key(o.key).table_id
            free = o.key not in live.sstables and o.key not in pinned
            if free and table not in pinned_tables and NOW - o.last_modified >= grace:
                assert o.key in p.delete
        ref = _ref(o.key)
        if ref is not None and o.key not in UNKNOWN and not _needed(live, ref):
            group = [x for x in listed if _ref(x.key) == ref and x.key not in UNKNOWN]
            kept_for = max(grace, fence_grace, live.history)
            if all(NOW - x.last_modified >= kept_for for x in group):
                assert o.key in p.delete


# -- examples, one per rule ------------------------------------------------------------------


def _obj(key: str, age: float, size: int = 10) -> ObjectInfo:
    return ObjectInfo(key, size, NOW - age)


def test_unreferenced_sstable_is_deleted_after_grace_only() -> None:
    old, young, kept = _sstable("ta", 1), _sstable("ta", 2), _sstable("ta", 3)
    live = gc.LiveSet(tables=frozenset({"ta"}), sstables=frozenset({kept}))
    p = gc.plan(live, [_obj(old, 60), _obj(young, 5), _obj(kept, 600)], NOW, grace=30)
    assert p.delete == (old,)
    assert p.reasons == {
        old: gc.Reason.DELETE_UNREFERENCED_SSTABLE,
        young: gc.Reason.KEEP_YOUNG,
        kept: gc.Reason.KEEP_REFERENCED,
    }
    assert p.delete_bytes == 10


def test_deleted_tables_objects_and_snapshots_are_garbage() -> None:
    sst, snap = _sstable("gone", 1), layout.snapshot_key("gone", "s1")
    live_snap = layout.snapshot_key("ta", "s1")
    live = gc.LiveSet(
        tables=frozenset({"ta"}), snapshots={snap: frozenset(), live_snap: frozenset()}
    )
    p = gc.plan(live, [_obj(sst, 60), _obj(snap, 60), _obj(live_snap, 60)], NOW, grace=30)
    assert set(p.delete) == {sst, snap}
    assert p.reasons[live_snap] is gc.Reason.KEEP_LIVE_TABLE_SNAPSHOT


def test_snapshot_manifest_pins_what_it_names_and_unreadable_pins_its_table() -> None:
    a, b, c = _sstable("ta", 1), _sstable("ta", 2), _sstable("tb", 3)
    snap_a, snap_b = layout.snapshot_key("ta", "s"), layout.snapshot_key("tb", "s")
    live = gc.LiveSet(
        tables=frozenset({"ta", "tb"}), snapshots={snap_a: frozenset({a}), snap_b: None}
    )
    objs = [_obj(k, 60) for k in (a, b, c, snap_a, snap_b)]
    p = gc.plan(live, objs, NOW, grace=30)
    assert p.delete == (b,)
    assert p.reasons[a] is p.reasons[c] is gc.Reason.KEEP_SNAPSHOT


def test_log_listed_by_a_record_is_kept_with_its_fence() -> None:
    """A dead worker whose tablets are not recovered yet: its segments and fence stay."""
    segs = [layout.log_segment_key("dead", 4, i) for i in range(3)]
    fence = layout.log_segment_key("dead", 4, 3)
    live = gc.LiveSet(logs=frozenset({LogRef("dead", 4)}))
    objs = [_obj(k, 10_000) for k in segs] + [_obj(fence, 10_000, size=0)]
    p = gc.plan(live, objs, NOW, grace=0, fence_grace=0)
    assert p.delete == ()
    assert set(p.reasons.values()) == {gc.Reason.KEEP_LOG_NEEDED}


def test_live_workers_current_incarnation_is_kept_and_older_ones_go() -> None:
    cur, old = layout.log_segment_key("w", 2, 0), layout.log_segment_key("w", 1, 0)
    other = layout.log_segment_key("v", 0, 0)
    live = gc.LiveSet(live_workers={"w": 2, "v": None})
    p = gc.plan(live, [_obj(cur, 60), _obj(old, 60), _obj(other, 60)], NOW, grace=30)
    assert p.delete == (old,)
    assert p.reasons[cur] is p.reasons[other] is gc.Reason.KEEP_LIVE_LOG


def test_finished_log_goes_whole_when_its_newest_object_is_old_and_fence_lingers() -> None:
    segs = [_obj(layout.log_segment_key("w", 1, i), 600) for i in range(2)]
    run = _obj(layout.recovery_run_key("w", 1, 0, "t", "tab"), 600)
    fence = _obj(layout.log_segment_key("w", 1, 2), 40, size=0)
    p = gc.plan(gc.LiveSet(), [*segs, run, fence], NOW, grace=30, fence_grace=3600)
    assert set(p.delete) == {segs[0].key, segs[1].key, run.key}
    assert p.reasons[fence.key] is gc.Reason.KEEP_FENCE
    assert p.reasons[run.key] is gc.Reason.DELETE_FINISHED_RECOVERY
    # The newest object (the fence) younger than grace keeps the whole log.
    p = gc.plan(gc.LiveSet(), [*segs, run, fence], NOW, grace=60, fence_grace=0)
    assert p.delete == ()
    # And once the fence is old enough too, it goes with the rest.
    p = gc.plan(gc.LiveSet(), [*segs, run, fence], NOW, grace=30, fence_grace=30)
    assert len(p.delete) == 4
    # The plan and task manifests of a sort follow the log too.
    sort_objs = [
        _obj(layout.recovery_plan_key("w", 1), 600),
        _obj(layout.recovery_manifest_key("w", 1, 0), 600),
    ]
    p = gc.plan(gc.LiveSet(), [*segs, run, *sort_objs], NOW, grace=30)
    assert set(p.delete) == {segs[0].key, segs[1].key, run.key, *(o.key for o in sort_objs)}
    p = gc.plan(gc.LiveSet(logs=frozenset({LogRef("w", 1)})), [*segs, *sort_objs], NOW, grace=30)
    assert p.delete == ()


def test_unrecognized_keys_are_reported_never_deleted() -> None:
    objs = [_obj(k, 10_000) for k in UNKNOWN]
    p = gc.plan(gc.LiveSet(), objs, NOW, grace=0, fence_grace=0)
    assert p.delete == ()
    assert set(p.unknown) == set(UNKNOWN)
    assert p.counts == {gc.Reason.KEEP_UNKNOWN: len(UNKNOWN)}


def test_since_holds_a_deletable_object_for_one_grace_period() -> None:
    key = _sstable("ta", 1)
    objs = [ObjectInfo(key, 1, 0.0)]
    first = gc.plan(gc.LiveSet(), objs, 1000.0, grace=100, since={})
    assert first.delete == ()
    assert first.reasons[key] is gc.Reason.KEEP_RECENTLY_UNREFERENCED
    assert first.since == {key: 1000.0}
    second = gc.plan(gc.LiveSet(), objs, 1050.0, grace=100, since=first.since)
    assert second.delete == () and second.since == {key: 1000.0}
    third = gc.plan(gc.LiveSet(), objs, 1100.0, grace=100, since=second.since)
    assert third.delete == (key,) and third.since == {}
    # Referenced again in between (never, for an SSTable; but the map must not stick).
    again = gc.plan(
        gc.LiveSet(sstables=frozenset({key})), objs, 1100.0, grace=100, since=first.since
    )
    assert again.delete == () and again.since == {}


def test_since_holds_a_whole_log_together() -> None:
    a, b = layout.log_segment_key("w", 1, 0), layout.log_segment_key("w", 1, 1)
    objs = [ObjectInfo(a, 5, 0.0), ObjectInfo(b, 5, 0.0)]
    p = gc.plan(gc.LiveSet(), objs, 1000.0, grace=100, since={a: 0.0})
    assert p.delete == ()
    assert set(p.since) == {a, b}


# -- rule 3a: a live worker's log is trimmed below every tablet's log position ---------------

LIVE = LogRef("w", 2)


def _live_log(ages: list[float]) -> list[ObjectInfo]:
    return [_obj(layout.log_segment_key("w", 2, i), age) for i, age in enumerate(ages)]


def _trimmable(floor: int, history: float = 0.0) -> gc.LiveSet:
    return gc.LiveSet(
        logs=frozenset({LIVE}), live_workers={"w": 2}, log_floors={LIVE: floor}, history=history
    )


def test_live_log_loses_the_segments_below_every_tablets_position() -> None:
    segs = _live_log([900.0] * 8)
    p = gc.plan(_trimmable(5), segs, NOW, grace=30)
    assert p.delete == tuple(o.key for o in segs[:5])
    assert {p.reasons[o.key] for o in segs[:5]} == {gc.Reason.DELETE_TRIMMED_LOG}
    assert {p.reasons[o.key] for o in segs[5:]} == {gc.Reason.KEEP_LOG_NEEDED}
    # One tablet still at segment 0 keeps all of it (the floor is the least position).
    assert gc.plan(_trimmable(0), segs, NOW, grace=30).delete == ()


def test_live_log_keeps_its_newest_segment_even_past_every_position() -> None:
    segs = _live_log([900.0] * 4)
    p = gc.plan(_trimmable(100), segs, NOW, grace=30)
    assert p.delete == tuple(o.key for o in segs[:3])
    assert p.reasons[segs[3].key] is gc.Reason.KEEP_LOG_NEEDED


def test_live_log_trim_stops_at_the_first_segment_grace_or_history_keeps() -> None:
    # Segment 2 landed late (a PUT in flight): it is young, so 3 stays too -- no gap.
    segs = _live_log([900.0, 900.0, 10.0, 900.0, 900.0, 900.0])
    p = gc.plan(_trimmable(5), segs, NOW, grace=30)
    assert p.delete == (segs[0].key, segs[1].key)
    assert p.reasons[segs[2].key] is p.reasons[segs[3].key] is gc.Reason.KEEP_YOUNG
    # A table's history window or change retention keeps the segments younger than it.
    segs = _live_log([900.0, 800.0, 700.0, 600.0, 500.0, 400.0])
    p = gc.plan(_trimmable(5, history=650.0), segs, NOW, grace=30)
    assert p.delete == tuple(o.key for o in segs[:3])
    assert {p.reasons[o.key] for o in segs[3:5]} == {gc.Reason.KEEP_HISTORY}


def test_live_log_with_a_fence_or_without_a_floor_is_kept_whole() -> None:
    segs = _live_log([900.0] * 4)
    fence = _obj(layout.log_segment_key("w", 2, 4), 900.0, size=0)
    assert gc.plan(_trimmable(3), [*segs, fence], NOW, grace=30, fence_grace=0).delete == ()
    # Listed and live, but the mark gave no floor (the worker was not live at both reads).
    live = gc.LiveSet(logs=frozenset({LIVE}), live_workers={"w": 2})
    assert gc.plan(live, segs, NOW, grace=30).delete == ()


def test_since_holds_a_live_logs_trim_from_the_first_held_segment_on() -> None:
    segs = _live_log([900.0] * 6)
    keys = [o.key for o in segs]
    # Segments 0-2 were found deletable long ago, 3-4 only now (their tablets moved on).
    since = {k: NOW - 500.0 for k in keys[:3]}
    p = gc.plan(_trimmable(5), segs, NOW, grace=100, since=since)
    assert p.delete == tuple(keys[:3])
    assert set(p.since) == {keys[3], keys[4]}
    # A held segment below deletable ones keeps everything above it (no gap).
    since = {keys[0]: NOW - 500.0, keys[2]: NOW - 500.0}
    p = gc.plan(_trimmable(5), segs, NOW, grace=100, since=since)
    assert p.delete == (keys[0],)


def test_negative_grace_is_an_error() -> None:
    with pytest.raises(InvalidArgument, match="grace"):
        gc.plan(gc.LiveSet(), [], NOW, grace=-1)


def test_backup_manifest_pins_what_it_names_after_its_table_is_gone() -> None:
    a, b = _sstable("gone", 1), _sstable("gone", 2)
    v0, v1 = layout.backup_key("b", 0), layout.backup_key("b", 1)
    live = gc.LiveSet(tables=frozenset(), backups={v0: frozenset({a}), v1: frozenset({a})})
    p = gc.plan(live, [_obj(k, 60) for k in (a, b, v0, v1)], NOW, grace=30)
    assert p.delete == (b,)
    assert p.reasons[a] is gc.Reason.KEEP_BACKUP
    assert p.reasons[v0] is p.reasons[v1] is gc.Reason.KEEP_BACKUP_MANIFEST


def test_expired_backup_goes_first_and_its_sstables_next_round() -> None:
    a = _sstable("ta", 1)
    v1 = layout.backup_key("b", 1)
    live = gc.LiveSet(
        tables=frozenset({"ta"}), backups={v1: frozenset({a})}, backup_expiry={v1: NOW - 1}
    )
    p = gc.plan(live, [_obj(a, 60), _obj(v1, 60)], NOW, grace=30)
    assert p.delete == (v1,)
    assert p.reasons[v1] is gc.Reason.DELETE_EXPIRED_BACKUP
    assert p.reasons[a] is gc.Reason.KEEP_BACKUP
    later = gc.plan(gc.LiveSet(tables=frozenset({"ta"})), [_obj(a, 60)], NOW, grace=30)
    assert later.delete == (a,)
    not_yet = gc.LiveSet(backups={v1: frozenset({a})}, backup_expiry={v1: NOW + 1})
    assert gc.plan(not_yet, [_obj(a, 60), _obj(v1, 60)], NOW, grace=30).delete == ()


def test_unreadable_backup_manifest_keeps_every_sstable() -> None:
    keys = [_sstable("ta", 1), _sstable("tb", 2)]
    v0 = layout.backup_key("b", 0)
    live = gc.LiveSet(tables=frozenset(), backups={v0: None})
    p = gc.plan(live, [_obj(k, 60) for k in (*keys, v0)], NOW, grace=30)
    assert p.delete == ()
    assert all(p.reasons[k] is gc.Reason.KEEP_BACKUP for k in keys)


def test_an_sstable_named_by_any_tables_record_is_kept() -> None:
    """A clone or a restored table names its source's SSTables under the source's prefix."""
    shared = _sstable("source", 1)
    live = gc.LiveSet(tables=frozenset({"clone"}), sstables=frozenset({shared}))
    p = gc.plan(live, [_obj(shared, 600)], NOW, grace=30)
    assert p.delete == () and p.reasons[shared] is gc.Reason.KEEP_REFERENCED


def test_history_keeps_a_finished_log_for_its_retention_and_reports_its_bytes() -> None:
    """Rule 7: a log no tablet needs is kept while its newest object is younger than the
    longest history retention, and freed once it falls out; its bytes are reported."""
    segs = [_obj(layout.log_segment_key("w", 1, i), 600, size=100) for i in range(3)]
    run = _obj(layout.recovery_run_key("w", 1, 0, "t", "tab"), 600, size=7)
    kept = gc.plan(gc.LiveSet(history=601.0), [*segs, run], NOW, grace=30)
    assert kept.delete == ()
    assert set(kept.reasons.values()) == {gc.Reason.KEEP_HISTORY}
    assert kept.bytes[gc.Reason.KEEP_HISTORY] == 307
    freed = gc.plan(gc.LiveSet(history=600.0), [*segs, run], NOW, grace=30)
    assert len(freed.delete) == 4 and freed.delete_bytes == 307
    assert freed.bytes[gc.Reason.DELETE_FINISHED_LOG] == 300
    # History never frees what another rule keeps, nor keeps unreferenced SSTables.
    sst = _obj(_sstable("ta", 1), 10_000)
    needed = gc.LiveSet(logs=frozenset({LogRef("w", 1)}), history=1.0)
    p = gc.plan(needed, [*segs, sst], NOW, grace=30)
    assert p.delete == (sst.key,)
    assert p.reasons[segs[0].key] is gc.Reason.KEEP_LOG_NEEDED


def test_a_bulk_load_part_pins_its_sstables_within_the_history_retention() -> None:
    """Rule 9: a bulk-load part is kept while younger than the history retention (and than
    the grace period), pinning the SSTables it names; then it goes, and its SSTables the
    round after (they are pinned in the round that deletes it); an unreadable one pins its
    table's SSTables."""
    part = layout.load_part_key("ta", "p1")
    sst, other = _sstable("ta", 1), _sstable("ta", 2)
    listed = [_obj(part, 600), _obj(sst, 10_000), _obj(other, 10_000)]
    names = {part: frozenset({sst})}
    kept = gc.plan(gc.LiveSet(history=601.0, load_parts=names), listed, NOW, grace=30)
    assert kept.delete == (other,)
    assert kept.reasons[part] is gc.Reason.KEEP_LOAD_PART
    assert kept.reasons[sst] is gc.Reason.KEEP_HISTORY_LOAD
    old = gc.plan(gc.LiveSet(history=600.0, load_parts=names), listed, NOW, grace=30)
    assert old.delete == (part, other)
    assert old.reasons[part] is gc.Reason.DELETE_OLD_LOAD_PART
    after = gc.plan(gc.LiveSet(history=600.0), listed[1:], NOW, grace=30)
    assert set(after.delete) == {sst, other}
    unreadable = gc.plan(gc.LiveSet(history=601.0, load_parts={part: None}), listed, NOW, grace=30)
    assert unreadable.delete == ()


def test_a_restores_sorted_log_is_deleted_whole_once_old_and_never_follows_a_log() -> None:
    scratch = [
        _obj(layout.recovery_plan_key("w", 1, "r1"), 600),
        _obj(layout.recovery_manifest_key("w", 1, 0, "r1"), 600),
        _obj(layout.recovery_run_key("w", 1, 0, "t", "tab", "r1"), 600),
    ]
    # The log it was sorted from is a live worker's (kept); the restore's runs are not.
    seg = _obj(layout.log_segment_key("w", 1, 0), 600)
    live = gc.LiveSet(live_workers={"w": 1})
    p = gc.plan(live, [seg, *scratch], NOW, grace=30)
    assert set(p.delete) == {o.key for o in scratch}
    assert {p.reasons[o.key] for o in scratch} == {gc.Reason.DELETE_RESTORE_SORT}
    assert p.reasons[seg.key] is gc.Reason.KEEP_LIVE_LOG
    # A restore still writing (its newest object young) keeps all of it.
    young = _obj(layout.recovery_run_key("w", 1, 5, "t", "tab", "r1"), 5)
    p = gc.plan(live, [seg, *scratch, young], NOW, grace=30)
    assert p.delete == ()
    # Another restore's scope is judged on its own.
    other = _obj(layout.recovery_plan_key("w", 1, "r2"), 600)
    p = gc.plan(live, [*scratch, young, other], NOW, grace=30)
    assert p.delete == (other.key,)
