"""In-process calls give the event loop a turn on every call (rpc/transport.py ``_take_turn``)."""

from __future__ import annotations

import asyncio

from tabletstore.rpc import transport


def _method(name: str, *, streaming: bool) -> transport.Method:
    return transport.Method("svc", name, int, int, (int,), streaming)


async def test_every_call_and_every_streamed_item_gives_the_other_tasks_a_turn() -> None:
    """A handler that never suspends still lets another task run once per call and once per
    streamed item, however quickly the calls follow one another."""
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    async def unary(request: int) -> int:
        return request

    async def stream(request: int):  # type: ignore[no-untyped-def]
        for i in range(request):
            yield i

    handlers = {"unary": unary, "stream": stream}
    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    try:
        before = ticks
        for i in range(50):
            assert (
                await transport.call_handler(
                    handlers, "a", _method("unary", streaming=False), i, None
                )
                == i
            )
        assert ticks - before >= 50
        before = ticks
        streamed = transport.stream_handler(
            handlers, "a", _method("stream", streaming=True), 20, None
        )
        items = [i async for i in streamed]
        assert items == list(range(20))
        assert ticks - before >= 20
    finally:
        stop.set()
        await task
