"""Linearizability of a chaos history, cell by cell: a model checker in the style of Knossos
and porcupine (a pure function of the history).

Bigtable promises that every operation on one row is atomic (§2: "every read or write of data
under a single row key is atomic"; §3: single-row transactions, read-modify-write). The
strongest statement of that for a history is **linearizability** (Herlihy and Wing): there is
one order of all operations on the cell, consistent with real time (an operation that
completed before another started comes first), in which each operation's result is the one a
single copy of the cell would give. Linearizability is local (compositional), so each cell
``row f:qualifier`` is checked on its own, and per-cell histories stay small.

The model is one register holding ``bytes`` or nothing, with these operations:

* ``read`` (a point read, or one row of a scan): must return the register;
* ``put`` sets it, ``delete`` clears it;
* ``cas`` (check-and-mutate): if the register holds ``expected`` (None: is empty), set it to
  ``value``; the recorded ``matched`` must say whether that happened;
* ``increment``: the register as a 64-bit big-endian signed counter (empty counts as 0) plus
  ``amount``; the recorded new value must be that sum;
* ``append``: the register with ``value`` appended; the recorded new value must be that.

Outcomes: an acknowledged operation (``ok``) took effect at one instant between its invocation
and its completion. A refused one (``fail``: nothing was applied) is left out. An
indeterminate one (``info``: a timeout, Unavailable after sending) may have taken effect at any
instant after its invocation, or never: its completion is at infinity and its result unknown
(as Knossos and porcupine treat Jepsen's ``info``). An indeterminate read is left out (it has no
effect).

The search is Wing and Gong's, with Lowe's memoization (as porcupine's ``checkSingle``): walk
the invocations and completions in time order; at an invocation, try to linearize that
operation now (its result must match the model), remember the (set of linearized operations,
register value) pair so no configuration is explored twice, and backtrack when a completion is
reached whose operation was not linearized yet. A cell whose history is not linearizable yields
a :class:`Violation` naming the operation that could not be placed at the deepest point the
search reached, the register value there, and the operations around it. A search that exceeds
``budget`` steps on one cell gives up on that cell (counted as undecided, never as a
violation): many indeterminate operations on one cell make the search exponential.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tabletstore.testing.chaos.history import Kind, Op, Outcome

__all__ = ["Result", "Violation", "check_linearizable", "counter_value"]

#: Search steps per cell before it is given up as undecided.
BUDGET = 2_000_000
#: The scans of the chaos workload observe this cell of every row in their range.
SCANNED_QUALIFIER = b"c"


def counter_value(value: bytes | None) -> int:
    """The register as a counter, as the server reads it (absent: 0)."""
    if value is None:
        return 0
    return int.from_bytes(value, "big", signed=True)


def _counter_bytes(n: int) -> bytes:
    return (n & ((1 << 64) - 1)).to_bytes(8, "big")


@dataclass(frozen=True, slots=True)
class _Call:
    """One operation on one cell, as the search sees it."""

    op: int  # the history's operation id
    kind: Kind  # READ (also a scan's row), PUT, DELETE, CAS, INCREMENT, APPEND
    start: float
    end: float  # math.inf: indeterminate
    value: bytes | None = None  # PUT, CAS, APPEND: the value written or appended
    expected: bytes | None = None  # CAS
    amount: int = 0  # INCREMENT
    #: The recorded result: READ the value seen, INCREMENT/APPEND the new value, CAS matched.
    #: ``known`` false: indeterminate, any result.
    seen: bytes | None = None
    matched: bool | None = None
    known: bool = True
    process: str = ""

    def describe(self) -> str:
        when = f"[{self.start:.3f}, {'?' if self.end == math.inf else f'{self.end:.3f}'}]"
        k = self.kind
        if k is Kind.READ:
            what = f"read -> {_show(self.seen)}"
        elif k is Kind.PUT:
            what = f"put {_show(self.value)}"
        elif k is Kind.DELETE:
            what = "delete"
        elif k is Kind.CAS:
            result = "?" if not self.known else ("swapped" if self.matched else "not swapped")
            what = f"cas {_show(self.expected)} -> {_show(self.value)}: {result}"
        elif k is Kind.INCREMENT:
            result = "?" if not self.known else str(counter_value(self.seen))
            what = f"increment {self.amount:+d} -> {result}"
        else:
            result = "?" if not self.known else _show(self.seen)
            what = f"append {_show(self.value)} -> {result}"
        status = "" if self.known or k is Kind.READ else " (indeterminate)"
        return f"op {self.op} {self.process} {when} {what}{status}"


def _show(value: bytes | None) -> str:
    if value is None:
        return "nothing"
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:28]}...{text[-28:]} ({len(value)} bytes)"


def step(state: bytes | None, call: _Call) -> tuple[bool, bytes | None]:
    """The model: whether ``call``'s recorded result is what the register ``state`` gives, and
    the register afterwards."""
    k = call.kind
    if k is Kind.READ:
        return call.seen == state, state
    if k is Kind.PUT:
        return True, call.value
    if k is Kind.DELETE:
        return True, None
    if k is Kind.CAS:
        swap = state == call.expected
        if call.known and call.matched != swap:
            return False, state
        return True, call.value if swap else state
    if k is Kind.INCREMENT:
        if state is not None and len(state) != 8:
            return False, state  # the server refuses it: not an outcome this op can have
        new = _counter_bytes(counter_value(state) + call.amount)
        return (not call.known or call.seen == new), new
    if k is Kind.APPEND:
        new = (state or b"") + (call.value or b"")
        return (not call.known or call.seen == new), new
    raise ValueError(f"no model for {k}")


@dataclass(frozen=True)
class Violation:
    """A cell whose history is not linearizable."""

    cell: str  # "row f:qualifier"
    op: int  # the operation that could not be placed
    at: float  # its invocation
    detail: str
    #: The cell's operations around the failing one, one line each, in invocation order.
    history: tuple[str, ...] = ()


@dataclass
class Result:
    cells: int = 0
    operations: int = 0
    violations: list[Violation] = field(default_factory=list)
    #: Cells whose search ran out of budget (neither proven nor refuted).
    undecided: list[str] = field(default_factory=list)


class _Node:
    __slots__ = ("call", "index", "is_call", "match", "next", "prev")

    def __init__(self, call: _Call | None, index: int, is_call: bool) -> None:
        self.call = call
        self.index = index
        self.is_call = is_call
        self.match: _Node | None = None
        self.prev: _Node | None = None
        self.next: _Node | None = None


def _lift(node: _Node) -> None:
    """Unlink a call entry and its return entry."""
    for n in (node, node.match):
        assert n is not None and n.prev is not None
        n.prev.next = n.next
        if n.next is not None:
            n.next.prev = n.prev


def _unlift(node: _Node) -> None:
    for n in (node.match, node):
        assert n is not None and n.prev is not None
        n.prev.next = n
        if n.next is not None:
            n.next.prev = n


@dataclass(frozen=True)
class _Outcome:
    ok: bool
    steps: int
    #: Not linearizable: the call that could not be placed at the deepest point reached, and
    #: the register value there.
    blocked: _Call | None = None
    state: bytes | None = None
    depth: int = 0


def check_calls(calls: Sequence[_Call], *, budget: int = BUDGET) -> _Outcome | None:
    """Wing and Gong's search with memoization over one cell's calls (module docstring);
    None when ``budget`` steps were not enough."""
    entries: list[tuple[float, int, int]] = []
    for i, c in enumerate(calls):
        entries.append((c.start, 0, i))  # at equal times an invocation comes first
        entries.append((c.end, 1, i))
    entries.sort()
    head = _Node(None, -1, False)
    prev = head
    by_call: dict[int, _Node] = {}
    for _, ret, i in entries:
        node = _Node(calls[i], i, ret == 0)
        if ret:
            by_call[i].match = node
        else:
            by_call[i] = node
        node.prev, prev.next = prev, node
        prev = node
    state: bytes | None = None
    linearized = 0
    seen: set[tuple[int, bytes | None]] = set()
    stack: list[tuple[_Node, bytes | None]] = []
    entry = head.next
    steps = 0
    best: tuple[int, _Call | None, bytes | None] = (-1, None, None)
    while head.next is not None:
        steps += 1
        if steps > budget:
            return None
        assert entry is not None
        if entry.is_call:
            assert entry.call is not None
            ok, new_state = step(state, entry.call)
            if ok:
                bits = linearized | (1 << entry.index)
                key = (bits, new_state)
                if key not in seen:
                    seen.add(key)
                    stack.append((entry, state))
                    state, linearized = new_state, bits
                    _lift(entry)
                    entry = head.next
                    continue
            entry = entry.next
        else:
            # The completion of an operation not linearized yet: it must have taken effect
            # before now, so the last choice was wrong.
            if len(stack) > best[0]:
                best = (len(stack), entry.call, state)
            if not stack:
                return _Outcome(False, steps, best[1], best[2], max(best[0], 0))
            node, state = stack.pop()
            linearized &= ~(1 << node.index)
            _unlift(node)
            entry = node.next
    return _Outcome(True, steps)


def _cell_calls(ops: Sequence[Op]) -> dict[tuple[bytes, bytes], list[_Call]]:
    """Every cell's calls: the operations on it, and a scan's observation of each row in its
    range (present or absent) as a read of that row's scanned cell."""
    out: dict[tuple[bytes, bytes], list[_Call]] = {}
    scanned = sorted(
        {op.row for op in ops if op.row is not None and op.qualifier == SCANNED_QUALIFIER}
    )
    for op in ops:
        if op.outcome is Outcome.FAIL or op.outcome is None:
            continue
        known = op.outcome is Outcome.OK
        end = op.end if known and op.end is not None else math.inf
        if op.kind is Kind.SCAN:
            if not known or op.rows is None:
                continue
            lo, hi = op.rows
            seen_rows = op.seen_rows or {}
            rows = set(scanned[bisect.bisect_left(scanned, lo) : bisect.bisect_left(scanned, hi)])
            for row in rows | set(seen_rows):
                call = _Call(
                    op.id, Kind.READ, op.start, end, seen=seen_rows.get(row), process=op.process
                )
                out.setdefault((row, SCANNED_QUALIFIER), []).append(call)
            continue
        if op.row is None:
            continue
        if op.kind is Kind.READ and not known:
            continue  # an unanswered read has no effect
        call = _Call(
            op.id,
            op.kind,
            op.start,
            end,
            value=op.value,
            expected=op.expected,
            amount=op.amount or 0,
            seen=op.seen,
            matched=op.matched,
            known=known,
            process=op.process,
        )
        out.setdefault((op.row, op.qualifier), []).append(call)
    return out


