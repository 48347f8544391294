"""The master's assignment planner (§5.2): pure, so checked on plain values."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tabletstore.master.assignment import Assignment, TabletLoad, plan


def t(tid: str, worker: str | None = None, size: int = 0, requests: int = 0) -> TabletLoad:
    return TabletLoad("tbl", tid, worker, size, requests)


def test_no_workers_no_plan() -> None:
    assert plan([], [t("a")]) == []


def test_unassigned_tablets_go_to_the_least_loaded_worker_heaviest_first() -> None:
    tablets = [t("x", "w1", size=1000), t("a", size=10), t("b", size=500), t("c", size=10)]
    out = plan(["w1", "w2"], tablets)
    assert out == [
        Assignment("tbl", "b", "w2"),  # heaviest first, to the empty worker
        Assignment("tbl", "a", "w2"),
        Assignment("tbl", "c", "w2"),
    ]


def test_tablets_of_dead_workers_are_unassigned() -> None:
    out = plan(["w2"], [t("a", "w1"), t("b", "w2")])
    assert out == [Assignment("tbl", "a", "w2")]


def test_requests_break_ties_between_small_tablets() -> None:
    out = plan(["w1", "w2"], [t("hot", requests=100), t("cold1"), t("cold2")])
    assert out[0] == Assignment("tbl", "hot", "w1")
    assert {a.worker for a in out[1:]} == {"w2"}


def test_balancing_moves_are_throttled_and_only_narrow_the_gap() -> None:
    tablets = [t(f"t{i}", "w1", size=100) for i in range(10)]
    moves = plan(["w1", "w2"], tablets, balance=True, max_moves=3)
    assert len(moves) == 3
    assert all(m.source == "w1" and m.worker == "w2" for m in moves)
    assert len({m.tablet_id for m in moves}) == 3
    assert plan(["w1", "w2"], tablets) == []  # without balance nothing moves
    # A balanced cluster stays put; one big tablet is not moved back and forth.
    even = [t("a", "w1", size=100), t("b", "w2", size=100)]
    assert plan(["w1", "w2"], even, balance=True) == []
    assert plan(["w1", "w2"], [t("big", "w1", size=1000)], balance=True) == []


@given(
    st.lists(st.sampled_from(["w1", "w2", "w3", "dead"]), max_size=30),
    st.sets(st.sampled_from(["w1", "w2", "w3"]), min_size=1),
    st.booleans(),
)
def test_every_unassigned_tablet_gets_exactly_one_live_worker(
    owners: list[str], live: set[str], balance: bool
) -> None:
    tablets = [t(f"t{i}", o if i % 3 else None, size=i * 7) for i, o in enumerate(owners)]
    out = plan(sorted(live), tablets, balance=balance, max_moves=2)
    unassigned = {x.tablet_id for x in tablets if x.worker not in live}
    placed = [a for a in out if a.source is None]
    assert sorted(a.tablet_id for a in placed) == sorted(unassigned)
    assert all(a.worker in live for a in out)
    moves = [a for a in out if a.source is not None]
    assert len(moves) <= 2 and all(a.source != a.worker for a in moves)
