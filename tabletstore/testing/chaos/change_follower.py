"""The chaos run's change-stream follower and its check (``python -m bench.chaos --changes``).

With ``--changes`` the chaos table keeps a change retention and a :class:`ChangeFollower`
reads every partition of its change stream through the whole run (and the partitions that
replace them), through the same client and S3 fault proxy as the workload, while the nemesis
kills workers. A read that fails (an S3 fault, a timeout) resumes its partition from the last
token it was handed, which resumes exactly after the last item read, so a fault never makes
the follower skip or repeat anything on its own account.

:func:`check_changes` is a pure function of the history's operations and the changes read:

* **repeated**: a change delivered more than once (the same row and ``seq``: one log record).
* **lost**: an acknowledged write that no change carries. Writers' rows have one writer each,
  one operation at a time, so their changes must be the writer's acknowledged writes in the
  writer's order (an indeterminate one may be among them); the shared transaction rows are
  matched by the unique value each put, check-and-mutate and append wrote, and their
  increments and deletes are counted.
* **not written**: a change no operation explains (a refused write applied, or a stray record).
* **twice in the log**: the same unique value in two different changes: the client retried an
  idempotent write whose first attempt had landed (two log records, both delivered once; the
  cell holds one version, as the client timestamp is the same). On a writer's row a delete
  repeated at once is the same (a delete is idempotent), unless the writer's next operation
  is a delete too.
* **out of row order**: a row whose changes were not delivered in ``seq`` order. The order
  across a row's move between workers rests on their clocks agreeing within ``CLOCK_SKEW``
  (``client/change_plan.py``): in a run whose nemesis steps a worker's clock 30 s
  (``clock_jump``) it is reported but not a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tabletstore.client.change_plan import (
    Change,
    ChangePartition,
    Heartbeat,
    PartitionEnd,
    overlap,
    tiles,
)
from tabletstore.client.table import AsyncTable
from tabletstore.testing.chaos.history import Kind, Op, Outcome
from tabletstore.testing.chaos.workload import TXN_ROWS

__all__ = ["ChangeFollower", "ChangeVerdict", "check_changes", "finding_lines"]

#: Seconds of change retention the chaos table keeps (longer than any run's reads reach back).
RETENTION = 3600.0


class ChangeFollower:
    """Reads every partition of ``table``'s change stream from ``start_time`` until
    :meth:`stop`, resuming a failed read from its last token."""

    def __init__(self, table: AsyncTable, start_time: float, *, poll: float = 0.5) -> None:
        self.table = table
        self.start_time = start_time
        self.poll = poll
        self.changes: list[Change] = []
        #: Each partition's newest watermark; a partition that ended leaves it.
        self.watermarks: dict[ChangePartition, float] = {}
        self.ended = 0
        self.resumed = 0
        self.errors: list[str] = []
        self._handed: dict[ChangePartition, list[str]] = {}
        self._covered: dict[ChangePartition, list[ChangePartition]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        for part in await self.table.change_partitions():
            self._start(part, [])

    def _start(self, part: ChangePartition, tokens: list[str]) -> None:
        self.watermarks[part] = 0.0
        task = asyncio.create_task(self._read(part, tokens), name=f"changes {part}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, part: ChangePartition, tokens: list[str]) -> None:
        while True:
            try:
                async for item in self.table.read_changes(
                    part,
                    tokens=tokens,
                    start_time=None if tokens else self.start_time,
                    poll=self.poll,
                ):
                    if isinstance(item, Change):
                        self.changes.append(item)
                        tokens = [item.token]
                    elif isinstance(item, Heartbeat):
                        self.watermarks[part] = max(self.watermarks[part], item.watermark)
                        tokens = [item.token]
                    else:
                        self._end(part, item)
                        return
            except Exception as exc:  # any failure: resumed from the last token
                # The token resumes exactly after the last item read.
                self.resumed += 1
                if len(self.errors) < 20:
                    self.errors.append(f"{part}: {type(exc).__name__}: {exc}")
                await asyncio.sleep(1.0)

    def _end(self, part: ChangePartition, end: PartitionEnd) -> None:
        self.ended += 1
        del self.watermarks[part]
        for succ, token in end.successors:
            self._handed.setdefault(succ, []).append(token)
            self._covered.setdefault(succ, []).append(overlap(part, succ))
            if tiles(self._covered[succ], succ):
                del self._covered[succ]
                self._start(succ, self._handed.pop(succ))

    def complete_up_to(self, instant: float) -> bool:
        """Every partition followed now has a heartbeat at or past ``instant`` and none is
        waiting for the tokens of a merge."""
        return (
            bool(self.watermarks)
            and not self._covered
            and all(w >= instant for w in self.watermarks.values())
        )

    async def wait_complete(self, instant: float, deadline: float) -> bool:
        end = time.monotonic() + deadline
        while time.monotonic() < end:
            if self.complete_up_to(instant):
                return True
            await asyncio.sleep(0.5)
        return self.complete_up_to(instant)

    async def stop(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class ChangeVerdict:
    """What :func:`check_changes` found (each list holds a line per finding)."""

    read: int = 0
    acknowledged: int = 0
    lost: list[str] = field(default_factory=list)
    repeated: list[str] = field(default_factory=list)
    not_written: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    twice_in_log: int = 0
    #: Set by the runner: the follower was not complete past the workload's end in time.
    incomplete: str | None = None
    partitions_ended: int = 0
    resumed: int = 0
    #: A worker's clock was stepped past the allowed skew: row order is not promised.
    clock_stepped: bool = False

    @property
    def ok(self) -> bool:
        misordered = bool(self.out_of_order) and not self.clock_stepped
        return not (self.lost or self.repeated or self.not_written or misordered or self.incomplete)

    def lines(self) -> list[str]:
        out = [
            f"change stream: {self.read} changes read for {self.acknowledged} acknowledged "
            f"writes; lost {len(self.lost)}, repeated {len(self.repeated)}, not written "
            f"{len(self.not_written)}, rows out of seq order {len(self.out_of_order)} "
            f"(in the log twice by an idempotent retry: {self.twice_in_log}; partitions "
            f"ended {self.partitions_ended}; reads resumed from a token {self.resumed})"
        ]
        if self.incomplete:
            out.append(f"  CHANGES INCOMPLETE {self.incomplete}")
        out += finding_lines(
            ("CHANGE LOST", self.lost),
            ("CHANGE REPEATED", self.repeated),
            ("CHANGE NOT WRITTEN", self.not_written),
            ("CHANGES OUT OF ORDER", self.out_of_order),
        )
        return out

    def to_json(self) -> dict[str, object]:
        return {
            "read": self.read,
            "acknowledged": self.acknowledged,
            "lost": self.lost,
            "repeated": self.repeated,
            "not_written": self.not_written,
            "out_of_order": self.out_of_order,
            "twice_in_log": self.twice_in_log,
            "incomplete": self.incomplete,
            "partitions_ended": self.partitions_ended,
            "resumed": self.resumed,
            "clock_stepped": self.clock_stepped,
        }


_WRITES = (Kind.PUT, Kind.DELETE, Kind.CAS, Kind.INCREMENT, Kind.APPEND)


def _cell(c: Change) -> tuple[str, bytes, bytes | None]:
    """(kind, qualifier, value of a put) of a chaos change (each writes one cell of ``f``)."""
    m = c.mods[0]
    return (m.kind, m.qualifier, m.value if m.kind == "put" else None)


def check_changes(ops: Iterable[Op], changes: Sequence[Change]) -> ChangeVerdict:
    """Compare the changes read with the history's writes (module docstring)."""
    verdict = ChangeVerdict()
    once: dict[tuple[bytes, int], Change] = {}
    by_row: dict[bytes, list[Change]] = {}
    for c in changes:
        key = (c.row, c.seq)
        if key in once:
            verdict.repeated.append(f"{c.row!r} seq {c.seq} {_cell(c)[:2]}")
            continue
        once[key] = c
        by_row.setdefault(c.row, []).append(c)
    verdict.read = len(once)
    for row, got in by_row.items():
        seqs = [c.seq for c in got]
        if seqs != sorted(seqs):
            verdict.out_of_order.append(f"{row!r}: seqs {seqs[:12]}")
    writes: dict[bytes, list[Op]] = {}
    for op in sorted(ops, key=lambda o: o.start):
        if op.kind in _WRITES and op.row is not None and op.outcome is not Outcome.FAIL:
            if op.kind is Kind.CAS and op.outcome is Outcome.OK and not op.matched:
                continue  # acknowledged, and it wrote nothing
            writes.setdefault(op.row, []).append(op)
    verdict.acknowledged = sum(
        1 for ops_ in writes.values() for op in ops_ if op.outcome is Outcome.OK
    )
    for row in sorted(set(writes) | set(by_row)):
        got = sorted(by_row.get(row, []), key=lambda c: c.seq)
        wanted = writes.get(row, [])
        if row in TXN_ROWS:
            _check_shared(verdict, row, wanted, got)
        else:
            _check_owned(verdict, row, wanted, got)
    return verdict


