"""How a restore of a backup just copied in finds its SSTables (metadata/backup_copy.py ``look_up``):
by listing each table's prefix over the span of the keys it wants, not a HEAD per SSTable.
A key in the span listed is there (its size) or absent (None); one past where a listing
stopped, of a table beyond those listed, or that is no SSTable key is left to a HEAD."""

from __future__ import annotations

import pytest

from tabletstore.metadata import backup_copy
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore


def _key(table: str, tablet: int, name: str) -> str:
    return layout.sstable_key(table, f"t{tablet:05d}", "default", name)


async def test_one_listing_per_table_finds_present_and_absent_keys() -> None:
    store = InstrumentedObjectStore(MemoryObjectStore(shared=False))
    present = [_key("a-1", 0, "x1"), _key("a-1", 1, "x2"), _key("b-2", 0, "y1")]
    absent = _key("a-1", 0, "x0")  # inside a's span
    for i, k in enumerate(present):
        await store.create(k, b"z" * (i + 1))
    await store.create(_key("a-1", 0, "w0"), b"before the span")
    await store.create(_key("a-1", 2, "z9"), b"after the span")
    found = await backup_copy.look_up(store, [*present, absent, "backups/not-an-sstable"])
    assert {k: (i.size if i else None) for k, i in found.items()} == {
        present[0]: 1,
        present[1]: 2,
        present[2]: 3,
        absent: None,
    }
    assert store.stats()[Op.LIST].requests == 2  # one per table
    assert store.stats()[Op.HEAD].requests == 0


async def test_a_listing_stops_at_its_bound_and_leaves_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(backup_copy, "LISTED_OBJECTS", 2)
    monkeypatch.setattr(backup_copy, "LISTED_TABLES", 1)
    store = MemoryObjectStore(shared=False)
    keys = [_key("a-1", 0, f"x{i}") for i in range(4)]
    for k in keys:
        await store.create(k, b"z")
    other = _key("b-2", 0, "y")
    await store.create(other, b"z")
    found = await backup_copy.look_up(store, [*keys, other])
    assert sorted(found) == keys[:2]  # the rest, and table b's, to HEADs
