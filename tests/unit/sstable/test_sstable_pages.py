"""Format 2's pages (``sstable/pages.py``): round trips, the page index, damage, version 1."""

from __future__ import annotations

import asyncio
import gc
import os
import random
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from tabletstore.errors import Corruption
from tabletstore.keys import Cell, CellKind, cell_sort_key
from tabletstore.sstable import BlockCache, SSTable, read_sstable_bytes, write_sstable
from tabletstore.sstable import pages as pages_module
from tabletstore.sstable.format import parse_tail
from tabletstore.sstable.pages import (
    CONTINUES,
    Page,
    decode_page_index,
    encode_page_index,
    page_cells_for,
    read_page_header,
)
from tabletstore.sstable.reader import SSTableCore
from tabletstore.storage_s3.base import ObjectStore, Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore

KEY = "tables/t/tablet/default/pages.parquet"


def mixed_cells(n: int, seed: int = 7) -> list[Cell]:
    """Rows of 1..6 cells, values of 0..3000 random bytes, every kind, two families."""
    rng = random.Random(seed)
    cells = []
    r = 0
    while len(cells) < n:
        for q in range(rng.randint(1, 6)):
            kind = rng.choice([CellKind.PUT] * 6 + [CellKind.DELETE_COLUMN])
            cells.append(
                Cell(
                    b"row%07d" % r,
                    rng.choice(["cf", "meta"]),
                    b"q%d" % q,
                    rng.randint(0, 1 << 50),
                    len(cells) + 1,
                    kind,
                    rng.randbytes(rng.randint(0, 3000)) if kind == CellKind.PUT else b"",
                )
            )
        r += 1
    return sorted(cells, key=cell_sort_key)


@pytest.mark.parametrize("compression", ["zstd", "lz4", "snappy", "none"])
async def test_every_row_reads_back_through_pages(
    object_store: ObjectStore, compression: str
) -> None:
    cells = mixed_cells(1500)
    data, info = write_sstable(cells, compression=compression, block_size=32 * 1024)
    footer = parse_tail(data, len(data)).footer
    assert footer.format_version == 2 and footer.pages is not None
    assert footer.pages.pages > len(footer.blocks)
    await object_store.create(KEY, data)
    table = await SSTable.open(object_store, KEY, size=info.size, block_cache=BlockCache(1 << 20))
    by_row: dict[bytes, list[Cell]] = {}
    for c in cells:
        by_row.setdefault(c.row, []).append(c)
    for row, want in by_row.items():
        assert await table.get_row(row) == want
    assert await table.get_row(b"row0000000x") == []
    assert [c async for c in table.scan()] == cells
    assert read_sstable_bytes(data) == cells


async def test_a_row_spanning_pages_reads_whole(object_store: ObjectStore) -> None:
    wide = [Cell(b"wide", "cf", b"q%04d" % i, 5, i + 1, 0, os.urandom(100)) for i in range(300)]
    cells = sorted([*mixed_cells(200), *wide], key=cell_sort_key)
    data, info = write_sstable(cells, page_size=1024)
    pages = parse_tail(data, len(data)).footer.pages
    assert pages is not None
    assert any(int(f) & CONTINUES for f in pages.table[:, -1])
    await object_store.create(KEY, data)
    table = await SSTable.open(object_store, KEY, size=info.size)
    assert await table.get_row(b"wide") == wide


async def test_a_corrupt_page_is_corruption_naming_the_object(object_store: ObjectStore) -> None:
    cells = mixed_cells(600)
    data, info = write_sstable(cells)
    pages = parse_tail(data, len(data)).footer.pages
    blocks = parse_tail(data, len(data)).footer.blocks
    assert pages is not None
    # Damage the value bytes of page 2 of block 0.
    p = pages.block_starts[0] + 2
    offset = blocks[0].offset + int(pages.table[p, 19]) + int(pages.table[p, 20]) // 2
    bad = bytearray(data)
    bad[offset] ^= 0xFF
    await object_store.create(KEY, bytes(bad))
    table = await SSTable.open(object_store, KEY, size=info.size)
    row = pages.first_rows[p]
    with pytest.raises(Corruption, match=r"pages\.parquet.*block 0 fails its crc32c"):
        await table.get_row(row)


