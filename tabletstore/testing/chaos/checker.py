"""The chaos checker: a pure function from a history to the anomalies in it (Jepsen's checker).

Model (Knossos-lite, per cell). The workload gives every row a single writer, which issues one
operation at a time, so a row's writes are totally ordered by the writer's order: write ``k``
of a row is its k-th PUT or DELETE of ``f:c``. Every PUT writes a value unique in the whole run,
so a value names its write. Cell timestamps are the server's, and the writer never starts a
write before the previous one completed, so a later write always has the newer timestamp (one
machine, one clock). Then, for every observation of a row (a point read, a row of a scan, or
the final read made after every fault was healed):

* **never written**: a value no PUT of that row wrote, or a value of a PUT that was refused
  (``fail``: the error promised it was not applied), or of a PUT that started only after the
  read had completed;
* **stale**: let ``floor`` be the newest write acknowledged before the read started, or the
  newest write an earlier read (completed before this one started) observed. The read must
  show write ``k >= floor``: the value of a PUT ``k``, or nothing when ``k`` is a DELETE (a
  DELETE acknowledged, indeterminate or in flight may explain an absent cell; so does "never
  written yet" when there is no floor). An older value after an acknowledged PUT is a lost
  (or not yet visible) write; an older value after an acknowledged DELETE is a cell read after
  its acknowledged delete.

Stale observations in the final read are **lost** acknowledged writes (counted once per row:
the newest acknowledged write of that row is gone); stale or never-written observations
during the run are **wrong reads**. An indeterminate write may appear or not, at any time, but
once observed it stays (the ``floor`` from earlier reads). A row with an acknowledged write that
no final read or scan observed is **unread**: nothing rules out its loss, so it fails the run.

**Double-serving** ("two workers acknowledge writes for one tablet at one moment") is checked
from evidence, not inferred: ``runner.attribute_values`` reads every commit-log segment left in
the bucket, and the copies the S3 fault proxy kept of those garbage collection deleted during
the run; a segment's key names its worker and incarnation and its records hold the values,
so each acknowledged PUT whose value is in exactly one worker's log is attributed to that
worker (a value in two logs was retried after an ambiguous failure; it is left out). For each
tablet, a witness is three acknowledged writes ``x``, ``y``, ``x'`` with ``x`` and ``x'``
acknowledged by worker X, ``y`` by another worker Y, and ``x.end < y.start``,
``y.end < x'.start``: X served the tablet, then Y did, then X again. That is legitimate only if
the master gave the tablet back to X, which the location poller would have seen: the witness is
excused when the tablet was observed at X (by worker id, not address: a worker that rejoins
after losing its lease is a new worker on the same address) between ``y.start`` and
``x'.end`` plus a few poll intervals. A zombie (paused past its lease, then resumed) that
acknowledges a write for a tablet that moved away shows exactly this pattern and is never
excused. What is not caught: a zombie whose tablet legitimately returns to it within that
window, and acknowledgements whose value landed in two logs.

**Linearizability**: every cell of the history, the single-writer ``f:c`` of each row and the
transactors' shared registers, counters and lists alike, is checked against a register model
by :mod:`.linearizability` (check-and-mutate, increments and appends included, reads against
the real-time order of acknowledged writes); a cell whose history no order explains is a
violation.

**Recovery** after a worker kill: for each tablet the killed worker held (per the location
poller's last observation before the kill), the seconds from the kill until the first operation
on that tablet that started after the kill was acknowledged; a kill's recovery is the slowest of
its tablets. **Availability**: per tablet, the longest gap between two acknowledged writes, and
for each kill the longest such gap, within the 30 s after it, of the tablets it did not hold.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from tabletstore.testing.chaos.history import Fault, Kind, Op, Outcome
from tabletstore.testing.chaos.linearizability import (
    SCANNED_QUALIFIER,
    Result,
    check_linearizable,
)

__all__ = ["Anomaly", "Kill", "Verdict", "check"]

#: Seconds after the last acknowledgement by Y within which a move back to X must have been
#: observed (allows for the poller's interval and a slow status call).
EXCUSE_SLACK = 5.0
#: Seconds after a kill during which the other tablets' write gaps are measured.
AVAILABILITY_WINDOW = 30.0


@dataclass(frozen=True)
class Anomaly:
    kind: str  # "lost", "wrong_read" or "double_serving"
    row: str
    at: float
    detail: str
    #: The last fault applied before ``at`` (kind, target, start), for the report.
    after_fault: str | None = None


@dataclass(frozen=True)
class Kill:
    """A worker SIGKILL: when, which worker, and the tablets it held then."""

    at: float
    worker: str
    tablets: frozenset[int]


@dataclass
class Verdict:
    operations: dict[str, int] = field(default_factory=dict)
    lost: list[Anomaly] = field(default_factory=list)
    wrong_reads: list[Anomaly] = field(default_factory=list)
    double_serving: list[Anomaly] = field(default_factory=list)
    #: One entry per kill: seconds until its last tablet was served again (None: never).
    recovery: list[float | None] = field(default_factory=list)
    #: tablet index -> (longest gap between acknowledged writes, time the gap started).
    write_gaps: dict[int, tuple[float, float]] = field(default_factory=dict)
    #: Per kill, the longest write gap of the tablets it did not hold (within the window).
    unaffected_gaps: list[float] = field(default_factory=list)
    attributed: int = 0
    linearizability: Result = field(default_factory=Result)
    #: Rows with an acknowledged write that no successful read or scan observed after the
    #: faults were healed: whether their writes survived is unknown, which fails the run.
    unread: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.lost
            or self.wrong_reads
            or self.double_serving
            or self.linearizability.violations
            or self.unread
        )

    def recovery_summary(self) -> tuple[float | None, float | None, int]:
        """(median, max) of the recovered kills' seconds, and how many never recovered."""
        done = [r for r in self.recovery if r is not None]
        never = len(self.recovery) - len(done)
        if not done:
            return None, None, never
        return statistics.median(done), max(done), never


