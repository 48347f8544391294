"""The linearizability checker on hand-made histories: linearizable ones it must accept
(concurrent operations in either order, indeterminate operations applied or not) and the
anomalies it must find (a stale read after an acknowledged write, a lost increment, a
double-applied increment, a check-and-mutate that saw the wrong value)."""

from __future__ import annotations

import math
from pathlib import Path

from tabletstore.testing.chaos.history import History, Kind, Op, Outcome, load_ops
from tabletstore.testing.chaos.linearizability import (
    _Call,
    check_calls,
    check_linearizable,
    counter_value,
)

R = b"b-x00"
OK, INFO, FAIL = Outcome.OK, Outcome.INFO, Outcome.FAIL


def n(x: int) -> bytes:
    return x.to_bytes(8, "big", signed=True)


class H:
    """A history builder: ops with explicit times on one row (cell ``f:<qualifier>``)."""

    def __init__(self, qualifier: bytes = b"r") -> None:
        self.ops: list[Op] = []
        self.qualifier = qualifier

    def op(
        self, kind: Kind, start: float, end: float, outcome: Outcome = OK, **fields: object
    ) -> Op:
        op = Op(len(self.ops), f"p{len(self.ops)}", kind, start, R)
        op.end, op.outcome, op.qualifier = end, outcome, self.qualifier
        for k, v in fields.items():
            setattr(op, k, v)
        self.ops.append(op)
        return op

    def put(self, v: bytes, s: float, e: float, o: Outcome = OK) -> Op:
        return self.op(Kind.PUT, s, e, o, value=v)

    def read(self, seen: bytes | None, s: float, e: float, o: Outcome = OK) -> Op:
        return self.op(Kind.READ, s, e, o, seen=seen)

    def inc(self, result: int | None, s: float, e: float, o: Outcome = OK) -> Op:
        return self.op(
            Kind.INCREMENT, s, e, o, amount=1, seen=None if result is None else n(result)
        )

    def append(self, v: bytes, result: bytes | None, s: float, e: float, o: Outcome = OK) -> Op:
        return self.op(Kind.APPEND, s, e, o, value=v, seen=result)

    def cas(
        self, expected: bytes | None, v: bytes, matched: bool | None, s: float, e: float,
        o: Outcome = OK,
    ) -> Op:  # fmt: skip
        return self.op(Kind.CAS, s, e, o, expected=expected, value=v, matched=matched)

    def check(self) -> list[str]:
        result = check_linearizable(self.ops)
        assert not result.undecided
        return [v.detail for v in result.violations]


def test_sequential_register_history_is_linearizable() -> None:
    h = H()
    h.read(None, 0, 1)
    h.put(b"a", 2, 3)
    h.read(b"a", 4, 5)
    h.cas(b"a", b"b", True, 6, 7)
    h.cas(b"a", b"c", False, 8, 9)
    h.read(b"b", 10, 11)
    h.op(Kind.DELETE, 12, 13)
    h.read(None, 14, 15)
    assert h.check() == []


def test_stale_read_after_an_acknowledged_write_is_a_violation() -> None:
    h = H()
    h.put(b"a", 0, 1)
    h.put(b"b", 2, 3)
    h.read(b"a", 4, 5)  # b was acknowledged before this read started
    [detail] = h.check()
    assert "read -> b'a'" in detail and "holds b'b'" in detail


def test_a_read_concurrent_with_a_write_may_see_either_value() -> None:
    h = H()
    h.put(b"a", 0, 1)
    h.put(b"b", 2, 6)
    h.read(b"b", 3, 4)
    h.read(b"b", 4.5, 7)
    assert h.check() == []
    # ... but once one read saw the new value, a later read may not see the old one.
    h.read(b"a", 4.2, 4.4)
    assert len(h.check()) == 1


def test_concurrent_increments_in_either_order() -> None:
    h = H(b"n")
    h.inc(2, 0, 5)
    h.inc(1, 1, 4)
    h.read(n(2), 6, 7)
    assert h.check() == []


def test_a_lost_increment_is_a_violation() -> None:
    h = H(b"n")
    h.inc(1, 0, 2)
    h.inc(1, 1, 3)  # concurrent, both acknowledged with 1: one update was lost
    h.read(n(1), 4, 5)
    assert len(h.check()) == 1
    h2 = H(b"n")
    h2.inc(1, 0, 1)
    h2.inc(2, 2, 3)
    h2.read(n(1), 4, 5)  # the second acknowledged increment vanished
    [detail] = h2.check()
    assert "read -> " in detail


def test_a_double_applied_increment_is_a_violation() -> None:
    h = H(b"n")
    h.inc(1, 0, 1)
    h.inc(3, 2, 3)  # one increment of 1 gave +2: applied twice (a retried RPC)
    assert len(h.check()) == 1
    # The same with an indeterminate increment: it may be applied once, never twice.
    h2 = H(b"n")
    h2.inc(None, 0, 1, INFO)
    h2.inc(2, 2, 3)  # the indeterminate one was applied: fine
    h2.read(n(2), 4, 5)
    assert h2.check() == []
    h2.read(n(3), 6, 7)  # nobody incremented again
    assert len(h2.check()) == 1


