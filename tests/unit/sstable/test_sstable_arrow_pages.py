"""Format-2 block ranges decoded by the page index (``pages.decode_blocks_arrow``, batch
reads, §8) equal pyarrow's decode of the same blocks, and damage is Corruption."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from tabletstore.errors import Corruption
from tabletstore.keys import Cell, CellKind, cell_sort_key
from tabletstore.sstable import SSTableCore, write_sstable
from tabletstore.sstable.block import RowGroupDecoder
from tabletstore.sstable.format import SCHEMA, parse_tail


def _cells(n: int, seed: int) -> list[Cell]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        row = b"r%06d" % (i // 3) + bytes(rng.randrange(256) for _ in range(rng.randrange(3)))
        value = bytes(rng.randrange(256) for _ in range(rng.choice([0, 1, 5, 40, 300])))
        kind = rng.choice([CellKind.PUT, CellKind.PUT, CellKind.DELETE_FAMILY])
        out.append(Cell(row, rng.choice(["a", "bé"]), b"q%d" % (i % 4), i, 10 + i, kind, value))
    return sorted(set(out), key=cell_sort_key)


@pytest.mark.parametrize("compression", ["zstd", "lz4", "none"])
@pytest.mark.parametrize("seed", [1, 2])
def test_page_index_decode_equals_pyarrows(compression: str, seed: int) -> None:
    data, _ = write_sstable(_cells(3000, seed), compression=compression, block_size=4096)
    core = SSTableCore.from_tail("t", len(data), data)
    assert core.pages is not None
    # A zstd SSTable's reader keeps no pyarrow decoder (its Parquet footer is dropped at
    # open); the others keep one for batch reads. pyarrow's decode, for comparison:
    assert (core._decoder is None) == (compression == "zstd")
    pyarrows = RowGroupDecoder(parse_tail(data, len(data)).parquet, len(data))
    n = len(core.blocks)
    for first, last in [(0, n - 1), (1, n - 2), (n // 2, n // 2)]:
        start = core.blocks[first].offset
        end = core.blocks[last].offset + core.blocks[last].length
        for columns in (None, ["row", "family", "qualifier", "ts", "value"], ["row", "seq"]):
            got = core.decode_range(first, last, data[start:end], columns)
            want = pyarrows.decode_range(
                list(range(first, last + 1)), start, data[start:end], columns
            )
            assert got.schema.equals(
                SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
            )
            assert got.combine_chunks().equals(want.combine_chunks())


def test_a_damaged_page_is_corruption() -> None:
    data, _ = write_sstable(_cells(2000, 3), compression="zstd", block_size=4096)
    core = SSTableCore.from_tail("t", len(data), data)
    b = core.blocks[1]
    blob = bytearray(data[b.offset : b.offset + b.length])
    blob[len(blob) // 2] ^= 0x55
    with pytest.raises(Corruption):
        core.decode_range(1, 1, bytes(blob))
