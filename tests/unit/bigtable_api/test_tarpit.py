"""The tarpit's bookkeeping: burst, rate, round robin over sources, capacity, cancellation."""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.bigtable_api.tarpit import Tarpit, source_of
from tabletstore.errors import InvalidArgument


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def _settle(predicate: object, tries: int = 400) -> None:
    for _ in range(tries):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition never held")


def test_source_is_the_address_without_its_port() -> None:
    assert source_of("ipv4:127.0.0.2:5123") == "ipv4:127.0.0.2"
    assert source_of("ipv6:[::1]:5123") == "ipv6:[::1]"
    assert source_of("unix:/tmp/s") == "unix:/tmp/s"


def test_bad_settings_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="rate"):
        Tarpit(0, 1, 1)
    with pytest.raises(InvalidArgument, match="burst"):
        Tarpit(1, 0, 1)


async def test_after_the_burst_sources_take_turns_at_the_rate() -> None:
    clock = Clock()
    tarpit = Tarpit(rate=1.0, burst=1, capacity=10, clock=clock)
    order: list[str] = []

    async def refused(source: str) -> None:
        await tarpit.turn(source)
        order.append(source)

    await refused("a")  # the burst: at once
    tasks = [asyncio.ensure_future(refused("a")) for _ in range(3)]
    await asyncio.sleep(0)
    tasks.append(asyncio.ensure_future(refused("b")))
    await _settle(lambda: tarpit.held == 4)
    assert order == ["a"]
    for turns in (2, 3, 4):  # a second each: a's oldest, then b, then a again
        clock.now += 1.0
        await _settle(lambda turns=turns: len(order) == turns)  # type: ignore[misc]
    assert order == ["a", "a", "b", "a"]
    assert tarpit.held == 1 and tarpit.answered == 4
    clock.now += 1.0
    await asyncio.gather(*tasks)
    assert tarpit.held == 0 and tarpit.peak == 4 and tarpit.overflowed == 0


async def test_beyond_its_capacity_it_answers_at_once_and_a_cancelled_call_leaves() -> None:
    tarpit = Tarpit(rate=1.0, burst=1, capacity=2, clock=Clock())
    await tarpit.turn("a")
    held = [asyncio.ensure_future(tarpit.turn("a")) for _ in range(2)]
    await _settle(lambda: tarpit.held == 2)
    await tarpit.turn("b")  # full: at once
    assert tarpit.overflowed == 1
    held[0].cancel()
    await asyncio.gather(held[0], return_exceptions=True)
    assert tarpit.held == 1
    held[1].cancel()
    await asyncio.gather(held[1], return_exceptions=True)
    assert tarpit.held == 0 and not tarpit._queues
