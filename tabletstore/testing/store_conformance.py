"""The ObjectStore conformance suite: every contract of ``storage_s3/base.py``, as tests.

Shipped in the package (zarr-python's ``zarr.testing.store`` pattern) so every backend and
every wrapper stack runs the same checks. A test module subclasses it and provides the store::

    class TestLocalStore(ObjectStoreConformance):
        @pytest.fixture
        async def store(self, tmp_path):
            store = LocalObjectStore(tmp_path)
            yield store
            await store.close()

The ``store`` fixture must yield an empty store and close it afterwards (``close`` must be
idempotent: one test closes the store itself). Each test uses its own key prefix.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from tabletstore.errors import Closed, InvalidArgument, PreconditionFailed
from tabletstore.storage_s3.base import ObjectInfo, ObjectStore

__all__ = ["ObjectStoreConformance", "collect", "create_many"]


async def collect(
    store: ObjectStore, prefix: str, *, start_after: str | None = None
) -> list[ObjectInfo]:
    """A whole listing as a list."""
    return [info async for info in store.list(prefix, start_after=start_after)]


async def create_many(
    store: ObjectStore, items: Sequence[tuple[str, bytes]], *, concurrency: int = 32
) -> None:
    """Create every (key, data) pair, at most ``concurrency`` at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(key: str, data: bytes) -> None:
        async with gate:
            await store.create(key, data)

    async with asyncio.TaskGroup() as group:
        for key, data in items:
            group.create_task(one(key, data))