def test_the_page_index_round_trips_and_rejects_damage() -> None:
    data, _ = write_sstable(mixed_cells(800))
    footer = parse_tail(data, len(data)).footer
    pages = footer.pages
    assert pages is not None
    shape = [(b.length, b.cells) for b in footer.blocks]
    encoded = encode_page_index(pages)
    again = decode_page_index(encoded, shape)
    assert again.first_rows == pages.first_rows and (again.table == pages.table).all()
    raw = zstandard.ZstdDecompressor().decompress(encoded)

    def frame(data: bytes) -> bytes:
        return zstandard.ZstdCompressor(write_content_size=True).compress(data)

    with pytest.raises(Corruption, match="trailing"):
        decode_page_index(frame(raw + b"x"), shape)
    with pytest.raises(Corruption, match="malformed"):
        decode_page_index(frame(raw[:40]), shape)
    with pytest.raises(Corruption, match="malformed"):
        decode_page_index(encoded[:20], shape)
    with pytest.raises(Corruption, match=r"disagrees|pages"):
        decode_page_index(encoded, [(length, cells + 500) for length, cells in shape])


def test_version_1_sstables_stay_readable_and_have_no_pages() -> None:
    cells = mixed_cells(500)
    data, _ = write_sstable(cells, format_version=1)
    footer = parse_tail(data, len(data)).footer
    assert footer.format_version == 1 and footer.pages is None
    assert read_sstable_bytes(data) == cells


async def test_version_1_point_reads_go_through_blocks(object_store: ObjectStore) -> None:
    cells = mixed_cells(500)
    data, info = write_sstable(cells, format_version=1)
    await object_store.create(KEY, data)
    table = await SSTable.open(object_store, KEY, size=info.size)
    row = cells[len(cells) // 2].row
    assert await table.get_row(row) == [c for c in cells if c.row == row]


def test_version_2_files_are_plain_parquet() -> None:
    cells = mixed_cells(400)
    data, _ = write_sstable(cells)
    table = pq.read_table(pa.BufferReader(data))
    assert [tuple(r.values()) for r in table.to_pylist()] == [tuple(c) for c in cells]


def test_page_headers_parse_as_parquet_wrote_them() -> None:
    cells = mixed_cells(300)
    data, _ = write_sstable(cells, compression="none")
    meta = pq.read_metadata(pa.BufferReader(data))
    col = meta.row_group(0).column(6)
    header = read_page_header(data, col.data_page_offset)
    pages = parse_tail(data, len(data)).footer.pages
    assert pages is not None
    assert header.num_values == pages.page_cells
    assert header.compressed == header.uncompressed == int(pages.table[0, 20])
    with pytest.raises(ValueError):
        read_page_header(b"\x15", 0)


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_the_fast_header_paths_agree_with_the_general_reader(compression: str) -> None:
    data, _ = write_sstable(mixed_cells(400), compression=compression, page_size=512)
    meta = pq.read_metadata(pa.BufferReader(data))
    seen = 0
    for g in range(meta.num_row_groups):
        for c in range(meta.num_columns):
            col = meta.row_group(g).column(c)
            pos, end = col.data_page_offset, col.data_page_offset + col.total_compressed_size
            while pos < end:
                header = read_page_header(data, pos)
                assert header == pages_module._read_header_general(data, pos)
                assert header == pages_module._read_header_flat(data, pos)
                pos += header.header_length + header.compressed
                seen += 1
    assert seen > 7 * meta.num_row_groups


def test_page_cells_aim_at_about_8_kib() -> None:
    assert page_cells_for(1000) == 8
    assert page_cells_for(100_000) == 1
    assert page_cells_for(1) == 4096


async def test_sequential_point_reads_read_ahead_to_the_end_of_the_block(
    object_store: ObjectStore,
) -> None:
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(4000)]
    data, info = write_sstable(cells)
    footer = parse_tail(data, len(data)).footer
    assert footer.pages is not None and footer.pages.pages >= 4 * len(footer.blocks)
    await object_store.create(KEY, data)
    counted = InstrumentedObjectStore(object_store)
    table = await SSTable.open(counted, KEY, size=info.size, block_cache=BlockCache(1 << 24))
    counted.reset()
    for c in cells:
        assert await table.get_row(c.row) == [c]
    # One GET for a block's first page, one for the rest of it; the next block's first page
    # follows a page read lately, so it reads the whole block.
    assert counted.stats()[Op.GET_RANGE].requests <= len(footer.blocks) + 2


