"""The chaos checker on hand-made histories: each anomaly it must find, and the legitimate
histories (indeterminate writes, deletes, moves) it must accept."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tabletstore.testing.chaos.checker import Kill, check
from tabletstore.testing.chaos.history import Kind, Op, Outcome

R = b"a-w00-r00"


class H:
    """A tiny history builder: ops with explicit times."""

    def __init__(self) -> None:
        self.ops: list[Op] = []

    def op(
        self,
        kind: Kind,
        start: float,
        end: float,
        outcome: Outcome = Outcome.OK,
        *,
        row: bytes = R,
        value: bytes | None = None,
        seen: bytes | None = None,
    ) -> Op:
        op = Op(len(self.ops), "p", kind, start, row, value, None, end, outcome, seen)
        self.ops.append(op)
        return op

    def put(self, value: bytes, start: float, end: float, outcome: Outcome = Outcome.OK) -> Op:
        return self.op(Kind.PUT, start, end, outcome, value=value)

    def delete(self, start: float, end: float, outcome: Outcome = Outcome.OK) -> Op:
        return self.op(Kind.DELETE, start, end, outcome)

    def read(self, seen: bytes | None, start: float, end: float) -> Op:
        return self.op(Kind.READ, start, end, seen=seen)


def test_clean_history_passes() -> None:
    h = H()
    h.put(b"v1", 0, 1)
    h.read(b"v1", 2, 3)
    h.put(b"v2", 4, 5)
    h.read(b"v1", 4.5, 6)  # concurrent with v2: either value
    h.read(b"v2", 6, 7)
    h.delete(8, 9)
    h.read(None, 10, 11)
    h.read(None, 100, 101)  # final
    v = check(h.ops, final_after=100)
    assert v.ok, (v.lost, v.wrong_reads)


def test_lost_acknowledged_write_in_the_final_read() -> None:
    h = H()
    h.put(b"v1", 0, 1)
    h.put(b"v2", 2, 3)
    h.read(b"v1", 100, 101)
    v = check(h.ops, final_after=100)
    assert [a.kind for a in v.lost] == ["lost"] and not v.wrong_reads
    h2 = H()
    h2.put(b"v1", 0, 1)
    h2.read(None, 100, 101)
    assert len(check(h2.ops, final_after=100).lost) == 1


def test_a_row_no_final_read_observed_fails_the_run_as_unread() -> None:
    h = H()
    h.put(b"v1", 0, 1)
    h.read(b"v1", 2, 3)  # during the run, not after healing
    h.op(Kind.READ, 100, 130, Outcome.FAIL)  # every final read of it failed
    v = check(h.ops, final_after=100)
    assert v.unread == [R.decode()] and not v.lost and not v.ok
    h.read(b"v1", 131, 132)
    assert check(h.ops, final_after=100).ok


def test_value_never_written_and_refused_write_seen() -> None:
    h = H()
    h.put(b"v1", 0, 1, Outcome.FAIL)
    h.read(b"v1", 2, 3)
    h.read(b"zz", 4, 5)
    v = check(h.ops, final_after=100)
    assert len(v.wrong_reads) == 2 and "refused" in v.wrong_reads[0].detail


def test_cell_read_after_acknowledged_delete() -> None:
    h = H()
    h.put(b"v1", 0, 1)
    h.delete(2, 3)
    h.read(b"v1", 4, 5)
    v = check(h.ops, final_after=100)
    assert len(v.wrong_reads) == 1 and "delete" in v.wrong_reads[0].detail


def test_indeterminate_write_may_appear_but_then_stays() -> None:
    h = H()
    h.put(b"v1", 0, 1)
    h.put(b"v2", 2, 3, Outcome.INFO)
    h.read(b"v1", 4, 5)  # v2 not (yet) visible: allowed
    h.read(b"v2", 6, 7)  # now it is: allowed
    h.read(b"v2", 100, 101)
    assert check(h.ops, final_after=100).ok
    h.read(b"v1", 8, 9)  # once observed, v2 must stay
    v = check(h.ops, final_after=100)
    assert len(v.wrong_reads) == 1 and not v.lost


def test_indeterminate_delete_explains_an_absent_cell() -> None:
    h = H()
    h.put(b"v1", 0, 1)
    h.delete(2, 3, Outcome.INFO)
    h.read(None, 100, 101)
    assert check(h.ops, final_after=100).ok


def _acked(h: H, value: bytes, start: float, end: float) -> None:
    h.put(value, start, end)


def test_double_serving_from_log_attribution() -> None:
    h = H()
    _acked(h, b"x1", 0, 1)
    _acked(h, b"y1", 2, 3)
    _acked(h, b"x2", 4, 5)
    owners = {b"x1": frozenset({"X"}), b"y1": frozenset({"Y"}), b"x2": frozenset({"X"})}
    seen_at_y = {0: [(0.5, "X"), (2.5, "Y"), (4.5, "Y")]}
    v = check(
        h.ops,
        final_after=100,
        tablet_of=lambda r: 0,
        value_workers=owners,
        locations=seen_at_y,
    )
    assert len(v.double_serving) == 1 and v.attributed == 3
    # The tablet was seen given back to X: a legitimate move, not double-serving.
    moved_back = {0: [*seen_at_y[0], (3.5, "X")]}
    v = check(
        h.ops,
        final_after=100,
        tablet_of=lambda r: 0,
        value_workers=owners,
        locations=moved_back,
    )
    assert not v.double_serving
    # Given to X2, a worker that rejoined on X's address after X lost its lease: X's own
    # acknowledgement after Y's is still double-serving (the check goes by worker id).
    to_successor = {0: [*seen_at_y[0], (3.5, "X2")]}
    v = check(
        h.ops,
        final_after=100,
        tablet_of=lambda r: 0,
        value_workers=owners,
        locations=to_successor,
    )
    assert len(v.double_serving) == 1


def test_recovery_and_gaps() -> None:
    h = H()
    _acked(h, b"v1", 0, 1)
    h.op(Kind.PUT, 1, 2, value=b"b1", row=b"b")
    h.op(Kind.PUT, 10.5, 14, value=b"v2")  # first ack on tablet 0 after the kill at 10
    h.op(Kind.PUT, 11, 12, value=b"b2", row=b"b")
    v = check(
        h.ops,
        final_after=100,
        tablet_of=lambda r: 0 if r.startswith(b"a") else 1,
        kills=[Kill(10.0, "X", frozenset({0}))],
    )
    assert v.recovery == [4.0]
    assert v.write_gaps[0] == (13.0, 1)


def test_each_chaos_writer_writes_to_one_tablet_and_all_tablets_get_writers() -> None:
    """A write gap is attributable: a writer blocked on a tablet under recovery holds back
    no write to any other tablet."""
    from tabletstore.testing.chaos.history import History
    from tabletstore.testing.chaos.workload import SPLIT_KEYS, Workload, tablet_of

    workload = Workload(None, History(), seed=1, writers=16)  # type: ignore[arg-type]
    tablets = []
    for rows in workload.rows.values():
        (tablet,) = {tablet_of(r) for r in rows}
        tablets.append(tablet)
    assert set(tablets) == set(range(len(SPLIT_KEYS) + 1))
    assert len(set(workload.all_rows)) == sum(len(rows) for rows in workload.rows.values())


def test_a_load_only_the_masters_log_saw_is_a_move_back(tmp_path: Path) -> None:
    """Chaos seed 14165: a kill's recovery put the tablet on X at 67.56 s and the balancer
    moved it on at 68.45 s, between two polls; X's acknowledgement at 68.01 s was called
    double-serving. The masters' ``loaded ... on X`` lines place that load on the timeline."""
    import datetime as dt

    from tabletstore.testing.chaos.runner import _Poller

    h = H()
    _acked(h, b"x1", 0, 1)
    _acked(h, b"y1", 2, 3)
    _acked(h, b"x2", 4, 5)
    owners = {b"x1": frozenset({"X"}), b"y1": frozenset({"Y"}), b"x2": frozenset({"X"})}
    t0_wall = 1_800_000_000.0
    stamp = dt.datetime.fromtimestamp(t0_wall + 3.5).strftime("%Y-%m-%d %H:%M:%S,%f")[:-3]
    (tmp_path / "master-1.log").write_text(
        f"{stamp} INFO tabletstore.master.master: loaded t00000 on X in 0.20 s\n"
        f"{stamp} INFO tabletstore.master.master: loaded t00009 on X in 0.20 s\n"  # unknown
        f"{stamp} INFO tabletstore.master.balancer: moved tablet t00000 from X to Y\n"
    )
    poller = _Poller.__new__(_Poller)
    poller.locations = {0: [(0.5, "X"), (2.5, "Y"), (4.5, "Y")]}
    poller.index_by_id = {"t00000": (0,)}
    assert poller.add_loads(tmp_path, t0_wall) == 1
    assert poller.locations[0][2] == (pytest.approx(3.5, abs=0.01), "X")
    v = check(
        h.ops,
        final_after=100,
        tablet_of=lambda r: 0,
        value_workers=owners,
        locations=poller.locations,
    )
    assert not v.double_serving


