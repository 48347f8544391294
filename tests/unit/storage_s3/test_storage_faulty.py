"""The fault injector does what tests program it to do, and nothing else."""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.clock import ManualClock
from tabletstore.errors import Corruption, Indeterminate, InvalidArgument, Unavailable
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.testing.faulty_store import Action, FaultyObjectStore, Rule
from tabletstore.testing.store_conformance import collect, create_many


async def test_fail_fires_on_the_nth_matching_call_for_times_calls() -> None:
    store = FaultyObjectStore(MemoryObjectStore())
    rule = store.fail(Op.PUT, nth=2, times=2)
    await store.create("a", b"")
    for key in ("b", "c"):
        with pytest.raises(Unavailable):
            await store.create(key, b"")
    await store.create("d", b"")
    assert (rule.seen, rule.fired) == (4, 2)
    # A failed PUT is dropped: it never reached the inner store.
    assert [i.key for i in await collect(store, "")] == ["a", "d"]
    assert store.calls[Op.PUT] == 4


async def test_key_patterns_and_op_kinds_select_calls() -> None:
    store = FaultyObjectStore(MemoryObjectStore())
    await store.create("tables/t/x.parquet", b"data")
    await store.create("logs/w/1.log", b"data")
    store.fail([Op.GET, Op.GET_RANGE], key="tables/*", times=None, exc=lambda: Corruption("disk"))
    with pytest.raises(Corruption):
        await store.get("tables/t/x.parquet")
    with pytest.raises(Corruption):
        await store.get_range("tables/t/x.parquet", 0, 1)
    assert await store.get("logs/w/1.log") == b"data"
    assert await store.head("tables/t/x.parquet") is not None


async def test_lose_ack_applies_the_put_then_raises() -> None:
    store = FaultyObjectStore(MemoryObjectStore())
    store.lose_ack(key="logs/*")
    with pytest.raises(Indeterminate):
        await store.create("logs/1", b"segment")
    assert await store.get("logs/1") == b"segment"
    await store.create("logs/2", b"segment")  # times=1: only the first.


async def test_corrupt_flips_a_byte_of_matching_reads_only() -> None:
    memory = MemoryObjectStore()
    store = FaultyObjectStore(memory)
    await store.create("a.parquet", b"abcdef")
    await store.create("b.log", b"abcdef")
    await store.create("empty.parquet", b"")
    store.corrupt(key="*.parquet")
    corrupted = await store.get("a.parquet")
    assert corrupted is not None and corrupted != b"abcdef" and len(corrupted) == 6
    assert sum(x != y for x, y in zip(corrupted, b"abcdef", strict=True)) == 1
    assert await store.get_range("a.parquet", 2, 2) != b"cd"
    assert await store.get("b.log") == b"abcdef"
    assert await store.get("empty.parquet") == b""
    assert await memory.get("a.parquet") == b"abcdef"  # The stored object is intact.


async def test_delay_waits_on_the_injected_clock() -> None:
    clock = ManualClock()
    store = FaultyObjectStore(MemoryObjectStore(), clock=clock)
    await store.create("k", b"v")
    store.delay(5.0, Op.GET)
    task = asyncio.create_task(store.get("k"))
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(4.9)
    await asyncio.sleep(0)
    assert not task.done()
    clock.advance(0.2)
    assert await asyncio.wait_for(task, timeout=5) == b"v"


async def test_list_rules_apply_per_page() -> None:
    store = FaultyObjectStore(MemoryObjectStore())
    await create_many(store, [(f"k{i:05d}", b"") for i in range(1500)])
    store.fail(Op.LIST, nth=2)
    seen = []
    with pytest.raises(Unavailable):
        async for info in store.list(""):
            seen.append(info.key)
    assert len(seen) == 1000
    assert store.calls[Op.LIST] == 2


async def test_clear_removes_rules_and_bad_rules_are_rejected() -> None:
    store = FaultyObjectStore(MemoryObjectStore())
    store.fail(Op.GET, times=None)
    store.clear()
    assert await store.get("k") is None
    with pytest.raises(InvalidArgument):
        store.fail(Op.GET, nth=0)
    with pytest.raises(InvalidArgument):
        store.lose_ack(Op.GET)
    with pytest.raises(InvalidArgument):
        Rule(Action.DELAY, frozenset({Op.GET}), seconds=-1)