@dataclass(frozen=True)
class _Obs:
    row: bytes
    start: float
    end: float
    value: bytes | None
    final: bool
    op: int


def _observations(ops: Sequence[Op], final_after: float) -> list[_Obs]:
    known = sorted({op.row for op in ops if op.row is not None})
    out: list[_Obs] = []
    for op in ops:
        if op.outcome is not Outcome.OK or op.end is None:
            continue
        final = op.start >= final_after
        if op.kind is Kind.READ and op.row is not None:
            out.append(_Obs(op.row, op.start, op.end, op.seen, final, op.id))
        elif op.kind is Kind.SCAN and op.rows is not None:
            lo, hi = op.rows
            seen = op.seen_rows or {}
            rows = set(known[bisect.bisect_left(known, lo) : bisect.bisect_left(known, hi)])
            for row in sorted(rows | set(seen)):
                out.append(_Obs(row, op.start, op.end, seen.get(row), final, op.id))
    return out


def _fault_before(faults: Sequence[Fault], at: float) -> str | None:
    before = [f for f in faults if f.start <= at]
    if not before:
        return None
    f = max(before, key=lambda f: f.start)
    return f"{f.kind} {f.target} at {f.start:.1f}s"


def check(
    ops: Sequence[Op],
    *,
    final_after: float,
    faults: Sequence[Fault] = (),
    tablet_of: Callable[[bytes], int] | None = None,
    value_workers: Mapping[bytes, frozenset[str]] | None = None,
    locations: Mapping[int, Sequence[tuple[float, str]]] | None = None,
    kills: Sequence[Kill] = (),
) -> Verdict:
    """Check ``ops`` (see the module docstring). Reads starting at or after ``final_after``
    form the final read. ``tablet_of`` maps a row to its tablet index; ``value_workers`` each
    value to the workers whose logs hold it; ``locations`` each tablet to the poller's
    (time, worker id) observations of where it was served."""
    verdict = Verdict()
    for op in ops:
        key = f"{op.kind.value}:{op.outcome.value if op.outcome else 'open'}"
        verdict.operations[key] = verdict.operations.get(key, 0) + 1
    _check_cells(ops, final_after, faults, verdict)
    verdict.linearizability = check_linearizable(ops)
    if tablet_of is not None:
        _check_availability(ops, tablet_of, kills, verdict)
        if value_workers is not None:
            _check_double_serving(
                ops,
                tablet_of,
                value_workers,
                locations or {},
                faults,
                verdict,
            )
    return verdict


