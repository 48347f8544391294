"""The §6 scan cache in front of SSTable.get_row: hits skip the store, close() drops entries."""

from __future__ import annotations

from tabletstore.keys import Cell, CellKind
from tabletstore.sstable import SSTable, write_sstable
from tabletstore.sstable.block_cache import ScanCache
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