async def test_random_point_reads_fetch_single_pages(object_store: ObjectStore) -> None:
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(4000)]
    data, info = write_sstable(cells)
    await object_store.create(KEY, data)
    counted = InstrumentedObjectStore(object_store)
    table = await SSTable.open(counted, KEY, size=info.size, block_cache=BlockCache(1 << 24))
    pages = table.footer.pages
    assert pages is not None
    counted.reset()
    picks = random.Random(3).sample(range(0, pages.pages, 2), 20)  # never neighbours
    for p in picks:
        assert await table.get_row(pages.first_rows[p]) != []
    stats = counted.stats()[Op.GET_RANGE]
    assert stats.requests == len(picks)
    assert stats.bytes < len(picks) * max(b.length for b in table.footer.blocks)


async def test_interleaved_sequential_readers_fetch_each_page_once() -> None:
    """Many clients each reading a range row by row through one server (the
    sequential reads over RPC): their reads interleave, and a reader's read-ahead to the end
    of its block stops at pages another reader has cached or is fetching, so no page is
    fetched (and decoded) twice, and the GETs stay about one per block plus two per reader."""
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(4000)]
    data, info = write_sstable(cells, block_size=16 * 1024)
    store = InstrumentedObjectStore(MemoryObjectStore(shared=False))
    await store.create(KEY, data)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=BlockCache(1 << 24))
    store.reset()
    fetched: list[int] = []
    fetch = table._fetch_pages

    async def recording_fetch(block: int, pages: range, wanted_stop: int) -> dict[int, Page]:
        fetched.extend(pages)
        await asyncio.sleep(0)  # a GET suspends: the readers interleave
        return await fetch(block, pages, wanted_stop)

    table._fetch_pages = recording_fetch  # type: ignore[method-assign]
    readers = 8
    per = len(cells) // readers

    async def read_range(k: int) -> list[list[Cell]]:
        return [await table.get_row(b"r%06d" % i) for i in range(k * per, (k + 1) * per)]

    results = await asyncio.gather(*(read_range(k) for k in range(readers)))
    assert [c for got in results for row in got for c in row] == cells
    assert sorted(fetched) == sorted(set(fetched)), "a page was fetched twice"
    requests = store.stats()[Op.GET_RANGE].requests
    assert requests <= len(table.footer.blocks) + 2 * readers


async def test_many_interleaved_short_sequential_readers_read_ahead() -> None:
    """32 clients each reading a range of about four pages row by row through one worker
    (bench.paper's sequential reads over RPC): in lockstep, a reader's previous
    fetch is 32 fetches back, past what the recent-fetch window recognizes, and every page
    was fetched alone (about one GET per page, 3x one process's). A reader that has just read
    a page's last row reads ahead from the next page: about two GETs per reader (its first
    page, then the rest), never one per page."""
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(4480)]
    data, info = write_sstable(cells)
    store = InstrumentedObjectStore(MemoryObjectStore(shared=False))
    await store.create(KEY, data)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=BlockCache(1 << 24))
    index = table._core.pages
    assert index is not None
    readers = 32
    per = len(cells) // readers
    assert index.pages >= 3 * readers  # each reader's range spans three pages or more
    store.reset()
    fetch = table._fetch_pages

    async def interleaving_fetch(block: int, pages: range, wanted_stop: int) -> dict[int, Page]:
        for _ in range(readers):  # a GET takes long enough for every reader to move on
            await asyncio.sleep(0)
        return await fetch(block, pages, wanted_stop)

    table._fetch_pages = interleaving_fetch  # type: ignore[method-assign]

    async def read_range(k: int) -> list[list[Cell]]:
        return [await table.get_row(b"r%06d" % i) for i in range(k * per, (k + 1) * per)]

    results = await asyncio.gather(*(read_range(k) for k in range(readers)))
    assert [c for got in results for row in got for c in row] == cells
    requests = store.stats()[Op.GET_RANGE].requests
    assert requests <= 2 * readers + len(table.footer.blocks), (requests, index.pages)


