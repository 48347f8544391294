"""The collector's memory across masters (master/gc_state.py): its format, its keys, and the
planner's rule for its versions."""

from __future__ import annotations

import gzip
import json

import pytest

from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.master import gc_plan as gc
from tabletstore.master.gc_state import GcMemory, SavedSince, decode, encode
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo
from tabletstore.storage_s3.memory import MemoryObjectStore


def test_a_saved_map_reads_back_exactly() -> None:
    saved = SavedSince(1000.5, {"tables/t/a/default/x.parquet": 990.25})
    assert decode(encode(saved), name="k") == saved


def _gz(doc: object) -> bytes:
    # mtime=0: the bytes (and so the test ids) must not depend on the clock, or
    # pytest-xdist's workers collect different tests.
    return gzip.compress(json.dumps(doc).encode(), mtime=0)


@pytest.mark.parametrize(
    ("data", "complaint"),
    [
        (b"not gzip", "not gzip-compressed JSON"),
        (_gz([]), "has format 'list'"),
        (_gz({"format": 2}), "has format 2"),
        (_gz({"format": 1, "since": {}}), "saved_at"),
        (_gz({"format": 1, "saved_at": 1.0}), "since map"),
        (_gz({"format": 1, "saved_at": 1, "since": {"k": "x"}}), "no valid time for 'k'"),
    ],
    ids=["not-gzip", "list", "format-2", "no-saved-at", "no-since", "bad-time"],
)
def test_a_damaged_state_is_corruption_naming_it(data: bytes, complaint: str) -> None:
    with pytest.raises(Corruption, match="collector state gc/x") as exc:
        decode(data, name="gc/x")
    assert complaint in str(exc.value)


def test_state_keys_sort_by_version_and_parse_back() -> None:
    keys = [layout.gc_state_key(v) for v in (1, 9, 10)]
    assert keys == sorted(keys)
    assert all(k.startswith(layout.gc_state_prefix()) for k in keys)
    assert [layout.parse_gc_state_key(k) for k in keys] == [1, 9, 10]
    with pytest.raises(InvalidArgument):
        layout.parse_gc_state_key("gc/since/7.json.gz")


def test_the_planner_keeps_the_newest_state_and_deletes_older_ones() -> None:
    listed = [ObjectInfo(layout.gc_state_key(v), 10, 0.0) for v in (3, 4)]
    listed.append(ObjectInfo("gc/something-else", 10, 0.0))
    decided = gc.plan(gc.LiveSet(), listed, 10_000.0, grace=60.0)
    assert decided.reasons[layout.gc_state_key(4)] is gc.Reason.KEEP_COLLECTOR_STATE
    assert decided.delete == (layout.gc_state_key(3),)
    assert decided.unknown == ("gc/something-else",)


async def test_each_save_is_the_next_version_and_replaces_the_one_before() -> None:
    store = MemoryObjectStore("memory://gc-state-versions", shared=False)
    try:
        memory = GcMemory(store)
        assert await memory.adopt(100.0, 60.0) == {}
        await memory.save({"a": 90.0}, 100.0)
        await memory.save({"a": 90.0, "b": 95.0}, 110.0)
        keys = [info.key async for info in store.list("")]
        assert keys == [layout.gc_state_key(2)]
        # Another master (a new leader) adopts the newest; a save older than the grace is not.
        assert await GcMemory(store).adopt(150.0, 60.0) == {"a": 90.0, "b": 95.0}
        assert await GcMemory(store).adopt(170.0, 60.0) == {}
    finally:
        await store.close()


async def test_two_masters_saving_at_once_lose_one_save_and_nothing_else() -> None:
    store = MemoryObjectStore("memory://gc-state-race", shared=False)
    try:
        old, new = GcMemory(store), GcMemory(store)
        await old.adopt(100.0, 60.0)
        await new.adopt(100.0, 60.0)
        await new.save({"b": 99.0}, 100.0)
        await old.save({"a": 98.0}, 100.0)  # the same version: refused, skipped
        assert await GcMemory(store).adopt(101.0, 60.0) == {"b": 99.0}
        await old.save({"a": 98.0}, 102.0)  # learns the newest version, saves the next
        assert await GcMemory(store).adopt(103.0, 60.0) == {"a": 98.0}
        assert [info.key async for info in store.list("")] == [layout.gc_state_key(2)]
    finally:
        await store.close()


async def test_a_damaged_state_is_not_adopted_and_the_next_save_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    store = MemoryObjectStore("memory://gc-state-damaged", shared=False)
    try:
        await store.create(layout.gc_state_key(1), b"garbage")
        memory = GcMemory(store)
        assert await memory.adopt(100.0, 60.0) == {}
        assert "not adopted" in caplog.text and layout.gc_state_key(1) in caplog.text
        await memory.save({"a": 1.0}, 100.0)
        assert await GcMemory(store).adopt(100.0, 60.0) == {"a": 1.0}
    finally:
        await store.close()