def _around(calls: Iterable[_Call], blocked: _Call, limit: int = 16) -> tuple[str, ...]:
    """The calls whose interval meets the blocked call's (or the last ``limit`` before it)."""
    ordered = sorted(calls, key=lambda c: (c.start, c.op))
    near = [c for c in ordered if c.end >= blocked.start - 1.0 and c.start <= blocked.end]
    if len(near) > limit:
        i = next((j for j, c in enumerate(near) if c is blocked), 0)
        near = near[max(0, i - limit + 4) : i + 4]
    return tuple(c.describe() for c in near)


def check_linearizable(ops: Sequence[Op], *, budget: int = BUDGET) -> Result:
    """Check every cell of ``ops`` (module docstring)."""
    result = Result()
    for (row, qualifier), calls in sorted(_cell_calls(ops).items()):
        name = f"{row.decode(errors='replace')} f:{qualifier.decode(errors='replace')}"
        result.cells += 1
        result.operations += len(calls)
        outcome = check_calls(calls, budget=budget)
        if outcome is None:
            result.undecided.append(name)
            continue
        if outcome.ok:
            continue
        blocked = outcome.blocked
        assert blocked is not None
        result.violations.append(
            Violation(
                name,
                blocked.op,
                blocked.start,
                f"{blocked.describe()} cannot be linearized: after the longest linearizable "
                f"order ({outcome.depth} operations) the cell holds {_show(outcome.state)}",
                _around(calls, blocked),
            )
        )
    return result