async def test_pages_read_ahead_are_decoded_when_first_read() -> None:
    """A sequential point read reads ahead to the end of its block in one GET, but decodes
    only the page it asked for: the others are decoded when a read reaches them (a
    random read that happens to follow a recent fetch read ahead and decoded a whole block)."""
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(2000)]
    data, info = write_sstable(cells, block_size=32 * 1024)
    store = InstrumentedObjectStore(MemoryObjectStore(shared=False))
    await store.create(KEY, data)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=BlockCache(1 << 24))
    index = table._core.pages
    assert index is not None
    decoded: list[int] = []
    decode = table._core.decode_pages

    def counting_decode(block: int, pages: range, data: bytes, offset: int) -> Page:
        decoded.extend(pages)
        return decode(block, pages, data, offset)

    table._core.decode_pages = counting_decode  # type: ignore[method-assign]
    start, end = index.block_starts[1], index.block_starts[2]
    assert end - start >= 4
    # Reading the first three pages of block 1: the third read reads ahead.
    for p in (start, start + 1, start + 2):
        assert await table.get_row(index.first_rows[p]) == [
            c for c in cells if c.row == index.first_rows[p]
        ]
    store.reset()
    assert decoded == [start, start + 1, start + 2]
    # The rest of the block came with that GET, undecoded until read.
    for p in range(start + 3, end):
        row = index.first_rows[p]
        assert await table.get_row(row) == [c for c in cells if c.row == row]
    assert store.stats()[Op.GET_RANGE].requests == 0
    assert decoded == list(range(start, end))


@pytest.mark.parametrize("seq_base", [0, 1000])
async def test_read_ahead_stops_at_a_cached_page_of_an_adopted_sstable(seq_base: int) -> None:
    """Read-ahead stops at a page already in the block cache (here the block's last), also
    for an SSTable opened with a ``seq_base`` (a bulk-loaded file), whose pages are cached
    under another name."""
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(2000)]
    data, info = write_sstable(cells, block_size=32 * 1024)
    store = InstrumentedObjectStore(MemoryObjectStore(shared=False))
    await store.create(KEY, data)
    table = await SSTable.open(
        store, KEY, size=info.size, block_cache=BlockCache(1 << 24), seq_base=seq_base
    )
    index = table._core.pages
    assert index is not None
    start, end = index.block_starts[1], index.block_starts[2]
    assert end - start >= 5
    fetched: list[int] = []
    fetch = table._fetch_pages

    async def recording_fetch(block: int, pages: range, wanted_stop: int) -> dict[int, Page]:
        fetched.extend(pages)
        return await fetch(block, pages, wanted_stop)

    table._fetch_pages = recording_fetch  # type: ignore[method-assign]
    cached = start + 4
    # A random read caches a page in the middle of the block, then a sequential reader
    # starts at the block's first page: its read-ahead stops before the cached page.
    for p in (cached, start, start + 1, start + 2):
        got = await table.get_row(index.first_rows[p])
        assert [c.seq for c in got] == [
            c.seq + seq_base for c in cells if c.row == index.first_rows[p]
        ]
    assert fetched == [cached, start, start + 1, start + 2, start + 3]
    assert sorted(fetched) == sorted(set(fetched)), "a cached page was fetched again"


async def test_read_ahead_reads_over_a_lone_cached_page() -> None:
    """A sequential reader's read-ahead does not stop at one cached page in its way (another
    reader's first page): one GET to the block's end, the cached page kept as it
    is. Two cached pages in a row stop it."""
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(4000)]
    data, info = write_sstable(cells)
    store = InstrumentedObjectStore(MemoryObjectStore(shared=False))
    await store.create(KEY, data)
    cache = BlockCache(1 << 24)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=cache)
    index = table._core.pages
    assert index is not None
    fetched: list[range] = []
    fetch = table._fetch_pages

    async def recording_fetch(block: int, pages: range, wanted_stop: int) -> dict[int, Page]:
        fetched.append(pages)
        return await fetch(block, pages, wanted_stop)

    table._fetch_pages = recording_fetch  # type: ignore[method-assign]
    rows = sorted({c.row for c in cells})

    async def read_block(block: int) -> None:
        start, end = index.block_starts[block], index.block_starts[block + 1]
        for row in rows[rows.index(index.first_rows[start]) : rows.index(index.first_rows[end])]:
            assert await table.get_row(row) == [c for c in cells if c.row == row]

    start, end = index.block_starts[1], index.block_starts[2]
    assert end - start >= 6
    lone = start + 3
    await table.get_row(index.first_rows[lone])
    kept = cache.get_page(table._cache_key, lone)
    fetched.clear()
    await read_block(1)
    # The block's first page alone (nothing says its reader is sequential), then the rest
    # of the block, over the lone cached page.
    assert fetched == [range(start, start + 1), range(start + 1, end)]
    assert cache.get_page(table._cache_key, lone) is kept

    start, end = index.block_starts[3], index.block_starts[4]
    for p in (start + 3, start + 4):
        await table.get_row(index.first_rows[p])
    fetched.clear()
    await read_block(3)
    assert fetched == [range(start, start + 1), range(start + 1, start + 3), range(start + 5, end)]


