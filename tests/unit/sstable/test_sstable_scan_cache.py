"""The §6 scan cache in front of SSTable.get_row: hits skip the store, close() drops entries."""

from __future__ import annotations

from tabletstore.keys import Cell, CellKind
from tabletstore.sstable import SSTable, write_sstable
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore


async def test_scan_cache_serves_repeated_row_reads_without_requests() -> None:
    store = InstrumentedObjectStore(MemoryObjectStore())
    cells = [Cell(b"r%03d" % i, "f", b"q", 10, i + 1, CellKind.PUT, b"v%d" % i) for i in range(200)]
    data, info = write_sstable(cells, block_size=1024)
    await store.create("t.parquet", data)
    cache = ScanCache(max_rows=100)
    table = await SSTable.open(
        store, "t.parquet", size=info.size, tail_size=info.tail_size, scan_cache=cache
    )
    first = await table.get_row(b"r050")
    before = store.stats().requests
    again = await table.get_row(b"r050")
    assert again == first == [cells[50]]
    assert store.stats().requests == before, "a scan-cache hit must not touch the store"
    assert cache.stats().hits == 1
    table.close()
    assert cache.get("t.parquet", b"r050") is None


async def test_rows_read_from_pages_just_fetched_are_admitted_at_their_next_read() -> None:
    """With a block cache, a row read from a page just fetched is not put in the scan cache
    (most such rows are read once); its page is cached, and the row's next read, a block
    cache hit, admits it; the read after that is a scan-cache hit."""
    store = InstrumentedObjectStore(MemoryObjectStore())
    cells = [Cell(b"r%03d" % i, "f", b"q", 10, i + 1, CellKind.PUT, b"v%d" % i) for i in range(200)]
    data, info = write_sstable(cells, block_size=1024)
    await store.create("t.parquet", data)
    scan_cache = ScanCache(max_rows=100)
    table = await SSTable.open(
        store,
        "t.parquet",
        size=info.size,
        tail_size=info.tail_size,
        block_cache=BlockCache(1 << 20),
        scan_cache=scan_cache,
    )
    assert await table.get_row(b"r050") == [cells[50]]
    assert scan_cache.get("t.parquet", b"r050") is None, "admitted from a page just fetched"
    fetched = store.stats().requests
    assert await table.get_row(b"r050") == [cells[50]]
    assert store.stats().requests == fetched, "the page is in the block cache"
    assert scan_cache.get("t.parquet", b"r050") == [cells[50]]
    hits = scan_cache.stats().hits
    assert await table.get_row(b"r050") == [cells[50]]
    assert scan_cache.stats().hits == hits + 1
    table.close()
