"""The chaos run's change-stream check on hand-made histories and streams: each finding it
must make (a lost, repeated, unwritten or misordered change) and what it must accept
(indeterminate writes either way, a retried idempotent put logged twice)."""

from __future__ import annotations

from tabletstore.client.change_plan import Change, Mod
from tabletstore.testing.chaos.change_follower import check_changes
from tabletstore.testing.chaos.history import Kind, Op, Outcome

ROW = b"a-w00-r00"
TXN = b"b-txn"


class S:
    """Operations and the changes a stream would carry for them."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.changes: list[Change] = []
        self.seq = 0

    def op(
        self,
        kind: Kind,
        outcome: Outcome = Outcome.OK,
        *,
        row: bytes = ROW,
        value: bytes | None = None,
        q: bytes = b"c",
        matched: bool | None = None,
    ) -> Op:
        op = Op(len(self.ops), "p", kind, float(len(self.ops)), row, value, None, 0.0, outcome)
        op.qualifier = q
        op.matched = matched
        self.ops.append(op)
        return op

    def change(
        self, kind: str, *, row: bytes = ROW, q: bytes = b"c", value: bytes = b"", seq: int = 0
    ) -> Change:
        self.seq += 1
        c = Change(row, 1.0, seq or self.seq, (Mod(kind, "f", q, 1, value),), "t")
        self.changes.append(c)
        return c


def test_every_write_once_in_order_passes() -> None:
    s = S()
    s.op(Kind.PUT, value=b"w0-1")
    s.change("put", value=b"w0-1")
    s.op(Kind.DELETE)
    s.change("delete_column")
    s.op(Kind.PUT, Outcome.INFO, value=b"w0-2")  # indeterminate, and applied
    s.change("put", value=b"w0-2")
    s.op(Kind.PUT, Outcome.INFO, value=b"w0-3")  # indeterminate, and not applied
    s.op(Kind.PUT, Outcome.FAIL, value=b"w0-4")  # refused
    s.op(Kind.PUT, value=b"w0-5")
    s.change("put", value=b"w0-5")
    s.change("put", value=b"w0-5")  # a retried idempotent put, logged twice
    v = check_changes(s.ops, s.changes)
    assert v.ok, v.lines()
    assert (v.read, v.acknowledged, v.twice_in_log) == (5, 3, 1)


def test_a_retried_delete_logged_twice_is_not_a_phantom() -> None:
    """A delete whose first attempt timed out after its record was logged, retried and logged
    again: counted as logged twice, and the writes after it still line up (the chaos run
    reported the second delete as not written and the next puts as both lost and not
    written)."""
    s = S()
    s.op(Kind.PUT, value=b"w1-15")
    s.change("put", value=b"w1-15")
    s.op(Kind.DELETE)
    s.change("delete_column")
    s.change("delete_column")  # the retry
    s.op(Kind.PUT, Outcome.FAIL, value=b"w1-20")
    s.op(Kind.PUT, value=b"w1-28")
    s.change("put", value=b"w1-28")
    s.op(Kind.DELETE)  # two deletes in a row are two writes, not a retry
    s.change("delete_column")
    s.op(Kind.DELETE)
    s.change("delete_column")
    v = check_changes(s.ops, s.changes)
    assert v.ok, v.lines()
    assert v.twice_in_log == 1
    s.op(Kind.DELETE)  # a third acknowledged delete with no change of its own is lost
    v = check_changes(s.ops, s.changes)
    assert len(v.lost) == 1 and not v.not_written


def test_a_lost_write_a_repeated_change_and_an_unwritten_one_are_found() -> None:
    s = S()
    s.op(Kind.PUT, value=b"w0-1")
    first = s.change("put", value=b"w0-1")
    s.changes.append(first)  # delivered twice
    s.op(Kind.PUT, value=b"w0-2")  # acknowledged, never read
    s.op(Kind.PUT, Outcome.FAIL, value=b"w0-3")
    s.change("put", value=b"w0-3")  # refused, yet there
    v = check_changes(s.ops, s.changes)
    assert len(v.repeated) == 1 and len(v.lost) == 1 and len(v.not_written) == 1
    assert not v.ok


def test_changes_of_a_row_out_of_seq_order_are_found() -> None:
    s = S()
    s.op(Kind.PUT, value=b"w0-1")
    s.op(Kind.PUT, value=b"w0-2")
    s.change("put", value=b"w0-2", seq=9)
    s.change("put", value=b"w0-1", seq=3)
    v = check_changes(s.ops, s.changes)
    assert v.out_of_order and not v.lost and not v.ok


def test_shared_rows_by_value_and_by_count() -> None:
    s = S()
    s.op(Kind.PUT, row=TXN, q=b"r", value=b"t0-1")
    s.change("put", row=TXN, q=b"r", value=b"t0-1")
    s.op(Kind.CAS, row=TXN, q=b"r", value=b"t1-1", matched=True)
    s.change("put", row=TXN, q=b"r", value=b"t1-1")
    s.op(Kind.CAS, row=TXN, q=b"r", value=b"t1-2", matched=False)  # wrote nothing
    s.op(Kind.APPEND, row=TXN, q=b"a", value=b"t2-1;")
    s.change("put", row=TXN, q=b"a", value=b"t2-1;")
    s.op(Kind.APPEND, row=TXN, q=b"a", value=b"t2-2;")
    s.change("put", row=TXN, q=b"a", value=b"t2-1;t2-2;")
    s.op(Kind.INCREMENT, row=TXN, q=b"n")
    s.op(Kind.INCREMENT, Outcome.INFO, row=TXN, q=b"n")
    s.change("put", row=TXN, q=b"n", value=b"\x00" * 8)
    s.change("put", row=TXN, q=b"n", value=b"\x00" * 8)
    v = check_changes(s.ops, s.changes)
    assert v.ok, v.lines()
    # Two more increments acknowledged, none read (three acknowledged, two changes); and
    # an acknowledged append missing.
    s.op(Kind.INCREMENT, row=TXN, q=b"n")
    s.op(Kind.INCREMENT, row=TXN, q=b"n")
    s.op(Kind.APPEND, row=TXN, q=b"a", value=b"t2-3;")
    v = check_changes(s.ops, s.changes)
    assert len(v.lost) == 2, v.lines()