def _check_owned(verdict: ChangeVerdict, row: bytes, wanted: list[Op], got: list[Change]) -> None:
    """A writer's row: its changes in seq order are its writes in order, each acknowledged
    one present, an indeterminate one present or not; a write's change repeated at once (a
    retried idempotent put or delete: the first attempt timed out after its record was
    logged) is counted apart. A repeat is only taken as one when the next write does not
    match it (two deletes in a row are two writes)."""
    i = 0
    last: tuple[str, bytes, bytes | None] | None = None
    for op in wanted:
        sig = ("put", b"c", op.value) if op.kind is Kind.PUT else ("delete_column", b"c", None)
        while i < len(got) and last is not None and _cell(got[i]) == last != sig:
            verdict.twice_in_log += 1
            i += 1
        if i < len(got) and _cell(got[i]) == sig:
            i += 1
            last = sig
        elif op.outcome is Outcome.OK:
            verdict.lost.append(f"{row!r}: {op.kind.value} {op.value!r} (op {op.id})")
    while i < len(got) and last is not None and _cell(got[i]) == last:
        verdict.twice_in_log += 1
        i += 1
    for c in got[i:]:
        verdict.not_written.append(f"{row!r} seq {c.seq} {_cell(c)}")


def _check_shared(verdict: ChangeVerdict, row: bytes, wanted: list[Op], got: list[Change]) -> None:
    """A shared transaction row: every put, swap and append by its unique value; the
    increments and deletes of each cell by count (``ok`` at least, ``ok + info`` at most)."""
    unmatched = list(got)

    def take(pred: object) -> int:
        assert callable(pred)
        hits = [c for c in unmatched if pred(c)]
        for c in hits:
            unmatched.remove(c)
        return len(hits)

    counted: dict[tuple[Kind, bytes], tuple[int, int]] = {}
    for op in wanted:
        q = op.qualifier
        if op.kind in (Kind.PUT, Kind.CAS, Kind.APPEND):
            value = op.value
            assert value is not None
            if op.kind is Kind.APPEND:
                n = take(
                    lambda c, q=q, v=value: (
                        _cell(c)[:2] == ("put", q)
                        and (c.mods[0].value == v or c.mods[0].value.endswith(b";" + v))
                    )
                )
            else:
                n = take(lambda c, q=q, v=value: _cell(c) == ("put", q, v))
            if n == 0 and op.outcome is Outcome.OK:
                verdict.lost.append(f"{row!r}: {op.kind.value} {q!r} {value!r} (op {op.id})")
            verdict.twice_in_log += max(0, n - 1)
        else:
            ok, info = counted.get((op.kind, q), (0, 0))
            ok, info = (ok + 1, info) if op.outcome is Outcome.OK else (ok, info + 1)
            counted[(op.kind, q)] = (ok, info)
    for (kind, q), (ok, info) in sorted(counted.items(), key=lambda kv: (kv[0][0].value, kv[0][1])):
        want = "put" if kind is Kind.INCREMENT else "delete_column"
        n = take(lambda c, q=q, w=want: _cell(c)[:2] == (w, q))
        if n < ok:
            verdict.lost.append(f"{row!r}: {ok - n} of {ok} {kind.value}s of {q!r}")
        elif n > ok + info:
            verdict.not_written.append(f"{row!r}: {n} {kind.value}s of {q!r}, {ok + info} made")
    for c in unmatched:
        verdict.not_written.append(f"{row!r} seq {c.seq} {_cell(c)}")


def finding_lines(*groups: tuple[str, Sequence[object]]) -> list[str]:
    """A summary's finding lines: the first ten of each titled group, then how many more."""
    out: list[str] = []
    for title, found in groups:
        out.extend(f"  {title} {line}" for line in found[:10])
        if len(found) > 10:
            out.append(f"  ... and {len(found) - 10} more {title.lower()}")
    return out
