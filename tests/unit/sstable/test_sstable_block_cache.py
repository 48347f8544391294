"""The block cache (bytes-bounded LRU of decoded blocks) and the scan cache (§6)."""

from __future__ import annotations

import gc

import pyarrow as pa
import pytest

from tabletstore.errors import InvalidArgument
from tabletstore.keys import Cell, encode_ts_range
from tabletstore.sstable.block import Block
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.sstable.format import SCHEMA


def make_block(cells: list[Cell]) -> Block:
    columns = [
        pa.array(col, SCHEMA.field(i).type) for i, col in enumerate(zip(*cells, strict=True))
    ]
    return Block(pa.Table.from_arrays(columns, schema=SCHEMA))


def block(n: int, value_size: int = 100) -> Block:
    return make_block(
        [Cell(b"r%04d" % i, "cf", b"q", 1, i, 0, b"x" * value_size) for i in range(n)]
    )


def test_block_row_lookup_and_ranges() -> None:
    cells = [Cell(b"a", "cf", b"q%d" % i, 1, i, 0, b"") for i in range(3)]
    cells += [Cell(b"c", "cf", b"q", 1, 9, 0, b"v")]
    b = make_block(cells)
    assert (b.first_row, b.last_row, b.cells) == (b"a", b"c", 4)
    assert b.row_cells(b"a") == cells[:3]
    assert b.row_cells(b"b") == [] and b.row_cells(b"d") == []
    assert b.cells_in() == cells
    assert b.cells_in(b"b") == cells[3:]
    assert b.cells_in(b"", b"c") == cells[:3]
    assert b.cells_in(b"b", b"c") == []


def test_block_cache_is_bounded_by_bytes_and_evicts_least_recently_used() -> None:
    size = block(10).nbytes
    cache = BlockCache(capacity_bytes=3 * size)
    for i in range(3):
        cache.put("t1", i, block(10))
    assert cache.get("t1", 0) is not None  # 0 is now the most recently used
    cache.put("t1", 3, block(10))
    assert cache.get("t1", 1) is None  # evicted: least recently used
    assert all(cache.get("t1", i) is not None for i in (0, 2, 3))
    stats = cache.stats()
    assert stats.bytes <= 3 * size and stats.entries == 3
    assert (stats.hits, stats.misses, stats.evictions) == (4, 1, 1)
    assert stats.hit_rate == pytest.approx(0.8)


def test_block_cache_skips_oversized_blocks_and_evicts_by_object() -> None:
    small = block(5)
    cache = BlockCache(capacity_bytes=small.nbytes * 4)
    cache.put("huge", 0, block(1000))
    assert len(cache) == 0
    cache.put("a", 0, small)
    cache.put("a", 1, small)
    cache.put("b", 0, small)
    assert cache.evict("a") == 2
    assert cache.get("a", 0) is None and cache.get("b", 0) is small
    assert cache.stats().bytes == small.nbytes
    assert cache.evict("missing") == 0
    cache.put("b", 0, small)  # refresh, not double-charge
    assert cache.stats().bytes == small.nbytes


def test_block_cache_rejects_negative_capacity() -> None:
    with pytest.raises(InvalidArgument):
        BlockCache(-1)


def test_scan_cache_bounds_rows_and_invalidates() -> None:
    cache = ScanCache(max_rows=2)
    c1 = Cell(b"r1", "cf", b"q", 1, 1, 0, b"v")
    cache.put("tablet-a", b"r1", [c1])
    cache.put("tablet-a", b"r2", [])
    assert cache.get("tablet-a", b"r2") == []  # a cached absent row
    assert cache.get("tablet-a", b"r1") == [c1]
    cache.put("tablet-b", b"r1", [c1])  # third row: r1 of a was used after r2, so r2 goes
    assert cache.get("tablet-a", b"r2") is None
    assert len(cache) == 2
    assert cache.invalidate("tablet-a", b"r1") == 1
    assert cache.get("tablet-a", b"r1") is None
    cache.put("tablet-b", b"r2", [c1])
    assert cache.invalidate("tablet-b") == 2
    assert len(cache) == 0 and cache.stats().bytes == 0
    stats = cache.stats()
    assert (stats.hits, stats.misses, stats.evictions) == (2, 2, 1)


def test_scan_cache_is_bounded_by_bytes() -> None:
    cache = ScanCache(max_rows=100, capacity_bytes=2000)
    big = [Cell(b"r", "cf", b"q", 1, 1, 0, b"x" * 600)]
    for i in range(5):
        cache.put("ns", b"r%d" % i, big)
    assert cache.stats().bytes <= 2000
    assert len(cache) == 2


def test_block_cache_accounting_after_refresh_and_lru_eviction() -> None:
    small, big = block(5), block(10)
    cache = BlockCache(capacity_bytes=small.nbytes * 2 + big.nbytes)
    cache.put("a", 0, small)
    cache.put("a", 0, big)  # refreshed with another size: charged the new one only
    assert cache.stats().bytes == big.nbytes and len(cache) == 1
    cache.put("a", 1, small)
    cache.put("b", 0, small)
    cache.put("b", 1, big)  # evicts a/0 (least recently used) to fit
    stats = cache.stats()
    assert stats.evictions == 1 and stats.bytes == 2 * small.nbytes + big.nbytes
    assert cache.get("a", 0) is None
    assert cache.evict("a") == 1  # only a/1 was still cached
    assert cache.evict("b") == 2
    assert len(cache) == 0 and cache.stats().bytes == 0


def test_scan_cache_charges_each_cell() -> None:
    cell = Cell(b"r", "cf", b"q", 1, 1, 0, b"x" * 100)
    cache = ScanCache(max_rows=10)
    cache.put("ns", b"r", [cell, cell])
    one_cell = len(b"r") + len("cf") + len(b"q") + 100
    assert cache.stats().bytes == len(b"r") + 2 * (one_cell + 200)


def test_scan_cache_entries_are_untracked_by_the_gc_and_read_back_as_cells() -> None:
    # Cached rows must not keep objects tracked by the garbage collector (tens of
    # thousands of namedtuple Cells would be walked by every full collection): held as plain tuples, read as Cells.
    cells = [
        Cell(b"r", "cf", b"q1", 5, 9, 0, b"v1"),
        Cell(b"r", "cf", b"q2", 4, 8, 1, encode_ts_range(0, 3)),
    ]
    cache = ScanCache(max_rows=10)
    cache.put("ns", b"r", cells)
    cache.put("ns", b"one", cells[:1])
    cache.put("ns", b"none", [])
    gc.collect()
    values = [value for value, _ in cache._lru._map.values()]
    assert len(values) == 3 and not any(gc.is_tracked(v) for v in values)
    got = cache.get("ns", b"r")
    assert got == cells and all(type(c) is Cell for c in got)
    assert got[1].kind == 1 and got[0].seq == 9
    one = cache.get("ns", b"one")
    assert one == cells[:1] and type(one[0]) is Cell
    assert cache.get("ns", b"none") == []
