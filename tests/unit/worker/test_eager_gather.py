"""worker/eager_gather.py: a coalesced point read's keys read concurrently, with no task for a
key answered without I/O."""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.worker.eager_gather import gather_eager


async def test_results_come_in_order_and_in_memory_reads_run_inline() -> None:
    caller = asyncio.current_task()
    ran_in: dict[str, asyncio.Task[object] | None] = {}
    gate, inline_done = asyncio.Event(), asyncio.Event()

    async def memory(name: str) -> str:
        ran_in[name] = asyncio.current_task()
        if name == "c":
            inline_done.set()
        return name

    async def fetch(name: str) -> str:
        await gate.wait()
        ran_in[name] = asyncio.current_task()
        return name

    async def failing() -> str:
        raise ValueError("key outside the tablet")

    waiter = asyncio.ensure_future(
        gather_eager([memory("a"), fetch("b"), failing(), memory("c"), fetch("d")])
    )
    await inline_done.wait()
    assert not waiter.done()
    gate.set()
    got = await waiter
    assert got[:2] == ["a", "b"] and got[3:] == ["c", "d"]
    assert isinstance(got[2], ValueError)
    assert ran_in["a"] is ran_in["c"] is not caller  # inline, in the waiter's task: no new task
    assert ran_in["a"] is not None and ran_in["b"] not in (ran_in["a"], None)
    assert ran_in["b"] is not ran_in["d"]  # the reads that waited went on concurrently


async def test_reads_that_wait_proceed_concurrently_in_any_order() -> None:
    first, second = asyncio.Event(), asyncio.Event()

    async def waits_for(event: asyncio.Event, then: asyncio.Event | None, value: int) -> int:
        await event.wait()
        if then is not None:
            then.set()
        await asyncio.sleep(0)
        return value

    async def starter() -> int:
        second.set()
        return 0

    # The first read can only finish after the second one ran: they must not run in turn.
    got = await gather_eager([waits_for(first, None, 1), waits_for(second, first, 2), starter()])
    assert got == [1, 2, 0]


async def test_cancelling_the_request_cancels_the_reads_that_wait() -> None:
    fetch: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
    cleaned = asyncio.Event()

    async def read() -> bytes:
        try:
            return await fetch
        finally:
            cleaned.set()

    async def memory() -> bytes:
        return b"m"

    task = asyncio.ensure_future(gather_eager([memory(), read()]))
    for _ in range(3):  # the request starts, its waiting read goes on in a task of its own
        await asyncio.sleep(0)
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cleaned.is_set()
    assert fetch.cancelled()


async def test_a_context_variable_set_across_a_suspension_is_reset_in_its_own_context() -> None:
    """As botocore does around an S3 request: set, await, reset. Under gather_eager the
    coroutine continues in a task, in the same context it started in (each its own copy)."""
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="caller")

    async def request(name: str) -> str:
        token = var.set(name)
        await asyncio.sleep(0)  # suspends: continued in a task
        seen = var.get()
        var.reset(token)  # ValueError if in another context
        return seen

    async def inline(name: str) -> str:
        var.set(name)  # not reset: must not leak to the caller
        return name

    assert await gather_eager([request("a"), inline("b"), request("c")]) == ["a", "b", "c"]
    assert var.get() == "caller"
