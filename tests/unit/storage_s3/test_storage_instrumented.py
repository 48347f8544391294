"""InstrumentedObjectStore counts requests and bytes the way S3 would bill them."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from tabletstore.errors import Unavailable
from tabletstore.storage_s3 import find_layer, open_store
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore, OpStats, StoreStats
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.storage_s3.retrying import RetryingObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tabletstore.testing.store_conformance import create_many


async def test_counts_requests_and_bytes_per_kind() -> None:
    store = InstrumentedObjectStore(MemoryObjectStore())
    await store.create("a", b"12345")
    await store.create("b", b"xy")
    assert await store.get("a") == b"12345"
    assert await store.get("missing") is None
    assert await store.get_range("a", 1, 2) == b"23"
    assert await store.head("a") is not None
    await store.delete("b")
    stats = store.stats()
    assert stats[Op.PUT] == OpStats(requests=2, bytes=7)
    assert stats[Op.GET] == OpStats(requests=2, bytes=5)
    assert stats[Op.GET_RANGE] == OpStats(requests=1, bytes=2)
    assert stats[Op.HEAD] == OpStats(requests=1)
    assert stats[Op.DELETE] == OpStats(requests=1)
    assert stats[Op.LIST] == OpStats()
    assert stats.requests == 7
    assert (stats.bytes_read, stats.bytes_written) == (7, 7)
    assert stats.as_dict()["PUT"] == {"requests": 2, "bytes": 7, "errors": 0}
    assert set(stats.as_dict()) == {op.value for op in Op}


@pytest.mark.parametrize(
    ("objects", "pages"), [(0, 1), (1, 1), (1000, 1), (1001, 2), (2000, 2), (2500, 3)]
)
async def test_listing_counts_one_request_per_page_of_1000(objects: int, pages: int) -> None:
    memory = MemoryObjectStore()
    await create_many(memory, [(f"k{i:05d}", b"") for i in range(objects)])
    store = InstrumentedObjectStore(memory)
    assert len([info async for info in store.list("")]) == objects
    assert store.stats()[Op.LIST].requests == pages


async def test_an_abandoned_listing_counts_only_the_pages_it_used() -> None:
    memory = MemoryObjectStore()
    await create_many(memory, [(f"k{i:05d}", b"") for i in range(3000)])
    store = InstrumentedObjectStore(memory)
    async for info in store.list(""):
        if info.key == "k00999":
            break
    assert store.stats()[Op.LIST].requests == 1


@pytest.mark.parametrize(("keys", "requests"), [(0, 0), (1, 1), (1000, 1), (1001, 2), (2500, 3)])
async def test_delete_many_counts_one_request_per_batch_of_1000(keys: int, requests: int) -> None:
    store = InstrumentedObjectStore(MemoryObjectStore())
    await store.delete_many(f"k{i}" for i in range(keys))
    assert store.stats()[Op.DELETE].requests == requests


async def test_errors_are_counted_and_reset_zeroes() -> None:
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.fail(Op.GET, times=2)
    faulty.fail(Op.LIST)
    store = InstrumentedObjectStore(faulty)
    for _ in range(2):
        with pytest.raises(Unavailable):
            await store.get("k")
    with pytest.raises(Unavailable):
        _ = [info async for info in store.list("")]
    assert store.stats()[Op.GET] == OpStats(requests=2, errors=2)
    assert store.stats()[Op.LIST] == OpStats(requests=1, errors=1)
    store.reset()
    assert store.stats() == StoreStats()
    assert store.stats().requests == 0


async def test_snapshots_subtract_to_the_cost_of_a_workload() -> None:
    store = InstrumentedObjectStore(MemoryObjectStore())
    await store.create("warm", b"x")
    before = store.stats()
    for i in range(10):
        await store.create(f"k{i}", b"abc")
    cost = store.stats() - before
    assert cost[Op.PUT] == OpStats(requests=10, bytes=30)
    assert cost.requests == 10


async def test_retries_under_the_stack_are_counted_as_requests() -> None:
    faulty = FaultyObjectStore(MemoryObjectStore())
    faulty.fail(Op.HEAD, times=2)
    counted = InstrumentedObjectStore(faulty)
    store = RetryingObjectStore(counted, base_delay=0)
    assert await store.head("k") is None
    assert counted.stats()[Op.HEAD] == OpStats(requests=3, errors=2)


async def test_prometheus_counters_mirror_the_snapshot() -> None:
    registry = CollectorRegistry()
    store = InstrumentedObjectStore(MemoryObjectStore(), registry=registry)
    await store.create("a", b"1234")
    await store.get("a")
    value = registry.get_sample_value
    assert value("tabletstore_object_store_requests_total", {"op": "PUT"}) == 1
    assert value("tabletstore_object_store_bytes_total", {"op": "PUT"}) == 4
    assert value("tabletstore_object_store_bytes_total", {"op": "GET"}) == 4


async def test_open_store_stack_exposes_its_counters() -> None:
    store = open_store("memory://instrumented-stack", instrument=True)
    assert isinstance(store, RetryingObjectStore)
    counted = find_layer(store, InstrumentedObjectStore)
    assert counted is not None
    await store.create("k", b"v")
    assert counted.stats()[Op.PUT].requests == 1
    assert find_layer(open_store("memory://"), InstrumentedObjectStore) is None
    await store.close()