@pytest.mark.parametrize("seed", range(4))
async def test_mixed_readers_over_a_small_cache_read_the_cells_written(seed: int) -> None:
    """Sequential and random readers interleaved over a block cache too small for the table:
    pages read ahead over lone cached ones, cached pages evicted while a fetch is in flight,
    every read still returns exactly the row's cells."""
    rng = random.Random(seed)
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, rng.randbytes(200)) for i in range(3000)]
    data, info = write_sstable(cells, block_size=32 * 1024)
    store = MemoryObjectStore(shared=False)
    await store.create(KEY, data)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=BlockCache(96 * 1024))
    fetch = table._fetch_pages

    async def interleaving_fetch(block: int, pages: range, wanted_stop: int) -> dict[int, Page]:
        for _ in range(rng.randrange(4)):
            await asyncio.sleep(0)
        return await fetch(block, pages, wanted_stop)

    table._fetch_pages = interleaving_fetch  # type: ignore[method-assign]
    by_row = {c.row: [c] for c in cells}

    async def sequential(start: int, n: int) -> None:
        for i in range(start, min(len(cells), start + n)):
            assert await table.get_row(cells[i].row) == by_row[cells[i].row]

    async def scattered(n: int) -> None:
        for _ in range(n):
            row = cells[rng.randrange(len(cells))].row
            assert await table.get_row(row) == by_row[row]

    await asyncio.gather(
        *(sequential(rng.randrange(len(cells)), rng.randrange(50, 400)) for _ in range(12)),
        *(scattered(100) for _ in range(4)),
    )


async def test_a_damaged_page_read_ahead_fails_the_read_that_reaches_it() -> None:
    """A page read ahead is checked when decoded: its reader gets Corruption, never cells."""
    cells = [Cell(b"r%06d" % i, "cf", b"q", 1, i + 1, 0, os.urandom(200)) for i in range(2000)]
    data, info = write_sstable(cells, block_size=16 * 1024)
    probe = await SSTable.open(await _store_with(data), KEY, size=info.size)
    index = probe._core.pages
    assert index is not None
    start, end = index.block_starts[1], index.block_starts[2]
    victim = end - 1
    # Flip a byte of the victim page's value column (column 6: offset, compressed, size).
    entry = index.table[victim].tolist()
    at = probe.footer.blocks[1].offset + entry[1 + 3 * 6] + entry[2 + 3 * 6] // 2
    damaged = bytearray(data)
    damaged[at] ^= 0xFF
    table = await SSTable.open(
        await _store_with(bytes(damaged)), KEY, size=info.size, block_cache=BlockCache(1 << 24)
    )
    for p in (start, start + 1):
        assert await table.get_row(index.first_rows[p]) != []
    with pytest.raises(Corruption):
        await table.get_row(index.first_rows[victim])


async def _store_with(data: bytes) -> MemoryObjectStore:
    store = MemoryObjectStore(shared=False)
    await store.create(KEY, data)
    return store


