"""The worker's compaction memory budget (engine/compaction_budget.py): compactions hold their
input's bytes while they run, wait first come first served when there is no room, one larger
than the budget runs alone, and a waiter that is cancelled gives nothing away."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.engine.compaction_budget import CompactionBudget
from tabletstore.engine.tablet_sstables import TabletSSTables
from tabletstore.errors import InvalidArgument
from tabletstore.options import IN_PROCESS_LEASE, WorkerOptions


async def _holder(
    budget: CompactionBudget, nbytes: int, order: list[str], name: str, release: asyncio.Event
) -> None:
    async with budget.hold(nbytes):
        order.append(name)
        await release.wait()


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_compactions_within_the_budget_run_together_and_the_rest_wait_in_order() -> None:
    budget = CompactionBudget(100)
    order: list[str] = []
    gates = {n: asyncio.Event() for n in "abcd"}
    tasks = {
        "a": asyncio.create_task(_holder(budget, 60, order, "a", gates["a"])),
        "b": asyncio.create_task(_holder(budget, 30, order, "b", gates["b"])),
    }
    await _settle()
    assert order == ["a", "b"] and budget.held == 90
    # c does not fit; d would, but it came after c: first come, first served.
    tasks["c"] = asyncio.create_task(_holder(budget, 50, order, "c", gates["c"]))
    await _settle()
    tasks["d"] = asyncio.create_task(_holder(budget, 5, order, "d", gates["d"]))
    await _settle()
    assert order == ["a", "b"] and budget.waiting == 2
    gates["a"].set()
    await _settle()
    assert order == ["a", "b", "c", "d"] and budget.held == 85
    for gate in gates.values():
        gate.set()
    await asyncio.gather(*tasks.values())
    assert budget.held == 0 and budget.waiting == 0


async def test_a_compaction_larger_than_the_budget_runs_alone() -> None:
    budget = CompactionBudget(100)
    order: list[str] = []
    small, big = asyncio.Event(), asyncio.Event()
    first = asyncio.create_task(_holder(budget, 10, order, "small", small))
    await _settle()
    large = asyncio.create_task(_holder(budget, 10_000, order, "big", big))
    await _settle()
    assert order == ["small"]
    small.set()
    await _settle()
    assert order == ["small", "big"] and budget.held == 100
    big.set()
    await asyncio.gather(first, large)
    assert budget.held == 0


async def test_a_cancelled_waiter_leaves_the_queue_and_the_next_one_runs() -> None:
    budget = CompactionBudget(100)
    order: list[str] = []
    gates = {n: asyncio.Event() for n in "abc"}
    a = asyncio.create_task(_holder(budget, 80, order, "a", gates["a"]))
    await _settle()
    b = asyncio.create_task(_holder(budget, 50, order, "b", gates["b"]))
    c = asyncio.create_task(_holder(budget, 20, order, "c", gates["c"]))
    await _settle()
    assert order == ["a"] and budget.waiting == 2
    b.cancel()
    await _settle()
    assert order == ["a", "c"] and budget.held == 100 and budget.waiting == 0
    with pytest.raises(asyncio.CancelledError):
        await b
    for gate in gates.values():
        gate.set()
    await asyncio.gather(a, c)
    assert budget.held == 0


async def test_a_waiter_cancelled_as_it_is_granted_gives_its_room_back() -> None:
    budget = CompactionBudget(100)
    order: list[str] = []
    gates = {n: asyncio.Event() for n in "ab"}
    a = asyncio.create_task(_holder(budget, 100, order, "a", gates["a"]))
    await _settle()
    b = asyncio.create_task(_holder(budget, 100, order, "b", gates["b"]))
    await _settle()
    gates["a"].set()
    await asyncio.sleep(0)  # a releases and grants b, whose task has not run yet
    b.cancel()
    await asyncio.gather(a, b, return_exceptions=True)
    assert order == ["a"] and budget.held == 0 and budget.waiting == 0


async def test_an_error_inside_releases_the_room() -> None:
    budget = CompactionBudget(10)
    with pytest.raises(RuntimeError):
        async with budget.hold(8):
            raise RuntimeError("compaction failed")
    assert budget.held == 0
    async with budget.hold(10):
        assert budget.held == 10


async def test_a_waiter_gives_up_when_told_and_the_next_one_fits() -> None:
    budget = CompactionBudget(100)
    order: list[str] = []
    a_gate, c_gate = asyncio.Event(), asyncio.Event()
    give_up = asyncio.Event()
    answers: list[bool] = []

    async def b() -> None:
        async with budget.hold(50, unless=give_up) as room:
            answers.append(room)

    a = asyncio.create_task(_holder(budget, 80, order, "a", a_gate))
    await _settle()
    waiter = asyncio.create_task(b())
    c = asyncio.create_task(_holder(budget, 20, order, "c", c_gate))
    await _settle()
    assert order == ["a"] and budget.waiting == 2
    give_up.set()
    await waiter
    await _settle()
    # b holds nothing; c, which fits beside a, no longer waits behind it.
    assert answers == [False] and order == ["a", "c"] and budget.held == 100
    assert budget.waiting == 0
    # Told already: no wait at all, room or not.
    async with budget.hold(0, unless=give_up) as room:
        assert room is False and budget.held == 100
    a_gate.set()
    c_gate.set()
    await asyncio.gather(a, c)
    assert budget.held == 0


async def test_a_waiter_granted_before_it_is_told_keeps_its_room() -> None:
    budget = CompactionBudget(100)
    give_up = asyncio.Event()
    async with budget.hold(30, unless=give_up) as room:
        assert room is True and budget.held == 30
        give_up.set()  # told while it runs: it finishes, holding its room to the end
        assert budget.held == 30
    assert budget.held == 0


def test_a_budget_must_be_positive() -> None:
    with pytest.raises(InvalidArgument, match="compaction memory budget must be positive"):
        CompactionBudget(0)


async def test_a_workers_tablets_compact_within_its_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Major compactions of four tablets started at once: with a budget smaller than any
    one of them they fetch their inputs one at a time; with a large one, side by side (so the
    test does see overlap). Every row reads back either way."""
    active = peak = 0
    real_fetch = TabletSSTables.fetch

    async def fetch(self: TabletSSTables, keys: Sequence[str]) -> list[bytes]:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        try:
            await asyncio.sleep(0.02)
            return await real_fetch(self, keys)
        finally:
            active -= 1

    monkeypatch.setattr(TabletSSTables, "fetch", fetch)
    for budget in (1, 1 << 30):
        opts = WorkerOptions(lease=IN_PROCESS_LEASE, compaction_memory_bytes=budget)
        db = await Database.open(f"file://{tmp_path}/{budget}", worker_options=opts)
        try:
            table = await db.create_table("t", ["f"], split_keys=[b"b", b"c", b"d"])
            rows: dict[bytes, bytes] = {}
            for round_ in range(2):  # two SSTables per tablet
                batch = {
                    b"%s%03d" % (p, i): b"v%d" % round_
                    for p in (b"a", b"b", b"c", b"d")
                    for i in range(50)
                }
                await table.mutate_rows(
                    [RowMutation(k, (SetCell("f", b"q", v),)) for k, v in batch.items()]
                )
                rows |= batch
                await db.flush("t")
            tablets = [t for k, t in db.worker.tablets.items() if not k[0].startswith("!")]
            assert len(tablets) == 4
            peak = 0
            await asyncio.gather(*(t.major_compact() for t in tablets))
            assert peak == 1 if budget == 1 else peak > 1
            assert {r.key: r.cells[0].value async for r in table.read_rows()} == rows
        finally:
            await db.close()