class ObjectStoreConformance:
    """Subclass it and override the ``store`` fixture (see the module docstring)."""

    #: Objects created by the pagination test: more than one 1,000-key S3 page.
    pagination_objects = 1100
    #: Whether one key may be both an object and a "directory" prefix of others (``a`` and
    #: ``a/b``). S3 and memory allow it; a local directory cannot, and must say so with
    #: InvalidArgument instead (the key layout never needs it).
    object_and_prefix_keys = True

    @pytest.fixture
    async def store(self) -> AsyncIterator[ObjectStore]:
        raise NotImplementedError("a conformance subclass must provide the store fixture")
        yield  # pragma: no cover

    # Missing keys -------------------------------------------------------------------------

    async def test_is_an_object_store(self, store: ObjectStore) -> None:
        assert isinstance(store, ObjectStore)
        assert isinstance(store.url, str) and store.url

    async def test_missing_key_is_none(self, store: ObjectStore) -> None:
        assert await store.get("missing/key") is None
        assert await store.get_range("missing/key", 0, 10) is None
        assert await store.get_range("missing/key", 0, 0) is None
        assert await store.head("missing/key") is None

    async def test_empty_key_is_invalid(self, store: ObjectStore) -> None:
        with pytest.raises(InvalidArgument):
            await store.get("")
        with pytest.raises(InvalidArgument):
            await store.create("", b"x")

    # Create and read ----------------------------------------------------------------------

    async def test_create_then_read(self, store: ObjectStore) -> None:
        before = time.time()
        await store.create("rw/object", b"hello world")
        assert await store.get("rw/object") == b"hello world"
        info = await store.head("rw/object")
        assert info is not None
        assert (info.key, info.size) == ("rw/object", 11)
        # Server clocks (moto, S3) round to seconds and may drift a little from ours.
        assert before - 300 <= info.last_modified <= time.time() + 300

    async def test_get_range(self, store: ObjectStore) -> None:
        await store.create("range/obj", b"0123456789")
        assert await store.get_range("range/obj", 0, 4) == b"0123"
        assert await store.get_range("range/obj", 3, 2) == b"34"
        assert await store.get_range("range/obj", 8, 100) == b"89"
        assert await store.get_range("range/obj", 9, 1) == b"9"
        assert await store.get_range("range/obj", 10, 5) == b""
        assert await store.get_range("range/obj", 50, 5) == b""
        assert await store.get_range("range/obj", 4, 0) == b""

    async def test_negative_range_is_invalid(self, store: ObjectStore) -> None:
        await store.create("range/neg", b"abc")
        with pytest.raises(InvalidArgument):
            await store.get_range("range/neg", -1, 2)
        with pytest.raises(InvalidArgument):
            await store.get_range("range/neg", 0, -2)

    async def test_binary_content_round_trips(self, store: ObjectStore) -> None:
        data = bytes(range(256)) * 64 + b"\x00\r\n\xff"
        await store.create("bin/all-bytes", data)
        assert await store.get("bin/all-bytes") == data
        assert await store.get_range("bin/all-bytes", 250, 20) == data[250:270]
        info = await store.head("bin/all-bytes")
        assert info is not None and info.size == len(data)

    async def test_empty_object(self, store: ObjectStore) -> None:
        await store.create("empty/obj", b"")
        assert await store.get("empty/obj") == b""
        assert await store.get_range("empty/obj", 0, 10) == b""
        info = await store.head("empty/obj")
        assert info is not None and info.size == 0
        with pytest.raises(PreconditionFailed):
            await store.create("empty/obj", b"")

    async def test_unusual_keys(self, store: ObjectStore) -> None:
        keys = [
            "odd/with space/a b",
            "odd/unicode/é漢字ü",
            "odd/eq/a=b=c",
            "odd/plus/a+b",
            "odd/percent/%41%2F",
            "odd/punct/~!@$&'()*,;:[]",
            "odd/query/a?b#c",
        ]
        for i, key in enumerate(keys):
            await store.create(key, f"value {i}".encode())
        for i, key in enumerate(keys):
            assert await store.get(key) == f"value {i}".encode(), key
            info = await store.head(key)
            assert info is not None and info.key == key
        assert [info.key for info in await collect(store, "odd/")] == sorted(keys)

    # Create-only --------------------------------------------------------------------------

    async def test_create_twice_keeps_the_first(self, store: ObjectStore) -> None:
        await store.create("once/obj", b"first")
        with pytest.raises(PreconditionFailed):
            await store.create("once/obj", b"second")
        assert await store.get("once/obj") == b"first"

    async def test_concurrent_creates_exactly_one_wins(self, store: ObjectStore) -> None:
        contenders = [f"writer {i}".encode() for i in range(8)]
        results = await asyncio.gather(
            *(store.create("race/obj", data) for data in contenders), return_exceptions=True
        )
        winners = [data for data, result in zip(contenders, results, strict=True) if result is None]
        losers = [result for result in results if result is not None]
        assert len(winners) == 1, results
        assert all(isinstance(result, PreconditionFailed) for result in losers), losers
        assert await store.get("race/obj") == winners[0]

    # Listing ------------------------------------------------------------------------------

    async def test_list_order_and_prefix(self, store: ObjectStore) -> None:
        keys = ["ls/b", "ls/a/2", "ls/a/10", "ls/a/1", "ls/c", "ls-other/x", "lt/y", "ls/a-x"]
        keys += ["ls/a.b", "ls/a0", "ls/A", "ls/é"]
        shuffled = keys[:]
        random.Random(7).shuffle(shuffled)
        for key in shuffled:
            await store.create(key, key.encode())
        under = sorted(k for k in keys if k.startswith("ls/"))
        listed = await collect(store, "ls/")
        assert [info.key for info in listed] == under
        assert all(info.size == len(info.key.encode()) for info in listed)
        assert [i.key for i in await collect(store, "ls/a/")] == ["ls/a/1", "ls/a/10", "ls/a/2"]
        assert [i.key for i in await collect(store, "ls")] == sorted(
            k for k in keys if k.startswith("ls")
        )
        assert await collect(store, "nothing/") == []

    async def test_key_that_is_also_a_prefix(self, store: ObjectStore) -> None:
        await store.create("nest/a", b"object")
        if self.object_and_prefix_keys:
            await store.create("nest/a/b", b"below")
            assert [i.key for i in await collect(store, "nest/")] == ["nest/a", "nest/a/b"]
            assert await store.get("nest/a") == b"object"
        else:
            with pytest.raises(InvalidArgument):
                await store.create("nest/a/b", b"below")
            await store.create("nest/x/y", b"below")
            with pytest.raises(InvalidArgument):
                await store.create("nest/x", b"object")
            assert await store.get("nest/x") is None
            assert await store.head("nest/x") is None
            assert [i.key for i in await collect(store, "nest/")] == ["nest/a", "nest/x/y"]

    async def test_list_start_after(self, store: ObjectStore) -> None:
        keys = [f"sa/{i:02d}" for i in range(10)]
        await create_many(store, [(k, b"x") for k in keys])
        assert [i.key for i in await collect(store, "sa/", start_after="sa/04")] == keys[5:]
        # A start_after that is not itself a key.
        assert [i.key for i in await collect(store, "sa/", start_after="sa/045")] == keys[5:]
        # Before the prefix: everything; after it: nothing.
        assert [i.key for i in await collect(store, "sa/", start_after="s")] == keys
        assert await collect(store, "sa/", start_after="sb") == []
        assert await collect(store, "sa/", start_after=keys[-1]) == []

    async def test_list_paginates(self, store: ObjectStore) -> None:
        count = self.pagination_objects
        keys = [f"page/{i:05d}" for i in range(count)]
        await create_many(store, [(k, b"") for k in keys])
        listed = [info.key for info in await collect(store, "page/")]
        assert listed == keys
        middle = keys[count // 2]
        assert [i.key for i in await collect(store, "page/", start_after=middle)] == keys[
            count // 2 + 1 :
        ]
        await store.delete_many(keys)
        assert await collect(store, "page/") == []

    async def test_listing_reflects_creates_and_deletes(self, store: ObjectStore) -> None:
        await store.create("live/a", b"1")
        await store.create("live/b", b"2")
        await store.delete("live/a")
        assert [info.key for info in await collect(store, "live/")] == ["live/b"]

    # Deletes ------------------------------------------------------------------------------

    async def test_delete_is_idempotent(self, store: ObjectStore) -> None:
        await store.delete("del/missing")
        await store.create("del/obj", b"x")
        await store.delete("del/obj")
        assert await store.get("del/obj") is None
        assert await store.head("del/obj") is None
        await store.delete("del/obj")

    async def test_delete_many(self, store: ObjectStore) -> None:
        await create_many(store, [(f"dm/{i}", b"x") for i in range(5)])
        await store.delete_many(["dm/0", "dm/2", "dm/missing", "dm/4"])
        assert [info.key for info in await collect(store, "dm/")] == ["dm/1", "dm/3"]
        await store.delete_many([])
        await store.delete_many(iter(["dm/1", "dm/3", "dm/1"]))
        assert await collect(store, "dm/") == []

    # Lifecycle ----------------------------------------------------------------------------

    async def test_use_after_close_raises_closed(self, store: ObjectStore) -> None:
        await store.create("closed/obj", b"x")
        await store.close()
        with pytest.raises(Closed):
            await store.get("closed/obj")
        with pytest.raises(Closed):
            await store.create("closed/other", b"x")
