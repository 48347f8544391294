"""In-process calls' turn slices (rpc/transport.py ``_take_turn``): one slice per event loop."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tabletstore.rpc import transport


def _count_yields(monkeypatch: pytest.MonkeyPatch) -> list[asyncio.AbstractEventLoop]:
    yields: list[asyncio.AbstractEventLoop] = []
    real_sleep = asyncio.sleep

    async def sleep(delay: float, result: Any = None) -> Any:
        yields.append(asyncio.get_running_loop())
        return await real_sleep(delay, result)

    monkeypatch.setattr(transport.asyncio, "sleep", sleep)
    return yields


def test_each_event_loop_keeps_its_own_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls alternating between two loops: each loop yields at its first call and then not
    until its own slice ends, whichever loop ran last."""
    monkeypatch.setattr(transport, "TURN_SECONDS", 3600.0)
    yields = _count_yields(monkeypatch)
    a, b, c = asyncio.new_event_loop(), asyncio.new_event_loop(), asyncio.new_event_loop()
    try:
        for _ in range(3):
            for loop in (a, b):
                loop.run_until_complete(transport._take_turn())
        assert yields == [a, b]
        # Slices of no time from now on: c yields at every call, a and b keep their hour.
        monkeypatch.setattr(transport, "TURN_SECONDS", 0.0)
        for loop in (c, a, c, b):
            loop.run_until_complete(transport._take_turn())
        assert yields == [a, b, c, c]
    finally:
        for loop in (a, b, c):
            loop.close()
