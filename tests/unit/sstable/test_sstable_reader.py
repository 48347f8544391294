"""Reading SSTables through an ObjectStore: requests per open / point read / scan, caches.

Every test goes through the ObjectStore interface (the ``object_store`` fixture runs it on
each backend) wrapped in InstrumentedObjectStore to count the requests S3 would bill.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading

import pytest

from tabletstore.errors import Corruption, NotFound, PreconditionFailed
from tabletstore.keys import Cell, CellKind, cell_sort_key
from tabletstore.sstable import (
    BlockCache,
    SSTable,
    SSTableInfo,
    reader,
    upload_sstable,
    write_sstable,
)
from tabletstore.sstable.reader import SSTableCore
from tabletstore.storage_s3.base import ObjectStore, Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore

KEY = "tables/t1/tablet1/default/sst1.parquet"


def make_cells(n: int, *, per_row: int = 3, value_size: int = 100) -> list[Cell]:
    return [
        Cell(
            b"row%06d" % (i // per_row),
            "cf",
            b"q%03d" % (i % per_row),
            1_000_000 + i,
            i + 1,
            CellKind.PUT,
            (b"v%d-" % i).ljust(value_size, b"x"),
        )
        for i in range(n)
    ]


async def put(
    store: ObjectStore, cells: list[Cell], key: str = KEY, **kwargs: object
) -> SSTableInfo:
    data, info = write_sstable(cells, **kwargs)  # type: ignore[arg-type]
    return await upload_sstable(store, key, data, info)


def counted(store: ObjectStore) -> InstrumentedObjectStore:
    return InstrumentedObjectStore(store)


async def test_upload_is_create_only(object_store: ObjectStore) -> None:
    info = await put(object_store, make_cells(10))
    assert info.key == KEY
    data, again = write_sstable(make_cells(10))
    with pytest.raises(PreconditionFailed):
        await upload_sstable(object_store, KEY, data, again)


async def test_open_is_one_ranged_get_of_the_tail(object_store: ObjectStore) -> None:
    info = await put(object_store, make_cells(600), block_size=4096)
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size, tail_size=info.tail_size)
    stats = store.stats()
    assert stats.requests == stats[Op.GET_RANGE].requests == 1
    assert stats[Op.GET_RANGE].bytes == info.tail_size
    assert (table.first_row, table.last_row, table.cells) == (b"row000000", b"row000199", 600)
    assert (table.min_seq, table.max_seq, table.block_count) == (1, 600, info.blocks)

    store.reset()
    await SSTable.open(store, KEY, size=info.size)  # unknown footer size: one 64 KiB guess
    assert store.stats().requests == store.stats()[Op.GET_RANGE].requests == 1

    store.reset()
    await SSTable.open(store, KEY)  # unknown size: HEAD first
    assert (store.stats()[Op.HEAD].requests, store.stats()[Op.GET_RANGE].requests) == (1, 1)


async def test_open_with_a_footer_larger_than_the_guess_takes_two_gets(
    object_store: ObjectStore,
) -> None:
    info = await put(object_store, make_cells(200), block_size=1024)
    store = counted(object_store)
    await SSTable.open(store, KEY, size=info.size, tail_size=100)
    assert store.stats()[Op.GET_RANGE].requests == 2
    assert store.stats()[Op.GET_RANGE].bytes == info.tail_size


async def test_a_large_tail_is_parsed_off_the_event_loop(
    object_store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    info = await put(object_store, make_cells(600), block_size=1024)
    parsed_on: list[int] = []
    from_tail = SSTableCore.from_tail.__func__  # type: ignore[attr-defined]

    def recorded(cls: type[SSTableCore], *args: object) -> SSTableCore:
        parsed_on.append(threading.get_ident())
        return from_tail(cls, *args)  # type: ignore[no-any-return]

    monkeypatch.setattr(SSTableCore, "from_tail", classmethod(recorded))
    monkeypatch.setattr(reader, "INLINE_TAIL_BYTES", info.tail_size)
    await SSTable.open(object_store, KEY, size=info.size, tail_size=info.tail_size)
    monkeypatch.setattr(reader, "INLINE_TAIL_BYTES", info.tail_size - 1)
    table = await SSTable.open(object_store, KEY, size=info.size, tail_size=info.tail_size)
    assert parsed_on == [threading.get_ident(), parsed_on[1]]
    assert parsed_on[1] != threading.get_ident()
    assert (table.first_row, table.last_row, table.cells) == (b"row000000", b"row000199", 600)


async def test_open_of_a_missing_object_is_not_found(object_store: ObjectStore) -> None:
    with pytest.raises(NotFound):
        await SSTable.open(object_store, "tables/none.parquet")
    with pytest.raises(NotFound):
        await SSTable.open(object_store, "tables/none.parquet", size=1000)


async def test_point_reads_cost_one_get_and_absent_rows_none(object_store: ObjectStore) -> None:
    cells = make_cells(3000)
    info = await put(object_store, cells, block_size=4096)
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size, tail_size=info.tail_size)
    store.reset()

    assert await table.get_row(b"row000500") == cells[1500:1503]
    assert store.stats()[Op.GET_RANGE].requests == 1
    assert store.stats().requests == 1

    store.reset()
    absent = [b"row%06d-absent" % i for i in range(300)]
    for row in absent:
        assert await table.get_row(row) == []
    # The bloom filter answers (about 1% false positives, each costing at most one GET).
    assert store.stats().requests <= 15
    assert table.bloom_skips >= 285
    assert await table.get_row(b"") == [] and await table.get_row(b"\xff") == []


async def open_cached(
    object_store: ObjectStore, n: int
) -> tuple[list[Cell], SSTableInfo, InstrumentedObjectStore, BlockCache, SSTable]:
    """``n`` cells in 4 KiB blocks, opened through a counting store (reset after the open)
    with a 16 MiB block cache."""
    cells = make_cells(n)
    info = await put(object_store, cells, block_size=4096)
    store = counted(object_store)
    cache = BlockCache(capacity_bytes=16 * 1024 * 1024)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=cache)
    store.reset()
    return cells, info, store, cache, table


async def test_block_cache_serves_repeated_reads(object_store: ObjectStore) -> None:
    cells, _, store, cache, table = await open_cached(object_store, 3000)
    for _ in range(3):
        assert await table.get_row(b"row000123") == cells[369:372]
        assert await table.get_row(b"row000124") == cells[372:375]
    assert store.stats().requests == 1  # both rows live in one block
    stats = cache.stats()
    assert (stats.misses, stats.hits, stats.entries) == (1, 5, 1)

    table.close()
    assert len(cache) == 0
    assert await table.get_row(b"row000123") == cells[369:372]
    assert store.stats().requests == 2


async def test_sstables_open_on_one_object_share_one_core(object_store: ObjectStore) -> None:
    cells, info, store, cache, first = await open_cached(object_store, 600)
    # A split's second child opening its parent's SSTable: no request, no second index.
    second = await SSTable.open(store, KEY, size=info.size, block_cache=cache)
    assert store.stats().requests == 0
    assert second._core is first._core and cache.open_cores == 1
    assert await second.get_row(b"row000042") == cells[126:129]

    # Another seq base decodes other seqs: a core of its own. No cache: nothing shared.
    based = await SSTable.open(store, KEY, size=info.size, block_cache=cache, seq_base=1000)
    assert based._core is not first._core and based.min_seq == 1001
    alone = await SSTable.open(store, KEY, size=info.size)
    assert alone._core is not first._core and cache.open_cores == 2
    # A size that disagrees with the open core's is not served by it.
    with pytest.raises(Corruption):
        await SSTable.open(store, KEY, size=info.size + 1, block_cache=cache)

    # The core lives as long as an SSTable holds it: then the next open reads the tail.
    del first, second, based
    gc.collect()
    assert cache.open_cores == 0
    store.reset()
    await SSTable.open(store, KEY, size=info.size, block_cache=cache)
    assert store.stats().requests == 1


async def test_concurrent_opens_of_one_object_end_with_one_core(object_store: ObjectStore) -> None:
    info = await put(object_store, make_cells(600), block_size=4096)
    cache = BlockCache(capacity_bytes=16 * 1024 * 1024)
    tables = await asyncio.gather(
        *(SSTable.open(object_store, KEY, size=info.size, block_cache=cache) for _ in range(4))
    )
    assert len({id(t._core) for t in tables}) == 1 and cache.open_cores == 1


async def test_concurrent_reads_of_one_block_share_one_get(object_store: ObjectStore) -> None:
    """Format 1: a point read fetches its whole block."""
    cells = make_cells(300)
    info = await put(object_store, cells, block_size=64 * 1024, format_version=1)
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=BlockCache(1 << 24))
    store.reset()
    rows = [b"row%06d" % i for i in range(0, 100, 7)]
    results = await asyncio.gather(*(table.get_row(r) for r in rows))
    assert [len(r) for r in results] == [3] * len(rows)
    assert store.stats()[Op.GET_RANGE].requests == 1


async def test_a_point_read_fetches_one_page_and_concurrent_reads_share_it(
    object_store: ObjectStore,
) -> None:
    """Format 2: a point read fetches the bytes of one page of each column, a few KiB, not its
    64 KiB block; concurrent reads of rows in that page share the GET."""
    cells = make_cells(3000, per_row=1)
    info = await put(object_store, cells, block_size=64 * 1024)
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=BlockCache(1 << 24))
    pages = table.footer.pages
    assert pages is not None and pages.page_cells < table.footer.blocks[0].cells
    store.reset()
    rows = [b"row%06d" % i for i in (250, 250, 250)]
    results = await asyncio.gather(*(table.get_row(r) for r in rows))
    assert results == [[c for c in cells if c.row == rows[0]]] * 3
    stats = store.stats()[Op.GET_RANGE]
    assert stats.requests == 1
    (block,) = table._core.blocks_for_row(rows[0])
    assert stats.bytes < table.footer.blocks[block].length
    # A read of another row of the same page is a cache hit.
    page = pages.pages_for_row(block, rows[0])
    same = pages.first_rows[page.start]
    assert await table.get_row(same) == [c for c in cells if c.row == same]
    assert store.stats()[Op.GET_RANGE].requests == 1


async def test_a_row_spanning_blocks_reads_every_block(object_store: ObjectStore) -> None:
    big = [Cell(b"big", "cf", b"q", 10_000 - i, i + 1, 0, b"%0999d" % i) for i in range(40)]
    cells = sorted([*make_cells(60), *big], key=cell_sort_key)
    info = await put(object_store, cells, block_size=4096)
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size)
    spanned = [b for b in table.footer.blocks if b.first_row <= b"big" <= b.last_row]
    assert len(spanned) >= 5
    store.reset()
    assert await table.get_row(b"big") == big
    assert store.stats()[Op.GET_RANGE].requests == len(spanned)
    # The neighbours share blocks with the big row and are read whole.
    assert await table.get_row(b"row000019") == [c for c in cells if c.row == b"row000019"]


async def test_scans_stream_ranges_in_order(object_store: ObjectStore) -> None:
    big = [Cell(b"row000010x", "cf", b"q", 500 - i, i + 1, 0, b"%0500d" % i) for i in range(30)]
    cells = sorted([*make_cells(900), *big], key=cell_sort_key)
    info = await put(object_store, cells, block_size=2048)
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size)

    store.reset()
    assert [c async for c in table.scan()] == cells
    assert store.stats()[Op.GET_RANGE].requests == info.blocks

    for start, end in [
        (b"row000010x", b"row000011"),
        (b"row000100", b"row000150"),
        (b"row0001", None),
        (b"", b"row000002"),
        (b"row000299", b"\xff"),
        (b"zzz", None),
        (b"row000050", b"row000050"),
        (b"row000060", b"row000050"),
    ]:
        want = [c for c in cells if c.row >= start and (end is None or c.row < end)]
        assert [c async for c in table.scan(start, end)] == want, (start, end)

    store.reset()
    got = [c async for c in table.scan(b"row000100", b"row000101")]
    assert len(got) == 3
    assert store.stats()[Op.GET_RANGE].requests <= 2


async def test_abandoned_scan_leaves_no_task_behind(object_store: ObjectStore) -> None:
    cells = make_cells(900)
    info = await put(object_store, cells, block_size=2048)
    table = await SSTable.open(object_store, KEY, size=info.size)
    scan = table.scan()
    seen = [await anext(scan) for _ in range(5)]
    assert seen == cells[:5]
    await scan.aclose()
    current = asyncio.current_task()
    assert [t for t in asyncio.all_tasks() if t is not current and not t.done()] == []


async def test_scan_blocks_and_fill_cache(object_store: ObjectStore) -> None:
    cells = make_cells(900)
    info = await put(object_store, cells, block_size=2048)
    cache = BlockCache(1 << 24)
    table = await SSTable.open(object_store, KEY, size=info.size, block_cache=cache)
    batches = [b async for b in table.scan_blocks(fill_cache=False)]
    assert [c for b in batches for c in b] == cells
    assert len(batches) == info.blocks and len(cache) == 0
    assert [c async for c in table.scan()] == cells
    assert len(cache) == info.blocks


async def test_load_all_reads_the_object_once_then_never_again(object_store: ObjectStore) -> None:
    cells = make_cells(1500)
    info = await put(object_store, cells, block_size=4096, compression="snappy")
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size, tail_size=info.tail_size)
    await table.load_all()
    assert table.resident
    assert store.stats()[Op.GET].requests == 1
    store.reset()
    assert await table.get_row(b"row000321") == cells[963:966]
    assert [c async for c in table.scan(b"row000400")] == cells[1200:]
    assert store.stats().requests == 0


async def test_each_compression_reads_back(object_store: ObjectStore) -> None:
    cells = make_cells(600)
    for i, compression in enumerate(["zstd", "lz4", "snappy", "none"]):
        key = f"tables/t/c{i}.parquet"
        info = await put(object_store, cells, key, compression=compression, block_size=4096)
        table = await SSTable.open(object_store, key, size=info.size)
        assert table.footer.compression == compression
        assert await table.get_row(b"row000111") == cells[333:336]
        assert [c async for c in table.scan()] == cells


async def test_object_deleted_after_open_is_not_found(object_store: ObjectStore) -> None:
    info = await put(object_store, make_cells(30))
    table = await SSTable.open(object_store, KEY, size=info.size)
    await object_store.delete(KEY)
    with pytest.raises(NotFound):
        await table.get_row(b"row000001")
    with pytest.raises(NotFound):
        await table.load_all()


async def test_empty_sstable_reads_nothing(object_store: ObjectStore) -> None:
    info = await put(object_store, [])
    store = counted(object_store)
    table = await SSTable.open(store, KEY, size=info.size)
    assert table.block_count == 0
    assert await table.get_row(b"a") == []
    assert [c async for c in table.scan()] == []
    assert store.stats().requests == 1


class _OverlapCounter(InstrumentedObjectStore):
    """Counts how many ranged GETs are in flight at once (each yields to the loop a few times)."""

    def __init__(self, inner: ObjectStore) -> None:
        super().__init__(inner)
        self.active = 0
        self.max_active = 0

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            for _ in range(3):
                await asyncio.sleep(0)
            return await super().get_range(key, offset, length)
        finally:
            self.active -= 1


@pytest.mark.parametrize("readahead", [0, 1, 4])
async def test_scan_readahead_is_bounded_and_grows(
    object_store: ObjectStore, readahead: int
) -> None:
    cells = make_cells(1500)
    info = await put(object_store, cells, block_size=2048)
    assert info.blocks > 20
    store = _OverlapCounter(object_store)
    table = await SSTable.open(store, KEY, size=info.size)
    assert [c async for c in table.scan(readahead=readahead)] == cells
    assert store.max_active == max(1, readahead)
    assert store.stats()[Op.GET_RANGE].requests == 1 + info.blocks

    # A scan abandoned after its first block fetched at most one block more.
    store.reset()
    async with contextlib.aclosing(table.scan_blocks(readahead=readahead)) as blocks:
        await anext(blocks)
    assert store.stats()[Op.GET_RANGE].requests <= (1 if readahead == 0 else 2)


def test_recent_pages_remember_the_last_n_with_repeats() -> None:
    from tabletstore.sstable.reader import _RecentPages

    recent = _RecentPages(3)
    for p in (1, 2, 2):
        recent.append(p)
    assert 1 in recent and 2 in recent and 3 not in recent and len(recent) == 3
    recent.append(3)  # pushes out 1
    assert 1 not in recent and 2 in recent and 3 in recent
    recent.append(4)  # pushes out one 2: the other is still there
    assert 2 in recent
    recent.append(5)  # pushes out the last 2
    assert 2 not in recent and [p in recent for p in (3, 4, 5)] == [True, True, True]
    assert len(recent) == 3