async def test_the_poller_follows_a_merge_of_chaos_tablets() -> None:
    """The master merges two small neighbouring chaos tablets once they stayed small for its
    ``merge_after``. The merged tablet serves both row ranges, and the poller observes each
    range where it is served: range 2 was X's, then moved to Y, then merged with range 1 onto
    X; X's acknowledgement for range 2 after Y's is that merge, not double-serving (observed
    by the merged tablet's start row only, range 2 was never seen back at X)."""
    from types import SimpleNamespace

    from tabletstore.coordination import paths
    from tabletstore.coordination.memory import MemoryCoordinator
    from tabletstore.metadata.record import TabletRecord
    from tabletstore.testing.chaos.runner import _covered, _Poller
    from tabletstore.testing.chaos.workload import SPLIT_KEYS

    assert _covered(b"", b"d") == (0,)
    assert _covered(b"d", b"l") == (1, 2)
    assert _covered(b"p", None) == (4, 5)
    assert _covered(b"", None) == tuple(range(len(SPLIT_KEYS) + 1))

    bounds = [b"", *SPLIT_KEYS, None]
    tablets = [
        TabletRecord("T", f"t{i}", start or b"", end, location="127.0.0.1:1")
        for i, (start, end) in enumerate(itertools.pairwise(bounds))
    ]
    moved = [*tablets[:2], TabletRecord("T", "t2", b"h", b"l", location="127.0.0.1:2")]
    merged = [tablets[0], TabletRecord("T", "tm", b"d", b"l", location="127.0.0.1:1")]
    rest = tablets[3:]
    views = iter([tablets, [*moved, *rest], [*merged, *rest]])
    clock = iter([0.5, 2.5, 4.5])

    async def listed(table_id: str, *, refresh: bool) -> list[TabletRecord]:
        return next(views)

    async def live() -> dict[str, str]:
        return {"X": "127.0.0.1:1", "Y": "127.0.0.1:2"}

    # Every tablet is claimed by the worker at its location (a served tablet's claim).
    claims = MemoryCoordinator()
    for rec in [*tablets[:2], *merged, *rest]:
        await claims.put(paths.claim("T", rec.tablet_id), b"X")
    client = SimpleNamespace(
        locations=SimpleNamespace(tablets=listed),
        catalog=SimpleNamespace(live_workers=live, coordinator=claims),
    )
    history = SimpleNamespace(now=lambda: next(clock))
    poller = _Poller(client, "T", history)
    for _ in range(3):
        await poller.poll()
    await claims.close()
    assert poller.locations[2] == [(0.5, "X"), (2.5, "Y"), (4.5, "X")]
    assert poller.index_by_id["tm"] == (1, 2)
    assert poller.holders()["127.0.0.1:1"] == {0, 1, 2, 3, 4, 5}
    assert poller.all_served()

    h = H()
    _acked(h, b"x1", 0, 1)
    _acked(h, b"y1", 2, 3)
    _acked(h, b"x2", 5, 6)
    owners = {b"x1": frozenset({"X"}), b"y1": frozenset({"Y"}), b"x2": frozenset({"X"})}
    v = check(
        h.ops,
        final_after=100,
        tablet_of=lambda r: 2,
        value_workers=owners,
        locations=poller.locations,
    )
    assert not v.double_serving
