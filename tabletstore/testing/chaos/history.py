"""The chaos history: every client operation and every fault, with timestamps (Jepsen's history).

An operation is recorded twice, as in Jepsen: :meth:`History.invoke` when the client starts it
and :meth:`History.complete` when the outcome is known, with one of three outcomes:

* ``ok`` - acknowledged (a write was applied; a read returned what it carries);
* ``fail`` - refused: the error promises nothing was applied (``may_have_applied`` false,
  errors.py);
* ``info`` - indeterminate: ``Indeterminate`` (or a cancellation at the end of the run), the
  write may or may not have taken effect, now or at any later time.

Operations still open when the history is closed count as ``info``. Times are
``time.monotonic()`` seconds relative to the history's start, so "W completed before R started"
is a comparison of two floats measured by one clock in one process. Faults are recorded as
intervals (kind, target, start, end, detail) by the nemesis.

The history lives in the harness's one asyncio loop; the nemesis's blocking process work runs
in threads, so every mutation of the lists takes a lock (cheap: no contention worth measuring).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

__all__ = ["Fault", "History", "Kind", "Op", "Outcome", "load_ops"]


class Kind(Enum):
    PUT = "put"  # set f:c of the row to a value unique to this operation
    DELETE = "delete"  # delete f:c of the row
    READ = "read"  # point read of one row's f:c
    SCAN = "scan"  # range read; every row of the range is an observation
    #: Single-row transactions on the shared rows, each on one cell (``qualifier``):
    CAS = "cas"  # check-and-mutate: set ``value`` if the cell holds ``expected``
    INCREMENT = "increment"  # read-modify-write: add ``amount``; ``seen`` is the new value
    APPEND = "append"  # read-modify-write: append ``value``; ``seen`` is the new value


class Outcome(Enum):
    OK = "ok"
    FAIL = "fail"
    INFO = "info"


@dataclass(slots=True)
class Op:
    """One client operation. ``row`` is None for scans (``rows`` holds the range)."""

    id: int
    process: str
    kind: Kind
    start: float
    row: bytes | None = None
    #: PUT: the value written (unique per PUT in the whole run).
    value: bytes | None = None
    #: SCAN: the [start, end) range scanned.
    rows: tuple[bytes, bytes] | None = None
    end: float | None = None
    outcome: Outcome | None = None
    #: READ: the value of f:c seen (None: absent). SCAN: row -> value for rows present.
    seen: bytes | None = None
    seen_rows: dict[bytes, bytes] | None = None
    error: str | None = None
    #: The cell of the row the operation touches (``f:<qualifier>``).
    qualifier: bytes = b"c"
    #: CAS: the value the cell must hold for the swap (None: the cell must be absent).
    expected: bytes | None = None
    #: INCREMENT: the amount added.
    amount: int | None = None
    #: CAS: whether the swap happened (None until acknowledged).
    matched: bool | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "id": self.id,
            "process": self.process,
            "kind": self.kind.value,
            "start": round(self.start, 4),
            "end": None if self.end is None else round(self.end, 4),
            "outcome": None if self.outcome is None else self.outcome.value,
            "row": None if self.row is None else self.row.decode(errors="replace"),
            "value": _text(self.value),
            "rows": None if self.rows is None else [r.decode(errors="replace") for r in self.rows],
            "seen": _text(self.seen),
            "seen_rows": None
            if self.seen_rows is None
            else {k.decode(errors="replace"): _text(v) for k, v in self.seen_rows.items()},
            "error": self.error,
            "qualifier": self.qualifier.decode(errors="replace"),
            "expected": _text(self.expected),
            "amount": self.amount,
            "matched": self.matched,
        }


def _bytes(value: object) -> bytes | None:
    """The inverse of :func:`_text`."""
    if value is None:
        return None
    if isinstance(value, dict):
        return bytes.fromhex(str(value["hex"]))
    return str(value).encode()


def _op_from_json(o: dict[str, Any]) -> Op:
    op = Op(o["id"], o["process"], Kind(o["kind"]), o["start"], _bytes(o["row"]))
    op.value, op.end, op.seen, op.error = (
        _bytes(o["value"]),
        o["end"],
        _bytes(o["seen"]),
        o["error"],
    )
    op.outcome = None if o["outcome"] is None else Outcome(o["outcome"])
    if o["rows"] is not None:
        lo, hi = (r.encode() for r in o["rows"])
        op.rows = (lo, hi)
    if o["seen_rows"] is not None:
        op.seen_rows = {k.encode(): _bytes(v) or b"" for k, v in o["seen_rows"].items()}
    op.qualifier = o.get("qualifier", "c").encode()
    op.expected, op.amount, op.matched = (
        _bytes(o.get("expected")),
        o.get("amount"),
        o.get("matched"),
    )
    return op


def load_ops(path: Path) -> list[Op]:
    """The operations of a history saved by :meth:`History.save` (to check it again)."""
    data = json.loads(path.read_text())
    return [_op_from_json(o) for o in data["ops"]]


def _text(value: bytes | None) -> str | dict[str, str] | None:
    """A value for the JSON history: text, or ``{"hex": ...}`` when it is not UTF-8 (a
    counter's 8 bytes), so the saved history can be checked again exactly."""
    if value is None:
        return None
    try:
        return value.decode()
    except UnicodeDecodeError:
        return {"hex": value.hex()}


@dataclass(slots=True)
class Fault:
    """One fault the nemesis applied: ``start`` when applied, ``end`` when healed."""

    kind: str
    target: str
    start: float
    end: float | None = None
    detail: dict[str, object] = field(default_factory=dict)


class History:
    """Append-only operations and faults of one run (see the module docstring)."""

    def __init__(self) -> None:
        self._t0 = time.monotonic()
        #: The wall-clock time of the history's zero: lines of the processes' logs (wall
        #: clock) can then be placed on its timeline (bench/recovery_timeline.py).
        self.t0_wall = time.time()
        self._lock = threading.Lock()
        self.ops: list[Op] = []
        self.faults: list[Fault] = []
        #: Free-form observations (e.g. the location poller's), each (time, kind, data).
        self.notes: list[tuple[float, str, dict[str, object]]] = []

    def now(self) -> float:
        return time.monotonic() - self._t0

    def invoke(
        self,
        process: str,
        kind: Kind,
        *,
        row: bytes | None = None,
        value: bytes | None = None,
        rows: tuple[bytes, bytes] | None = None,
        qualifier: bytes = b"c",
        expected: bytes | None = None,
        amount: int | None = None,
    ) -> Op:
        with self._lock:
            op = Op(len(self.ops), process, kind, self.now(), row, value, rows)
            op.qualifier, op.expected, op.amount = qualifier, expected, amount
            self.ops.append(op)
            return op

    def complete(
        self,
        op: Op,
        outcome: Outcome,
        *,
        seen: bytes | None = None,
        seen_rows: dict[bytes, bytes] | None = None,
        error: str | None = None,
        matched: bool | None = None,
    ) -> None:
        with self._lock:
            if op.outcome is not None:
                raise ValueError(f"operation {op.id} completed twice")
            op.end, op.outcome = self.now(), outcome
            op.seen, op.seen_rows, op.error = seen, seen_rows, error
            op.matched = matched

    def fault(self, kind: str, target: str, **detail: object) -> Fault:
        with self._lock:
            f = Fault(kind, target, self.now(), detail=dict(detail))
            self.faults.append(f)
            return f

    def heal(self, fault: Fault, **detail: object) -> None:
        with self._lock:
            fault.end = self.now()
            fault.detail.update(detail)

    def note(self, kind: str, **data: object) -> None:
        with self._lock:
            self.notes.append((self.now(), kind, dict(data)))

    def close(self) -> None:
        """Mark operations still open as indeterminate (their effect is unknown)."""
        with self._lock:
            end = self.now()
            for op in self.ops:
                if op.outcome is None:
                    op.end, op.outcome, op.error = end, Outcome.INFO, "open at the end of the run"

    def save(self, path: Path) -> None:
        with self._lock:
            data = {
                "t0_wall": self.t0_wall,
                "ops": [op.to_json() for op in self.ops],
                "faults": [asdict(f) for f in self.faults],
                "notes": [[round(t, 4), k, d] for t, k, d in self.notes],
            }
        path.write_text(json.dumps(data, default=str))
