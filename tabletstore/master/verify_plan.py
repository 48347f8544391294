"""Whether a bucket is whole: the verifier's pure checker (§5.2, §5.3; docs/architecture/gc.md).

The checks, over plain values gathered by :mod:`tabletstore.master.verify` (no I/O here):

* **references**: every object a tablet record, a snapshot manifest or any other manifest
  (a backup's) references exists with the size it records, and with the checksum it records
  when it records one (:class:`ObjectRef`);
* **tiling**: each table's tablets tile its row space in order, ``[b"", e1) [e1, e2) ...
  [en, None)``, with no gap and no overlap;
* **logs**: each commit log a tablet record lists runs without a gap from the tablet's log
  position (``TabletRecord.log_start``) to its last segment, as the reader demands
  (``commitlog.reader``: a number missing further down than the in-flight window below the
  last segment is a lost object), up to the first fence; every segment in that run is whole
  (the length its header declares is the object's size, and the header names its log);
* **orphans**: objects nothing references, the ones garbage collection would delete with no
  grace period (:func:`tabletstore.master.gc_plan.plan`). They are listed, never findings:
  an orphan is garbage waiting for its grace period, or an upload whose commit is in flight.

A :class:`Finding` is damage (an acknowledged write or a pinned cut may be gone); the report
is whole when it has none. Anything that references SSTables can be checked with
:func:`check_references`, so a manifest format defined elsewhere (backups) needs no change
here: it lists its objects as :class:`ObjectRef`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from tabletstore.commitlog.format import IN_FLIGHT_WINDOW
from tabletstore.master import gc_plan
from tabletstore.metadata.record import LogRef, SSTableRef, TabletRecord
from tabletstore.storage_s3.base import ObjectInfo

__all__ = [
    "Finding",
    "Kind",
    "LogFacts",
    "ObjectRef",
    "SegmentFacts",
    "VerifyInputs",
    "VerifyReport",
    "check",
    "check_log",
    "check_references",
    "check_tiling",
    "refs_of_record",
]


class Kind(StrEnum):
    """What a finding is."""

    MISSING = "missing object"
    SIZE = "size differs from the recorded size"
    CHECKSUM = "checksum differs from the recorded checksum"
    GAP = "row ranges leave a gap"
    OVERLAP = "row ranges overlap"
    NO_TABLETS = "table has no tablets"
    LOG_GAP = "commit log has a missing segment"
    SEGMENT = "commit-log segment is damaged"
    MANIFEST = "manifest is unreadable"
    INCOMPLETE = "backup is incomplete"
    EXPIRED = "backup has expired"


@dataclass(frozen=True, slots=True)
class Finding:
    """One piece of damage: its kind, the object or table it is about, and who says so."""

    kind: Kind
    subject: str
    detail: str

    def line(self) -> str:
        return f"{self.kind.value}: {self.subject} ({self.detail})"


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """An object something references: its key, recorded size and, if recorded, checksum of
    the whole object (lowercase hex crc32c, or a backup manifest's ``sha256:<hex>``), and who
    references it (for the report)."""

    key: str
    size: int
    owner: str
    checksum: str | None = None


@dataclass(frozen=True, slots=True)
class SegmentFacts:
    """One listed segment of a log, from its header: ``declared`` is the object's length the
    header declares (None for a fence, or when ``problem`` says why it could not be read)."""

    number: int
    size: int
    declared: int | None = None
    problem: str | None = None


@dataclass(frozen=True, slots=True)
class LogFacts:
    """A commit log a tablet record lists: its listed segments (ascending) and, per listing
    tablet, the first segment it needs."""

    ref: LogRef
    segments: tuple[SegmentFacts, ...]
    starts: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class VerifyInputs:
    """What the shell gathered."""

    #: The listing the check is against (the whole bucket, or a table's prefixes); any key a
    #: reference names that the listing missed was looked up afterwards and is here too.
    listed: Sequence[ObjectInfo]
    #: Table id -> its tablet records (in any order).
    tables: Mapping[str, Sequence[TabletRecord]]
    #: Every other reference (snapshot and backup manifests' SSTables).
    refs: Sequence[ObjectRef] = ()
    #: The logs the records list, with their segments.
    logs: Sequence[LogFacts] = ()
    #: Damage found while gathering (a manifest that does not parse).
    found: Sequence[Finding] = ()
    #: The garbage collector's roots, for the orphans; None: no orphans reported.
    live: gc_plan.LiveSet | None = None
    #: Keys whose checksum was computed (the ``deep`` check): key -> checksum, in the form
    #: its references record.
    checksums: Mapping[str, str] = field(default_factory=dict)
    now: float = 0.0


@dataclass(frozen=True, slots=True)
class VerifyReport:
    """What the verifier found. ``ok``: no finding (orphans do not count)."""

    findings: tuple[Finding, ...]
    orphans: tuple[str, ...]
    orphan_bytes: int
    tables: int
    tablets: int
    objects_checked: int
    segments_checked: int

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        """One line for logs and the CLI."""
        verdict = "whole" if self.ok else f"{len(self.findings)} findings"
        return (
            f"verify: {verdict}; {self.tables} tables, {self.tablets} tablets, "
            f"{self.objects_checked} objects and {self.segments_checked} log segments "
            f"checked; {len(self.orphans)} orphans ({self.orphan_bytes} bytes, left to GC)"
        )

    def lines(self) -> list[str]:
        """The summary, then one line per finding and per orphan."""
        return [
            self.summary(),
            *(f"  {f.line()}" for f in self.findings),
            *(f"  orphan: {k}" for k in self.orphans),
        ]


def refs_of_record(record: TabletRecord) -> list[ObjectRef]:
    """The SSTables a tablet record references, as :class:`ObjectRef`."""
    owner = f"tablet {record.table_id}/{record.tablet_id}"
    return [ObjectRef(r.key, r.size, owner) for refs in record.sstables.values() for r in refs]


def sstable_refs(refs: Iterable[SSTableRef], owner: str) -> list[ObjectRef]:
    """``refs`` (a manifest's SSTables) as :class:`ObjectRef` owned by ``owner``."""
    return [ObjectRef(r.key, r.size, owner) for r in refs]


def check_references(
    refs: Iterable[ObjectRef],
    listed: Mapping[str, ObjectInfo],
    checksums: Mapping[str, str] | None = None,
) -> list[Finding]:
    """Every reference's object exists with its recorded size (and checksum, when both the
    reference records one and ``checksums`` holds the object's). One finding per object and
    owner."""
    out: list[Finding] = []
    seen: set[tuple[str, str]] = set()
    for ref in refs:
        if (ref.key, ref.owner) in seen:
            continue
        seen.add((ref.key, ref.owner))
        info = listed.get(ref.key)
        if info is None:
            out.append(Finding(Kind.MISSING, ref.key, f"referenced by {ref.owner}"))
        elif info.size != ref.size:
            out.append(
                Finding(
                    Kind.SIZE,
                    ref.key,
                    f"{info.size} bytes, {ref.owner} records {ref.size}",
                )
            )
        elif ref.checksum is not None and checksums and ref.key in checksums:
            if checksums[ref.key] != ref.checksum.lower():
                out.append(
                    Finding(
                        Kind.CHECKSUM,
                        ref.key,
                        f"{checksums[ref.key]}, {ref.owner} records {ref.checksum}",
                    )
                )
    return out


def _row(row: bytes | None) -> str:
    return "the end" if row is None else repr(row)


def check_tiling(table_id: str, records: Sequence[TabletRecord]) -> list[Finding]:
    """The tablets of ``table_id`` tile its rows: start at ``b""``, each starts where the
    one before ends, the last has no end."""
    if not records:
        return [Finding(Kind.NO_TABLETS, f"table {table_id}", "no tablet records")]
    out: list[Finding] = []
    ordered = sorted(records, key=lambda r: (r.start_row, r.end_row is None, r.end_row or b""))
    expect: bytes | None = b""
    prev: TabletRecord | None = None
    for rec in ordered:
        subject = f"table {table_id}"
        if expect is None:
            # The previous tablet reached the end: this one overlaps it.
            assert prev is not None
            out.append(
                Finding(
                    Kind.OVERLAP,
                    subject,
                    f"{rec.tablet_id} [{_row(rec.start_row)}, {_row(rec.end_row)}) lies inside "
                    f"{prev.tablet_id} [{_row(prev.start_row)}, the end)",
                )
            )
        elif rec.start_row < expect:
            assert prev is not None
            out.append(
                Finding(
                    Kind.OVERLAP,
                    subject,
                    f"{rec.tablet_id} starts at {_row(rec.start_row)}, before "
                    f"{prev.tablet_id} ends at {_row(expect)}",
                )
            )
        elif rec.start_row > expect:
            out.append(
                Finding(
                    Kind.GAP,
                    subject,
                    f"no tablet holds [{_row(expect)}, {_row(rec.start_row)})",
                )
            )
        if rec.end_row is not None and rec.end_row <= rec.start_row:
            out.append(
                Finding(
                    Kind.OVERLAP,
                    subject,
                    f"{rec.tablet_id} ends at {_row(rec.end_row)}, not after its start "
                    f"{_row(rec.start_row)}",
                )
            )
        if expect is not None and (rec.end_row is None or rec.end_row > expect):
            expect = rec.end_row
        prev = rec
    if expect is not None:
        out.append(
            Finding(Kind.GAP, f"table {table_id}", f"no tablet holds [{_row(expect)}, the end)")
        )
    return out


def check_log(log: LogFacts) -> tuple[list[Finding], int]:
    """A log a tablet needs runs without a gap from the least needed segment to its first
    fence (or last segment), each segment whole; returns the findings and how many segments
    were checked. A missing number within the in-flight window of the last listed segment is
    a PUT that failed in flight (nothing from it on was acknowledged; recovery plugs it), not
    damage."""
    name = f"log {log.ref.worker_id}/{log.ref.incarnation}"
    if not log.starts:
        return [], 0
    start = min(log.starts.values())
    needers = ", ".join(sorted(log.starts))
    segments = [s for s in log.segments if s.number >= start]
    if not segments:
        return [], 0
    fence = next((s.number for s in segments if s.size == 0), None)
    last = segments[-1].number
    present = {s.number for s in segments}
    out: list[Finding] = []
    end = fence if fence is not None else last
    window_low = last - IN_FLIGHT_WINDOW + 1
    missing = [n for n in range(start, end) if n not in present and n < window_low]
    if missing:
        shown = ", ".join(str(n) for n in missing[:10]) + (" ..." if len(missing) > 10 else "")
        out.append(
            Finding(
                Kind.LOG_GAP,
                name,
                f"segments {shown} missing between {start} (needed by {needers}) and {end}",
            )
        )
    checked = 0
    for seg in segments:
        if fence is not None and seg.number >= fence:
            break
        checked += 1
        if seg.problem is not None:
            out.append(Finding(Kind.SEGMENT, f"{name} segment {seg.number}", seg.problem))
        elif seg.declared is not None and seg.declared != seg.size:
            out.append(
                Finding(
                    Kind.SEGMENT,
                    f"{name} segment {seg.number}",
                    f"{seg.size} bytes where its header declares {seg.declared} "
                    f"(needed by {needers})",
                )
            )
    return out, checked


def check(inputs: VerifyInputs) -> VerifyReport:
    """Every check of the module docstring over ``inputs``."""
    listed = {o.key: o for o in inputs.listed}
    findings: list[Finding] = list(inputs.found)
    refs: list[ObjectRef] = []
    tablets = 0
    for table_id, records in sorted(inputs.tables.items()):
        findings.extend(check_tiling(table_id, records))
        tablets += len(records)
        for rec in records:
            refs.extend(refs_of_record(rec))
    refs.extend(inputs.refs)
    findings.extend(check_references(refs, listed, inputs.checksums))
    segments = 0
    for log in sorted(inputs.logs, key=lambda lf: (lf.ref.worker_id, lf.ref.incarnation)):
        found, checked = check_log(log)
        findings.extend(found)
        segments += checked
    orphans: tuple[str, ...] = ()
    orphan_bytes = 0
    if inputs.live is not None:
        decided = gc_plan.plan(inputs.live, inputs.listed, inputs.now, grace=0.0, fence_grace=0.0)
        orphans = decided.delete
        orphan_bytes = decided.delete_bytes
    return VerifyReport(
        findings=tuple(findings),
        orphans=orphans,
        orphan_bytes=orphan_bytes,
        tables=len(inputs.tables),
        tablets=tablets,
        objects_checked=len({r.key for r in refs}),
        segments_checked=segments,
    )