def test_indeterminate_write_may_take_effect_late_or_never() -> None:
    h = H()
    h.put(b"a", 0, 1)
    h.put(b"b", 2, 3, INFO)
    h.read(b"a", 4, 5)  # not applied yet
    h.read(b"b", 6, 7)  # applied late
    assert h.check() == []
    h.read(b"a", 8, 9)  # but not un-applied
    assert len(h.check()) == 1


def test_refused_writes_and_unanswered_reads_are_left_out() -> None:
    h = H()
    h.put(b"a", 0, 1)
    h.put(b"b", 2, 3, FAIL)
    h.read(b"zzz", 4, 5, FAIL)
    h.read(b"a", 6, 7)
    assert h.check() == []
    h.read(b"b", 8, 9)  # a refused write's value
    assert len(h.check()) == 1


def test_appends_concurrent_and_indeterminate() -> None:
    h = H(b"a")
    h.append(b"1;", b"1;", 0, 1)
    h.append(b"2;", None, 2, 3, INFO)
    h.append(b"3;", b"1;3;", 2.5, 4)
    h.append(b"4;", b"1;3;2;4;", 5, 6)  # the indeterminate append landed after 3
    assert h.check() == []
    h.read(b"1;3;4;", 7, 8)  # dropped 2 after it was seen
    assert len(h.check()) == 1


def test_cas_result_must_match_the_register() -> None:
    h = H()
    h.put(b"a", 0, 1)
    h.cas(b"a", b"b", False, 2, 3)  # held a, yet did not swap
    assert len(h.check()) == 1
    h2 = H()
    h2.cas(None, b"a", True, 0, 3)  # from empty
    h2.cas(None, b"b", True, 1, 2)  # both created the cell: one of them must have failed
    assert len(h2.check()) == 1
    h3 = H()
    h3.cas(None, b"a", None, 0, 1, INFO)
    h3.cas(b"a", b"b", True, 2, 3)
    assert h3.check() == []


def test_scans_observe_each_row_of_their_range() -> None:
    h = H(b"c")
    h.put(b"a", 0, 1)
    scan = Op(len(h.ops), "scanner", Kind.SCAN, 2, None, rows=(b"a", b"c"))
    scan.end, scan.outcome, scan.seen_rows = 3, OK, {}  # R absent: a stale read
    h.ops.append(scan)
    [violation] = check_linearizable(h.ops).violations
    assert violation.op == scan.id and violation.cell == "b-x00 f:c"


def test_violation_names_the_operations_around_it() -> None:
    h = H()
    h.put(b"a", 0, 1)
    h.put(b"b", 2, 3)
    h.read(b"a", 4, 5)
    [v] = check_linearizable(h.ops).violations
    assert v.op == 2 and v.cell == "b-x00 f:r"
    assert any("put b'b'" in line for line in v.history)


def test_budget_exhaustion_is_undecided_not_a_violation() -> None:
    h = H(b"n")
    for i in range(14):  # many indeterminate increments, and a read no subset explains
        h.inc(None, i, i + 0.5, INFO)
    h.read(n(100), 20, 21)
    result = check_linearizable(h.ops, budget=200)
    assert result.undecided == ["b-x00 f:n"] and not result.violations
    assert len(check_linearizable(h.ops).violations) == 1


def test_long_sequential_history_is_fast() -> None:
    calls = [_Call(i, Kind.INCREMENT, i, i + 0.9, amount=1, seen=n(i + 1)) for i in range(3000)]
    outcome = check_calls(calls, budget=20_000)
    assert outcome is not None and outcome.ok
    calls.append(_Call(3000, Kind.READ, 5000, math.inf, seen=n(5)))
    outcome = check_calls(calls, budget=20_000)
    assert outcome is not None and not outcome.ok


def test_counter_value() -> None:
    assert counter_value(None) == 0 and counter_value(n(-3)) == -3


def test_the_chaos_verdict_carries_the_violations() -> None:
    from tabletstore.testing.chaos.checker import check

    h = H()
    h.put(b"a", 0, 1)
    h.put(b"b", 2, 3)
    h.read(b"a", 4, 5)
    verdict = check(h.ops, final_after=100)
    # The register f:r has many writers: the single-writer checks leave it to this checker.
    assert not verdict.wrong_reads and not verdict.lost
    assert len(verdict.linearizability.violations) == 1 and not verdict.ok


def test_a_saved_history_is_checked_again_exactly(tmp_path: Path) -> None:
    h = H(b"n")
    h.inc(1, 0, 1)
    h.inc(3, 2, 3)  # double-applied: found again from the saved history
    h.read(n(3), 4, 5)
    scan = Op(len(h.ops), "scanner", Kind.SCAN, 6, None, rows=(b"a", b"c"))
    scan.end, scan.outcome, scan.seen_rows = 7, OK, {b"b-x01": b"v"}
    h.ops.append(scan)
    history = History()
    history.ops.extend(h.ops)
    history.save(tmp_path / "history.json")
    loaded = load_ops(tmp_path / "history.json")
    assert [(o.kind, o.seen, o.qualifier, o.amount, o.seen_rows) for o in loaded] == [
        (o.kind, o.seen, o.qualifier, o.amount, o.seen_rows) for o in h.ops
    ]
    found = {v.cell: v.op for v in check_linearizable(loaded).violations}
    assert found == {"b-x00 f:n": 1, "b-x01 f:c": scan.id}  # and "v" was never written
