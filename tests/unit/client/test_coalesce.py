"""The Coalescer (client/coalesce.py): concurrent submits of one key share one send, in
submission order; per-item errors reach their caller only; a failed send reaches every caller;
cancelled callers leave their group, and a group nobody waits for is cancelled."""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.client.coalesce import Coalescer
from tabletstore.errors import Indeterminate, NotServing


class Recorder:
    """A send that records its groups and answers each item with ``(key, item)``; an item
    listed in ``fail`` gets its error in its place."""

    def __init__(self, fail: dict[int, Exception] | None = None) -> None:
        self.sent: list[tuple[str, list[int]]] = []
        self.fail = fail or {}

    async def __call__(self, key: str, items: list[int]) -> list[object]:
        self.sent.append((key, list(items)))
        await asyncio.sleep(0)
        return [self.fail.get(i, (key, i)) for i in items]


async def test_one_send_per_key_in_submission_order() -> None:
    send = Recorder()
    c: Coalescer[str, int, object] = Coalescer(send)
    calls = [("a", 3), ("b", 1), ("a", 1), ("a", 2), ("b", 7)]
    results = await asyncio.gather(*(c.submit(k, i) for k, i in calls))
    assert results == [(k, i) for k, i in calls]
    assert sorted(send.sent) == [("a", [3, 1, 2]), ("b", [1, 7])]


async def test_sequential_submits_are_sent_one_by_one() -> None:
    send = Recorder()
    c: Coalescer[str, int, object] = Coalescer(send)
    for i in range(3):
        assert await c.submit("a", i) == ("a", i)
    assert send.sent == [("a", [0]), ("a", [1]), ("a", [2])]


async def test_groups_are_capped_by_items_and_bytes() -> None:
    send = Recorder()
    c: Coalescer[str, int, object] = Coalescer(send, max_items=2)
    await asyncio.gather(*(c.submit("a", i) for i in range(5)))
    assert [items for _, items in send.sent] == [[0, 1], [2, 3], [4]]

    send = Recorder()
    sized: Coalescer[str, int, object] = Coalescer(send, max_bytes=10, size=lambda i: i)
    await asyncio.gather(*(sized.submit("a", i) for i in (4, 5, 3, 20, 1)))
    # 4+5 fit, 3 would pass 10; 3 alone then 20 (larger than the cap: alone); then 1.
    assert [items for _, items in send.sent] == [[4, 5], [3], [20], [1]]


async def test_an_item_error_reaches_its_caller_only() -> None:
    send = Recorder(fail={2: NotServing("moved")})
    c: Coalescer[str, int, object] = Coalescer(send)
    results = await asyncio.gather(*(c.submit("a", i) for i in range(4)), return_exceptions=True)
    assert results[0] == ("a", 0) and results[1] == ("a", 1) and results[3] == ("a", 3)
    assert isinstance(results[2], NotServing)
    assert len(send.sent) == 1


async def test_a_failed_send_fails_every_caller_with_its_own_copy() -> None:
    async def send(key: str, items: list[int]) -> list[object]:
        raise Indeterminate("connection lost with the request in flight")

    c: Coalescer[str, int, object] = Coalescer(send)
    results = await asyncio.gather(*(c.submit("a", i) for i in range(3)), return_exceptions=True)
    assert all(isinstance(r, Indeterminate) for r in results)
    assert len({id(r) for r in results}) == 3
    assert all("in flight" in str(r) for r in results)


async def test_a_caller_cancelled_before_the_send_leaves_its_group() -> None:
    send = Recorder()
    c: Coalescer[str, int, object] = Coalescer(send)
    gone = asyncio.create_task(c.submit("a", 1))
    kept = asyncio.create_task(c.submit("a", 2))
    await asyncio.sleep(0)  # both are in the open group
    gone.cancel()
    assert await kept == ("a", 2)
    assert send.sent == [("a", [2])]
    with pytest.raises(asyncio.CancelledError):
        await gone


async def test_a_group_whose_callers_all_left_is_cancelled() -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def send(key: str, items: list[int]) -> list[object]:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not reached")

    c: Coalescer[str, int, object] = Coalescer(send)
    callers = [asyncio.create_task(c.submit("a", i)) for i in range(3)]
    await started.wait()
    callers[0].cancel()
    await asyncio.sleep(0)
    assert not cancelled.is_set()  # two callers still wait
    for t in callers[1:]:
        t.cancel()
    await asyncio.wait_for(cancelled.wait(), 5)
    for t in callers:
        with pytest.raises(asyncio.CancelledError):
            await t
    assert c.in_flight == 0


async def test_a_caller_cancelled_in_flight_does_not_disturb_the_others() -> None:
    release = asyncio.Event()
    sent = asyncio.Event()

    async def send(key: str, items: list[int]) -> list[object]:
        sent.set()
        await release.wait()
        return list(items)

    c: Coalescer[str, int, object] = Coalescer(send)
    callers = [asyncio.create_task(c.submit("a", i)) for i in range(3)]
    await sent.wait()
    callers[1].cancel()
    await asyncio.sleep(0)
    release.set()
    assert await callers[0] == 0 and await callers[2] == 2
    with pytest.raises(asyncio.CancelledError):
        await callers[1]
