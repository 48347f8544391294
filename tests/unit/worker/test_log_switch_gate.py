"""The worker's log-switch gate: openings share it, a switch holds it alone and is not starved."""

from __future__ import annotations

import asyncio

from tabletstore.worker.log_switch_gate import SwitchGate


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_openings_share_the_gate_and_a_switch_waits_for_them() -> None:
    gate = SwitchGate()
    order: list[str] = []
    release = asyncio.Event()

    async def opening(name: str) -> None:
        async with gate.shared():
            order.append(f"{name} in")
            await release.wait()
            order.append(f"{name} out")

    async def switch() -> None:
        async with gate.exclusive():
            order.append("switch")

    a = asyncio.create_task(opening("a"))
    b = asyncio.create_task(opening("b"))
    await _settle()
    assert order == ["a in", "b in"]  # side by side
    s = asyncio.create_task(switch())
    await _settle()
    late = asyncio.create_task(opening("late"))  # comes after the waiting switch
    await _settle()
    assert "switch" not in order and "late in" not in order
    release.set()
    await asyncio.gather(a, b, s, late)
    assert order.index("switch") > max(order.index("a out"), order.index("b out"))
    assert order.index("late in") > order.index("switch")
    assert not gate.locked


async def test_a_cancelled_holder_or_waiter_leaves_the_gate_usable() -> None:
    gate = SwitchGate()
    held = asyncio.Event()

    async def hold_shared() -> None:
        async with gate.shared():
            held.set()
            await asyncio.Event().wait()

    holder = asyncio.create_task(hold_shared())
    await held.wait()
    waiter = asyncio.create_task(gate.exclusive().__aenter__())
    await _settle()
    waiter.cancel()
    holder.cancel()
    await asyncio.gather(holder, waiter, return_exceptions=True)
    assert not gate.locked
    async with asyncio.timeout(5):
        async with gate.exclusive():
            assert gate.locked
        async with gate.shared():
            pass