def _check_cells(
    ops: Sequence[Op], final_after: float, faults: Sequence[Fault], verdict: Verdict
) -> None:
    # The single-writer cell f:c; the transactors' cells have many writers and are checked
    # for linearizability (linearizability.py).
    ops = [op for op in ops if op.qualifier == SCANNED_QUALIFIER]
    writes: dict[bytes, list[Op]] = {}
    for op in ops:
        if op.kind in (Kind.PUT, Kind.DELETE) and op.row is not None:
            writes.setdefault(op.row, []).append(op)
    index_of: dict[bytes, tuple[bytes, int]] = {}
    acks: dict[bytes, tuple[list[float], list[int]]] = {}
    for row, ws in writes.items():
        ws.sort(key=lambda w: w.start)
        acked = sorted((w.end, k) for k, w in enumerate(ws) if w.outcome is Outcome.OK)
        ends, best, floor = [], [], -1
        for end, k in acked:
            assert end is not None
            floor = max(floor, k)
            ends.append(end)
            best.append(floor)
        acks[row] = (ends, best)
        for k, w in enumerate(ws):
            if w.kind is Kind.PUT and w.value is not None:
                index_of[w.value] = (row, k)

    by_row: dict[bytes, list[_Obs]] = {}
    for obs in _observations(ops, final_after):
        by_row.setdefault(obs.row, []).append(obs)
    verdict.unread = sorted(
        row.decode(errors="replace")
        for row, (ends, _) in acks.items()
        if ends and not any(obs.final for obs in by_row.get(row, ()))
    )
    lost_rows: set[bytes] = set()
    for row, observations in by_row.items():
        ws = writes.get(row, [])
        ends, best = acks.get(row, ([], []))
        # Reads that observed a PUT, as a heap by completion time, for the "once observed"
        # floor: popped into ``seen_floor`` once they completed before the current start.
        pending: list[tuple[float, int]] = []
        seen_floor = -1
        for obs in sorted(observations, key=lambda o: o.start):
            kind = "lost" if obs.final else "wrong_read"
            name = row.decode(errors="replace")

            def report(kind: str, detail: str, obs: _Obs = obs, name: str = name) -> None:
                anomaly = Anomaly(kind, name, obs.start, detail, _fault_before(faults, obs.start))
                (verdict.lost if kind == "lost" else verdict.wrong_reads).append(anomaly)

            i = bisect.bisect_left(ends, obs.start)
            ack_floor = best[i - 1] if i else -1
            while pending and pending[0][0] < obs.start:
                seen_floor = max(seen_floor, heapq.heappop(pending)[1])
            floor = max(ack_floor, seen_floor)
            if obs.value is not None:
                where = index_of.get(obs.value)
                if where is None or where[0] != row:
                    report("wrong_read", f"value {obs.value!r} was never written to this row")
                    continue
                k = where[1]
                w = ws[k]
                if w.outcome is Outcome.FAIL:
                    report("wrong_read", f"value {obs.value!r} of a refused write ({w.error})")
                elif w.start > obs.end:
                    report("wrong_read", f"value {obs.value!r} read before its write started")
                elif k < floor:
                    newer = ws[floor]
                    what = (
                        f"acknowledged delete (op {newer.id}, done {newer.end:.2f}s)"
                        if newer.kind is Kind.DELETE
                        else f"acknowledged write {newer.value!r} (done {newer.end:.2f}s)"
                        if floor == ack_floor
                        else f"an earlier read's {newer.value!r}"
                    )
                    if obs.final:
                        lost_rows.add(row)
                    report(
                        kind if floor == ack_floor else "wrong_read",
                        f"read {obs.value!r} (write #{k}) after {what}",
                    )
                heapq.heappush(pending, (obs.end, k))
            elif floor >= 0:
                # Absent: some delete at or after the floor (not refused, started before the
                # read ended) must explain it.
                if not any(
                    ws[d].kind is Kind.DELETE
                    and ws[d].outcome is not Outcome.FAIL
                    and ws[d].start < obs.end
                    for d in range(floor, len(ws))
                ):
                    newer = ws[floor]
                    source = "acknowledged" if floor == ack_floor else "earlier read's"
                    if obs.final and floor == ack_floor:
                        lost_rows.add(row)
                    report(
                        kind if floor == ack_floor else "wrong_read",
                        f"cell absent after {source} write {newer.value!r} (op {newer.id})",
                    )
    # One lost entry per row in the count (the final read may have read a row twice).
    seen_lost: set[str] = set()
    unique = []
    for anomaly in verdict.lost:
        if anomaly.row not in seen_lost:
            seen_lost.add(anomaly.row)
            unique.append(anomaly)
    verdict.lost = unique


def _acked_writes(ops: Sequence[Op]) -> list[Op]:
    return [
        op
        for op in ops
        if op.kind in (Kind.PUT, Kind.DELETE) and op.outcome is Outcome.OK and op.row is not None
    ]


