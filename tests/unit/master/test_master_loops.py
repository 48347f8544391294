"""The leading master's loops (master/master_process.py ``_lead``): assignment rounds keep their pace
while a balancing round or a garbage collection hangs (each may wait out a METADATA deadline
while a worker is dead: a chaos run saw recovery held back 30 s per balancing move), and the
balancer moves nothing until an assignment round has found every tablet served."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tabletstore.errors import Fenced
from tabletstore.master.master_process import _lead


class FakeLease:
    def __init__(self) -> None:
        self.expired = False
        self._gone = asyncio.Event()

    async def wait_expired(self) -> None:
        await self._gone.wait()

    def expire(self) -> None:
        self.expired = True
        self._gone.set()


def fake_master(
    rounds: list[int], hang: asyncio.Event, fifth: asyncio.Event | None = None
) -> SimpleNamespace:
    async def assign(*, if_changed: bool = False) -> int:
        rounds.append(1)
        if len(rounds) >= 5 and fifth is not None:
            fifth.set()
        return 0

    async def run_round() -> tuple[int, int]:
        await hang.wait()  # a balancing move waiting on an unreachable METADATA tablet
        return 0, 0

    return SimpleNamespace(
        assign=assign,
        balancer=SimpleNamespace(run_round=run_round),
        compaction_cycle=SimpleNamespace(run_round=lambda: None),
        checkpointer=SimpleNamespace(run_round=run_round),  # hangs as the balancer does
    )


async def test_a_hung_balancer_or_collector_never_holds_back_assignment() -> None:
    rounds: list[int] = []
    hang = asyncio.Event()

    async def maybe_run() -> None:
        await hang.wait()

    stop, fifth = asyncio.Event(), asyncio.Event()
    metrics = SimpleNamespace(assignment_round=lambda n: None, assignment_failed=lambda e: None)
    lead = asyncio.create_task(
        _lead(
            fake_master(rounds, hang, fifth),  # type: ignore[arg-type]
            SimpleNamespace(maybe_run=maybe_run),  # type: ignore[arg-type]
            metrics,  # type: ignore[arg-type]
            FakeLease(),  # type: ignore[arg-type]
            stop,
            0.001,
        )
    )
    async with asyncio.timeout(30):
        await fifth.wait()
    stop.set()
    await lead  # returns once stopped, even with the balancer still hung


async def test_losing_the_lease_raises_fenced_not_a_group() -> None:
    lease = FakeLease()
    fifth = asyncio.Event()
    metrics = SimpleNamespace(assignment_round=lambda n: None, assignment_failed=lambda e: None)
    lead = asyncio.create_task(
        _lead(
            fake_master([], asyncio.Event(), fifth),  # type: ignore[arg-type]
            SimpleNamespace(maybe_run=lambda: asyncio.sleep(0)),  # type: ignore[arg-type]
            metrics,  # type: ignore[arg-type]
            lease,  # type: ignore[arg-type]
            asyncio.Event(),
            0.001,
        )
    )
    async with asyncio.timeout(30):
        await fifth.wait()  # the loops run: the lease is lost mid-leadership
    lease.expire()
    with pytest.raises(Fenced):
        await lead
