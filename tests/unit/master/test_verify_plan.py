"""verify_plan.check: the verifier's pure checker. Each kind of damage is found, named and
located; a whole bucket has no finding; orphans are listed, never findings."""

from __future__ import annotations

from tabletstore.master import gc_plan
from tabletstore.master import verify_plan as vp
from tabletstore.metadata.record import LogRef, SSTableRef, TabletRecord
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo

NOW = 10_000.0
LOG = LogRef("w1", 3)


def _sst(tablet: str, n: int, size: int = 100) -> SSTableRef:
    key = layout.sstable_key("tb", tablet, "default", f"s{n}")
    return SSTableRef(key, size, 1, 1, 1, b"a", b"a")


def _rec(tid: str, start: bytes, end: bytes | None, *ssts: SSTableRef) -> TabletRecord:
    return TabletRecord(
        "tb", tid, start, end, sstables={"default": ssts}, logs=(LOG,), log_starts={LOG: 2}
    )


def _whole() -> tuple[list[TabletRecord], list[ObjectInfo], list[vp.SegmentFacts]]:
    a, b = _sst("t0", 1), _sst("t1", 2, 250)
    records = [_rec("t0", b"", b"m", a), _rec("t1", b"m", None, b)]
    listed = [ObjectInfo(a.key, 100, 0.0), ObjectInfo(b.key, 250, 0.0)]
    segs = [vp.SegmentFacts(n, 50, declared=50) for n in range(0, 6)]
    return records, listed, segs


def _check(
    records: list[TabletRecord],
    listed: list[ObjectInfo],
    segs: list[vp.SegmentFacts],
    **kw: object,
) -> vp.VerifyReport:
    starts = {f"tb/{r.tablet_id}": r.log_start(LOG) for r in records}
    return vp.check(
        vp.VerifyInputs(
            listed=listed,
            tables={"tb": records},
            logs=[vp.LogFacts(LOG, tuple(segs), starts)],
            now=NOW,
            **kw,  # type: ignore[arg-type]
        )
    )


def test_a_whole_bucket_has_no_finding() -> None:
    report = _check(*_whole())
    assert report.ok, report.lines()
    assert (report.tables, report.tablets, report.objects_checked) == (1, 2, 2)
    assert report.segments_checked == 4  # from the least log position (2) on


def test_a_missing_sstable_and_a_wrong_size_are_found() -> None:
    records, listed, segs = _whole()
    report = _check(records, listed[1:], segs)
    assert [f.kind for f in report.findings] == [vp.Kind.MISSING]
    assert report.findings[0].subject == listed[0].key
    assert "tb/t0" in report.findings[0].detail
    resized = [listed[0], ObjectInfo(listed[1].key, 249, 0.0)]
    assert [f.kind for f in _check(records, resized, segs).findings] == [vp.Kind.SIZE]


def test_overlap_and_gap_between_tablets_are_found() -> None:
    a, b = _sst("t0", 1), _sst("t1", 2, 250)
    _, listed, segs = _whole()
    overlap = [_rec("t0", b"", b"p", a), _rec("t1", b"m", None, b)]
    found = _check(overlap, listed, segs).findings
    assert [f.kind for f in found] == [vp.Kind.OVERLAP] and "t1" in found[0].detail
    gap = [_rec("t0", b"", b"g", a), _rec("t1", b"m", None, b)]
    found = _check(gap, listed, segs).findings
    assert [f.kind for f in found] == [vp.Kind.GAP] and "b'g'" in found[0].detail
    # A tablet that ends before the table does, and one that starts after b"".
    assert [f.kind for f in vp.check_tiling("tb", [gap[0]])] == [vp.Kind.GAP]
    assert [f.kind for f in vp.check_tiling("tb", [gap[1]])] == [vp.Kind.GAP]
    # Two tablets reaching the end.
    both = [_rec("t0", b"", None), _rec("t1", b"m", None)]
    assert [f.kind for f in vp.check_tiling("tb", both)] == [vp.Kind.OVERLAP]
    assert [f.kind for f in vp.check_tiling("tb", [])] == [vp.Kind.NO_TABLETS]


def test_a_missing_segment_past_the_in_flight_window_is_a_gap() -> None:
    records, listed, _ = _whole()
    segs = [vp.SegmentFacts(n, 50, declared=50) for n in range(0, 20) if n != 4]
    found = _check(records, listed, segs).findings
    assert [f.kind for f in found] == [vp.Kind.LOG_GAP]
    assert "segments 4 missing" in found[0].detail
    # Missing below every tablet's log position: not needed, not a finding.
    segs = [vp.SegmentFacts(n, 50, declared=50) for n in range(0, 20) if n != 1]
    assert _check(records, listed, segs).ok
    # Missing within the in-flight window of the last segment: a PUT that failed in flight.
    segs = [vp.SegmentFacts(n, 50, declared=50) for n in range(0, 20) if n != 17]
    assert _check(records, listed, segs).ok
    # After a fence nothing counts.
    segs = [vp.SegmentFacts(n, 50, declared=50) for n in range(0, 5)]
    segs += [vp.SegmentFacts(5, 0), vp.SegmentFacts(30, 50, declared=7)]
    assert _check(records, listed, segs).ok


def test_a_truncated_or_unreadable_segment_is_found() -> None:
    records, listed, segs = _whole()
    segs[3] = vp.SegmentFacts(3, 40, declared=50)
    found = _check(records, listed, segs).findings
    assert [f.kind for f in found] == [vp.Kind.SEGMENT]
    assert found[0].subject == "log w1/3 segment 3" and "declares 50" in found[0].detail
    segs[3] = vp.SegmentFacts(3, 40, problem="header checksum mismatch")
    assert [f.kind for f in _check(records, listed, segs).findings] == [vp.Kind.SEGMENT]


def test_checksums_are_compared_when_recorded() -> None:
    info = {"k": ObjectInfo("k", 5, 0.0)}
    ref = vp.ObjectRef("k", 5, "backup b1", checksum="0000ABCD")
    assert vp.check_references([ref], info, {"k": "0000abcd"}) == []
    found = vp.check_references([ref], info, {"k": "00000001"})
    assert [f.kind for f in found] == [vp.Kind.CHECKSUM] and "backup b1" in found[0].detail
    # No checksum computed (not deep): only the size is checked.
    assert vp.check_references([ref], info, {}) == []


def test_orphans_are_listed_not_found() -> None:
    records, listed, segs = _whole()
    stray = layout.sstable_key("tb", "t0", "default", "stray")
    live = gc_plan.LiveSet(
        tables=frozenset({"tb"}),
        sstables=frozenset(r.key for rec in records for rs in rec.sstables.values() for r in rs),
        logs=frozenset({LOG}),
    )
    report = _check(records, [*listed, ObjectInfo(stray, 7, NOW)], segs, live=live)
    assert report.ok
    assert report.orphans == (stray,) and report.orphan_bytes == 7