def _check_availability(
    ops: Sequence[Op], tablet_of: Callable[[bytes], int], kills: Sequence[Kill], verdict: Verdict
) -> None:
    ends: dict[int, list[float]] = {}
    for op in _acked_writes(ops):
        assert op.row is not None and op.end is not None
        ends.setdefault(tablet_of(op.row), []).append(op.end)
    for times in ends.values():
        times.sort()
    for tablet, times in ends.items():
        gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
        verdict.write_gaps[tablet] = max(gaps, default=(0.0, 0.0))
    firsts: dict[int, list[tuple[float, float]]] = {}
    for op in ops:
        if op.outcome is Outcome.OK and op.row is not None and op.end is not None:
            firsts.setdefault(tablet_of(op.row), []).append((op.start, op.end))
    for spans in firsts.values():
        spans.sort()
    for kill in kills:
        slowest: float | None = 0.0
        for tablet in kill.tablets:
            spans = firsts.get(tablet, [])
            i = bisect.bisect_left(spans, (kill.at, 0.0))
            done = min((end for _, end in spans[i:]), default=None)
            if done is None:
                slowest = None
                break
            assert slowest is not None
            slowest = max(slowest, done - kill.at)
        verdict.recovery.append(slowest)
        worst = 0.0
        for tablet, times in ends.items():
            if tablet in kill.tablets:
                continue
            window = (
                [kill.at]
                + [t for t in times if kill.at < t < kill.at + AVAILABILITY_WINDOW]
                + [kill.at + AVAILABILITY_WINDOW]
            )
            after = [t for t in times if t >= kill.at + AVAILABILITY_WINDOW]
            if not after and times and times[-1] < kill.at + AVAILABILITY_WINDOW:
                window[-1] = max(times[-1], kill.at)  # the run ended inside the window
            worst = max(worst, max(b - a for a, b in itertools.pairwise(window)))
        verdict.unaffected_gaps.append(worst)


def _check_double_serving(
    ops: Sequence[Op],
    tablet_of: Callable[[bytes], int],
    value_workers: Mapping[bytes, frozenset[str]],
    locations: Mapping[int, Sequence[tuple[float, str]]],
    faults: Sequence[Fault],
    verdict: Verdict,
) -> None:
    per_tablet: dict[int, list[tuple[Op, str]]] = {}
    for op in _acked_writes(ops):
        if op.kind is not Kind.PUT or op.value is None:
            continue
        workers = value_workers.get(op.value, frozenset())
        if len(workers) == 1:
            assert op.row is not None
            per_tablet.setdefault(tablet_of(op.row), []).append((op, next(iter(workers))))
            verdict.attributed += 1
    reported: set[tuple[int, str, str]] = set()
    for tablet, acked in per_tablet.items():
        by_end = sorted(acked, key=lambda a: a[0].end or 0.0)
        by_start = sorted(acked, key=lambda a: a[0].start)
        min_end: dict[str, tuple[float, Op]] = {}  # worker -> its earliest-ending ack
        latest: dict[str, Op] = {}  # worker -> its latest-starting ack among those added
        added = 0
        seen = locations.get(tablet, ())
        for x2, worker in by_start:
            while added < len(by_end) and (by_end[added][0].end or 0.0) < x2.start:
                y, other = by_end[added]
                added += 1
                if other not in latest or y.start > latest[other].start:
                    latest[other] = y
                end = y.end or 0.0
                if other not in min_end or end < min_end[other][0]:
                    min_end[other] = (end, y)
            if worker not in min_end:
                continue
            first_end, x = min_end[worker]
            for other, y in latest.items():
                if other == worker or not first_end < y.start:
                    continue
                limit = (x2.end or x2.start) + EXCUSE_SLACK
                if any(y.start < t <= limit and w == worker for t, w in seen):
                    continue  # the tablet was given back to ``worker``: a legitimate move
                if (tablet, worker, other) in reported:
                    break  # one witness per episode (tablet, zombie, new owner)
                reported.add((tablet, worker, other))
                verdict.double_serving.append(
                    Anomaly(
                        "double_serving",
                        f"tablet {tablet}",
                        x2.start,
                        f"{worker} acknowledged {x.value!r} (done {x.end:.2f}s), then {other} "
                        f"acknowledged {y.value!r} ({y.start:.2f}-{y.end:.2f}s), then {worker} "
                        f"acknowledged {x2.value!r} ({x2.start:.2f}-{x2.end:.2f}s) without the "
                        "tablet being seen back at it",
                        _fault_before(faults, x2.start),
                    )
                )
                break
