"""Damaged SSTables are Corruption, never wrong data (docs/architecture/design.md §3, §9).

Corrupted objects are created through the ObjectStore interface (objects are immutable, so a
"damaged" SSTable is a new object holding the bad bytes).
"""

from __future__ import annotations

import pytest

from tabletstore.errors import Corruption, TabletStoreError
from tabletstore.keys import Cell, CellKind
from tabletstore.sstable import SSTable, SSTableCore, read_sstable_bytes, write_sstable
from tabletstore.sstable.format import parse_tail
from tabletstore.storage_s3.base import ObjectStore


def make_cells(n: int) -> list[Cell]:
    return [
        Cell(b"row%05d" % (i // 2), "cf", b"q%d" % (i % 2), 77, i + 1, CellKind.PUT, b"v%05d" % i)
        for i in range(n)
    ]


def flip(data: bytes, pos: int, mask: int = 0x01) -> bytes:
    return data[:pos] + bytes([data[pos] ^ mask]) + data[pos + 1 :]


async def test_a_corrupted_block_is_corruption_on_point_read_and_scan(
    object_store: ObjectStore,
) -> None:
    cells = make_cells(2000)
    data, info = write_sstable(cells, block_size=4096)
    block = parse_tail(data, len(data)).footer.blocks[3]
    bad = flip(data, block.offset + block.length // 2)
    await object_store.create("bad.parquet", bad)
    table = await SSTable.open(object_store, "bad.parquet", size=info.size)

    row = block.first_row
    with pytest.raises(Corruption, match="block 3 fails its crc32c"):
        await table.get_row(row)
    # Rows in healthy blocks still read.
    assert await table.get_row(b"row00000") == cells[:2]
    got = []
    with pytest.raises(Corruption):
        async for c in table.scan():
            got.append(c)
    assert got == cells[: len(got)]  # what came before the bad block is right
    with pytest.raises(Corruption):
        await table.load_all()


@pytest.mark.parametrize("where", ["trailer", "footer", "length", "magic"])
async def test_a_corrupted_footer_is_corruption_on_open(
    object_store: ObjectStore, where: str
) -> None:
    data, info = write_sstable(make_cells(500), block_size=4096)
    tail_start = info.size - info.tail_size
    pos = {
        "trailer": tail_start + 10,
        "footer": tail_start + 16 + (info.tail_size - 24) // 2,
        "length": info.size - 6,
        "magic": info.size - 1,
    }[where]
    await object_store.create("bad.parquet", flip(data, pos))
    with pytest.raises(Corruption):
        await SSTable.open(object_store, "bad.parquet", size=info.size)


def test_every_single_byte_flip_in_the_tail_is_detected() -> None:
    data, info = write_sstable(make_cells(300), block_size=2048)
    for pos in range(info.size - info.tail_size, info.size):
        with pytest.raises(Corruption):
            SSTableCore.from_tail("t", info.size, flip(data, pos, 0x10))


def test_no_single_byte_flip_anywhere_returns_wrong_cells() -> None:
    cells = make_cells(200)
    data, _ = write_sstable(cells, block_size=1024, compression="none")
    for pos in range(0, len(data), 7):
        try:
            got = read_sstable_bytes(flip(data, pos, 0x04))
        except Corruption:
            continue
        # Only Parquet's leading magic is outside every checksum, and no reader looks at it.
        assert got == cells, pos
        assert pos < 4


@pytest.mark.parametrize("cut", [1, 8, 100, 2000])
def test_truncated_objects_are_corruption(cut: int) -> None:
    data, _ = write_sstable(make_cells(300), block_size=2048)
    with pytest.raises(Corruption):
        read_sstable_bytes(data[:-cut])
    with pytest.raises(Corruption):
        read_sstable_bytes(data[cut:])


async def test_an_object_shorter_than_its_recorded_size_is_corruption(
    object_store: ObjectStore,
) -> None:
    data, info = write_sstable(make_cells(300), block_size=2048)
    await object_store.create("short.parquet", data[:-100])
    with pytest.raises(Corruption):
        await SSTable.open(object_store, "short.parquet", size=info.size)


@pytest.mark.parametrize(
    "data",
    [b"", b"PAR1", b"hello world, not parquet" * 10, b"PAR1" + bytes(100) + b"PAR1"],
)
def test_garbage_is_corruption(data: bytes) -> None:
    with pytest.raises(Corruption):
        read_sstable_bytes(data)


def test_plain_parquet_without_tabletstore_footer_is_corruption() -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    buf = io.BytesIO()
    pq.write_table(pa.table({"row": [b"a"], "value": [b"b"]}), buf)
    with pytest.raises(Corruption, match="magic"):
        read_sstable_bytes(buf.getvalue())


def test_errors_are_tabletstore_errors_not_pyarrow() -> None:
    data, _ = write_sstable(make_cells(100), block_size=1024)
    for pos in range(0, len(data), 3):
        try:
            read_sstable_bytes(flip(data, pos, 0xFF))
        except TabletStoreError:
            pass