@pytest.mark.parametrize("value_size", [0, 10, 1000])
def test_a_decoded_page_makes_the_same_cells_read_one_row_or_all(value_size: int) -> None:
    """A page decodes to columns and makes cells when read: a row's cells, every cell, and a
    row read again after that are the cells written (a page of few large values walks its
    byte arrays, of many small ones checks their lengths at once)."""
    rng = random.Random(5)
    cells = sorted(
        (
            Cell(
                b"r%05d" % (i // 2), "cf", b"q%d" % (i % 2), 7, i + 1, 0, rng.randbytes(value_size)
            )
            for i in range(600)
        ),
        key=cell_sort_key,
    )
    data, _ = write_sstable(cells, block_size=16 * 1024)
    core = SSTableCore.from_tail("t", len(data), data)
    index = core.pages
    assert index is not None
    for p in (0, index.block_starts[1] - 1, index.pages - 1):
        block = int(index.table[p, 0])
        offset, length = core.page_range(block, range(p, p + 1))
        page = core.decode_pages(block, range(p, p + 1), data[offset : offset + length], offset)
        first = sum(index.block_cells[:block]) + (p - index.block_starts[block]) * index.page_cells
        want = cells[first : first + page.cells]
        row = want[-1].row
        assert page.row_cells(row) == [c for c in want if c.row == row]
        assert page.cells_in() == want
        assert page.row_cells(row) == [c for c in want if c.row == row]
        assert page.row_cells(b"r99999") == []


@pytest.mark.parametrize("uniform", [True, False])
def test_a_decoded_page_holds_nothing_the_gc_tracks(uniform: bool) -> None:
    """Every full collection of the cyclic GC traverses every cached page and what it holds
    that the GC tracks. A page's columns are tuples of bytes, str and int (untracked once
    collected), values of one length stay in a ``bytes`` buffer, and reading the page (a row,
    every cell) keeps no cells: a single page and a whole block alike."""
    cells = [
        Cell(b"r%05d" % i, "cf", b"q", 7, i + 1, 0, b"v%04d" % i if uniform else b"v" * (i % 7))
        for i in range(600)
    ]
    data, _ = write_sstable(cells, block_size=16 * 1024)
    core = SSTableCore.from_tail("t", len(data), data)
    index = core.pages
    assert index is not None and index.block_starts[1] > 1
    for pages in (range(0, 1), range(0, index.block_starts[1])):
        offset, length = core.page_range(0, pages)
        page = core.decode_pages(0, pages, data[offset : offset + length], offset)
        assert page.row_cells(page.first_row) == cells[:1]
        assert page.cells_in() == cells[: page.cells]
        gc.collect()
        gc.collect()  # a tuple of tuples is untracked once those inside it are
        held = [o for o in gc.get_referents(page) if o is not type(page)]
        assert [type(o) for o in held if gc.is_tracked(o)] == []
        assert page.cells_in(b"r00001", b"r00003") == cells[1:3]


def _plain(values: list[bytes]) -> bytes:
    return b"".join(len(v).to_bytes(4, "little") + v for v in values)


@pytest.mark.parametrize(
    "values",
    [
        [b"abc", b"d", b"efghi"],  # first length x count = size, yet not one length
        [b"abc", b"abc", b"abc"],
        [b"k%05d" % i for i in range(7)],
        [b""] * 5,
        [b"x" * 1000],
        [b"v%04d" % i for i in range(300)],  # past the one-struct-call bound
        [b"v%04d" % i for i in range(299)] + [b"v12345"],
        [bytes([i % 256]) * (i % 7) for i in range(40)],
    ],
)
def test_plain_byte_arrays_decode_by_every_path(values: list[bytes]) -> None:
    """The page decoder's readers of PLAIN byte arrays (one struct call for values of one
    length, strided checks past 256 values, a walk otherwise; the value column left in its
    buffer) read what was written, and refuse bytes that do not hold exactly ``n`` values."""
    buf = _plain(values)
    n = len(values)
    assert pages_module._binary(buf, n) == tuple(values)
    lazy = pages_module._values(buf, n)
    assert len(lazy) == n and list(lazy) == values
    assert [lazy[i] for i in range(n)] == values and lazy[-1] == values[-1]
    assert list(lazy[1:3]) == values[1:3]
    with pytest.raises(IndexError):
        lazy[n]
    with pytest.raises(ValueError):
        pages_module._binary(buf + b"\x00", n)
    with pytest.raises((ValueError, struct.error)):
        pages_module._values(buf[:-1], n)


def test_uniform_values_stay_in_their_page_buffer_until_read() -> None:
    buf = _plain([b"%03d" % i * 250 for i in range(8)])
    lazy = pages_module._values(buf, 8)
    assert type(lazy).__name__ == "_Fixed"
    assert lazy[3] == b"003" * 250 and lazy[-8] == b"000" * 250


async def test_uniform_values_read_back_by_point_reads_scans_and_arrow() -> None:
    # Values of one length stay in their page's bytes (pages._Fixed): a block decoded for a
    # scan merges such pages, a point read slices one value, a batch read goes through Arrow.
    rng = random.Random(3)
    cells = [
        Cell(b"k%06d" % i, "cf", b"q", 1_000 + i, i + 1, 0, rng.randbytes(1000)) for i in range(200)
    ]
    data, info = write_sstable(cells, block_size=32 * 1024)
    store = MemoryObjectStore()
    await store.create(KEY, data)
    table = await SSTable.open(store, KEY, size=info.size, block_cache=BlockCache(1 << 20))
    assert [c async for c in table.scan()] == cells
    for c in cells[::17]:
        assert await table.get_row(c.row) == [c]
    assert read_sstable_bytes(data) == cells
    arrow = await table.read_arrow()
    assert arrow.column("value").to_pylist() == [c.value for c in cells]
