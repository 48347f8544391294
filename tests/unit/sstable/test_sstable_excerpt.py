"""Excerpts: what a compaction of a row range reads of an SSTable that also holds other rows.

A split's children share their parent's SSTables until each has rewritten its half (§5.2).
:meth:`SSTable.excerpt` reads the blocks that can hold the range's rows and the tail, and
:func:`iter_sstable_bytes` must give from it exactly the cells it gives from the whole object.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tabletstore.errors import Corruption, InvalidArgument, NotFound
from tabletstore.keys import Cell, CellKind
from tabletstore.sstable import SSTable, SSTableExcerpt, iter_sstable_bytes, reader, write_sstable
from tabletstore.storage_s3.base import ObjectStore, Op
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore

KEY = "tables/t1/tablet1/default/sst1.parquet"
ROWS = 400


def cells(rows: int = ROWS) -> list[Cell]:
    """Three cells a row, some rows' cells spanning two blocks (1 KiB blocks)."""
    return [
        Cell(b"row%05d" % r, "cf", b"q%d" % q, 1_000_000 + q, r * 3 + q + 1, CellKind.PUT,
             b"v" * (50 + (r * 37 + q) % 300))
        for r in range(rows)
        for q in range(3)
    ]  # fmt: skip


async def stored(store: ObjectStore, rows: int = ROWS) -> tuple[SSTable, bytes]:
    data, info = write_sstable(cells(rows), block_size=1024)
    await store.create(KEY, data)
    table = await SSTable.open(store, KEY, size=info.size, tail_size=info.tail_size)
    return table, data


def row(i: int) -> bytes:
    return b"row%05d" % i


@pytest.fixture
def every_saving(monkeypatch: pytest.MonkeyPatch) -> None:
    """Excerpts however little they save (these SSTables are a few hundred KB)."""
    monkeypatch.setattr(reader, "EXCERPT_MIN_SAVING", 1)


bounds = st.one_of(st.none(), st.integers(min_value=-1, max_value=ROWS + 1))


@pytest.mark.usefixtures("every_saving")
@settings(max_examples=60, deadline=None)
@given(start=bounds, end=bounds)
def test_an_excerpt_reads_the_cells_of_its_range_as_the_whole_object(
    start: int | None, end: int | None
) -> None:
    start_row = b"" if start is None else row(start)
    end_row = None if end is None else row(end)

    async def run() -> None:
        table, data = await stored(MemoryObjectStore())
        part = await table.excerpt(start_row, end_row)
        whole = list(iter_sstable_bytes(data, start_row=start_row, end_row=end_row))
        got = list(iter_sstable_bytes(part, start_row=start_row, end_row=end_row))
        assert got == whole
        assert [
            c for c in cells() if start_row <= c.row and (end_row is None or c.row < end_row)
        ] == got
        if isinstance(part, SSTableExcerpt):
            assert part.nbytes < len(data)
        else:  # only when the range needs every block
            assert part == data
            assert table._core.blocks_between(start_row, end_row) == range(table.block_count)

    asyncio.run(run())


@pytest.mark.usefixtures("every_saving")
async def test_a_half_is_two_ranged_gets_of_about_half_the_object(
    object_store: ObjectStore,
) -> None:
    table, data = await stored(object_store)
    store = InstrumentedObjectStore(object_store)
    table.store = store
    left = await table.excerpt(b"", row(ROWS // 2))
    right = await table.excerpt(row(ROWS // 2), None)
    assert isinstance(left, SSTableExcerpt) and isinstance(right, SSTableExcerpt)
    stats = store.stats()
    assert stats.requests == stats[Op.GET_RANGE].requests == 4
    assert stats[Op.GET_RANGE].bytes == left.nbytes + right.nbytes
    # Each half reads its blocks (one block shared at the cut at most) and the tail.
    blocks = len(data) - table.tail_size - 4
    assert len(left.blocks) < 0.55 * blocks and len(right.blocks) < 0.55 * blocks
    assert left.tail == right.tail == data[-table.tail_size :]
    assert left.offset == 4  # the first block, after "PAR1"
    assert right.offset + len(right.blocks) + len(right.tail) == len(data)
    halves = [*iter_sstable_bytes(left, end_row=row(ROWS // 2)),
              *iter_sstable_bytes(right, start_row=row(ROWS // 2))]  # fmt: skip
    assert halves == cells()


async def test_an_excerpt_saving_less_than_the_bound_is_the_whole_object() -> None:
    table, data = await stored(MemoryObjectStore())
    assert len(data) < reader.EXCERPT_MIN_SAVING
    assert await table.excerpt(b"", row(10)) == data


@pytest.mark.usefixtures("every_saving")
async def test_rows_beyond_an_excerpt_are_corruption_not_silence() -> None:
    table, _ = await stored(MemoryObjectStore())
    part = await table.excerpt(b"", row(100))
    assert isinstance(part, SSTableExcerpt)
    with pytest.raises(Corruption, match="not in the"):
        list(iter_sstable_bytes(part, end_row=row(200)))
    with pytest.raises(Corruption, match="not in the"):
        list(iter_sstable_bytes(part))


@pytest.mark.usefixtures("every_saving")
async def test_a_range_with_no_blocks_reads_only_the_tail() -> None:
    table, data = await stored(MemoryObjectStore())
    part = await table.excerpt(b"zzz", None)
    assert isinstance(part, SSTableExcerpt)
    assert part.blocks == b"" and part.tail == data[len(data) - table.tail_size :]
    assert list(iter_sstable_bytes(part, start_row=b"zzz")) == []


@pytest.mark.usefixtures("every_saving")
async def test_an_excerpt_of_a_deleted_object_is_not_found() -> None:
    store = MemoryObjectStore()
    table, _ = await stored(store)
    await store.delete(KEY)
    with pytest.raises(NotFound):
        await table.excerpt(b"", row(10))


def test_an_excerpt_must_fit_its_object() -> None:
    with pytest.raises(InvalidArgument, match="do not fit"):
        SSTableExcerpt(b"x" * 10, 95, b"t" * 5, 100)
