"""SSTable bytes: write/read round trips, block layout, footer metadata, plain-Parquet compatibility.

Pure tests (no store): ``write_sstable`` -> bytes -> ``read_sstable_bytes`` / ``parse_tail``.
"""

from __future__ import annotations

import io
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tabletstore.errors import InvalidArgument
from tabletstore.keys import (
    AGGREGATE_KINDS,
    TS_MAX,
    Cell,
    CellKind,
    cell_sort_key,
    encode_ts_range,
)
from tabletstore.sstable import read_sstable_bytes, write_sstable
from tabletstore.sstable.format import (
    FORMAT_VERSION,
    SCHEMA,
    BlockHandle,
    cell_raw_size,
    decode_block_index,
    encode_block_index,
    parse_tail,
)


def make_cells(n: int, *, per_row: int = 3, value_size: int = 100, seq0: int = 1) -> list[Cell]:
    """``n`` puts over ``n // per_row`` rows, in sort order, with distinct seqs."""
    return [
        Cell(
            b"row%06d" % (i // per_row),
            "cf",
            b"q%03d" % (i % per_row),
            1_000_000 + i,
            seq0 + i,
            CellKind.PUT,
            (b"v%d-" % i).ljust(value_size, b"x"),
        )
        for i in range(n)
    ]


rows_st = st.binary(min_size=0, max_size=6)
cell_st = st.builds(
    lambda row, fam, qual, ts, seq, kind, value: Cell(
        row, fam, qual, TS_MAX if kind else ts, seq, int(kind), value
    ),
    rows_st,
    st.sampled_from(["a", "b", "cf", "é"]),
    st.binary(max_size=4),
    st.integers(0, TS_MAX - 1),
    st.integers(0, 2**40),
    st.sampled_from(list(CellKind)),
    st.one_of(st.just(b""), st.binary(max_size=40), st.binary(min_size=500, max_size=2500)),
)


def sorted_unique(cells: list[Cell]) -> list[Cell]:
    by_key = {cell_sort_key(c): c for c in cells}
    return [by_key[k] for k in sorted(by_key)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cells=st.lists(cell_st, max_size=60).map(sorted_unique),
    compression=st.sampled_from(["zstd", "lz4", "snappy", "none"]),
)
def test_round_trip_random_cells(cells: list[Cell], compression: str) -> None:
    data, info = write_sstable(cells, compression=compression, block_size=1024)
    assert read_sstable_bytes(data) == cells
    assert info.size == len(data)
    assert info.cells == len(cells)
    assert info.rows == len({c.row for c in cells})
    assert info.deletions == sum(
        1 for c in cells if c.kind != CellKind.PUT and c.kind not in AGGREGATE_KINDS
    )
    if cells:
        assert (info.first_row, info.last_row) == (cells[0].row, cells[-1].row)
        assert (info.min_seq, info.max_seq) == (
            min(c.seq for c in cells),
            max(c.seq for c in cells),
        )
    footer = parse_tail(data, len(data)).footer
    assert sum(b.cells for b in footer.blocks) == len(cells)
    assert all(footer.row_bloom.may_contain(c.row) for c in cells)


def test_rows_span_blocks_and_blocks_follow_the_target_size() -> None:
    # One row of 200 versions of 100-byte values: far more than one 4 KiB block.
    cells = [
        Cell(b"big", "cf", b"q", 10_000 - i, i + 1, CellKind.PUT, b"%099d" % i) for i in range(200)
    ]
    cells += make_cells(300, seq0=1000)
    cells.sort(key=cell_sort_key)
    data, info = write_sstable(cells, block_size=4096)
    footer = parse_tail(data, len(data)).footer
    assert info.blocks == len(footer.blocks) > 5
    spanning = [b for b in footer.blocks if b.first_row == b.last_row == b"big"]
    assert len(spanning) >= 3
    sizes = []
    start = 0
    for block in footer.blocks:
        chunk = cells[start : start + block.cells]
        assert (chunk[0].row, chunk[-1].row) == (block.first_row, block.last_row)
        sizes.append(sum(cell_raw_size(c.row, c.family, c.qualifier, c.value) for c in chunk))
        start += block.cells
    # Every block but the last reached the target, and exceeded it by less than one cell.
    assert all(4096 <= s < 4096 + 200 for s in sizes[:-1])
    assert read_sstable_bytes(data) == cells


def test_empty_values_and_deletion_entries_round_trip() -> None:
    cells = [
        Cell(b"r", "", b"", TS_MAX, 9, CellKind.DELETE_ROW, b""),
        Cell(b"r", "cf", b"", TS_MAX, 8, CellKind.DELETE_FAMILY, b""),
        Cell(b"r", "cf", b"q", TS_MAX, 7, CellKind.DELETE_COLUMN, encode_ts_range(0, 5)),
        Cell(b"r", "cf", b"q", 3, 2, CellKind.PUT, b""),
        Cell(b"r", "cf", b"q", 3, 1, CellKind.PUT, b"older seq"),
    ]
    data, info = write_sstable(cells)
    assert read_sstable_bytes(data) == cells
    assert info.deletions == 3
    assert parse_tail(data, len(data)).footer.kind_counts == (2, 1, 1, 1)


def test_empty_input_is_a_valid_sstable_with_no_blocks() -> None:
    data, info = write_sstable([])
    assert info.cells == info.blocks == info.rows == 0
    assert (info.first_row, info.last_row, info.min_seq, info.max_seq) == (b"", b"", 0, 0)
    assert read_sstable_bytes(data) == []
    assert pq.read_table(pa.BufferReader(data)).num_rows == 0


def test_equal_keys_are_kept_in_order() -> None:
    cell = Cell(b"r", "cf", b"q", 5, 5, CellKind.PUT, b"v")
    data, _ = write_sstable([cell, cell])
    assert read_sstable_bytes(data) == [cell, cell]


@pytest.mark.parametrize(
    "cells",
    [
        [Cell(b"b", "cf", b"q", 1, 1, 0, b""), Cell(b"a", "cf", b"q", 1, 1, 0, b"")],
        [Cell(b"a", "cf", b"q", 1, 1, 0, b""), Cell(b"a", "cf", b"q", 2, 1, 0, b"")],
        [Cell(b"a", "cf", b"q", 1, 1, 0, b""), Cell(b"a", "cf", b"q", 1, 2, 0, b"")],
        [Cell(b"a", "z", b"q", 1, 1, 0, b""), Cell(b"a", "b", b"q", 1, 1, 0, b"")],
        [Cell(b"\x80", "cf", b"", 1, 1, 0, b""), Cell(b"\x7f", "cf", b"", 1, 1, 0, b"")],
    ],
)
def test_unsorted_input_is_rejected(cells: list[Cell]) -> None:
    with pytest.raises(InvalidArgument, match="not sorted"):
        write_sstable(cells)


def test_unsorted_across_chunks_is_rejected() -> None:
    cells = make_cells(9000)
    cells.append(cells[0])
    with pytest.raises(InvalidArgument, match="not sorted"):
        write_sstable(cells)


@pytest.mark.parametrize(
    ("kwargs", "cells", "match"),
    [
        ({"compression": "gzip"}, [], "compression"),
        ({"block_size": 10}, [], "block_size"),
        ({"bloom_bits_per_key": 0}, [], "bloom_bits_per_key"),
        ({}, [Cell(b"a", "cf", b"", 1, 1, 8, b"")], "kind"),
        ({}, [Cell(b"a", "cf", b"", 2**63, 1, 0, b"")], "columns"),
        ({}, [Cell("a", "cf", b"", 1, 1, 0, b"")], "columns"),  # type: ignore[arg-type]
        ({}, [(b"a", "cf")], "Cell"),
    ],
)
def test_bad_input_names_the_problem(kwargs: dict, cells: list, match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        write_sstable(cells, **kwargs)


@pytest.mark.parametrize(
    ("compression", "codec"),
    [("zstd", "ZSTD"), ("lz4", "LZ4"), ("snappy", "SNAPPY"), ("none", "UNCOMPRESSED")],
)
def test_each_compression_is_a_parquet_codec(compression: str, codec: str) -> None:
    cells = make_cells(2000)
    data, info = write_sstable(cells, compression=compression, block_size=8192)
    assert info.compression == compression
    parsed = parse_tail(data, len(data))
    assert parsed.footer.compression == compression
    rg = parsed.parquet.row_group(0)
    assert {rg.column(i).compression for i in range(rg.num_columns)} == {codec}
    assert read_sstable_bytes(data) == cells


def test_opens_as_plain_parquet_in_pyarrow_and_duckdb(tmp_path: Path) -> None:
    cells = make_cells(3000)
    data, info = write_sstable(cells, block_size=8192, locality_group="lg1")
    path = tmp_path / "t.parquet"
    path.write_bytes(data)

    table = pq.read_table(path)
    assert table.schema == SCHEMA
    assert table.num_rows == len(cells)
    assert list(map(Cell, *(table.column(i).to_pylist() for i in range(7)))) == cells
    assert pq.ParquetFile(path).num_row_groups == info.blocks

    con = duckdb.connect()
    count, first, last, families, seqs = con.execute(
        "SELECT count(*), min(row), max(row), count(DISTINCT family), sum(seq) "
        "FROM read_parquet(?)",
        [str(path)],
    ).fetchone()
    assert (count, first, last, families) == (3000, cells[0].row, cells[-1].row, 1)
    assert seqs == sum(c.seq for c in cells)
    kv = dict(con.execute("SELECT key, value FROM parquet_kv_metadata(?)", [str(path)]).fetchall())
    assert kv[b"tabletstore.format_version"] == str(FORMAT_VERSION).encode()
    assert kv[b"tabletstore.locality_group"] == b"lg1"
    row = con.execute(
        "SELECT value FROM read_parquet(?) WHERE row = ? AND qualifier = ?",
        [str(path), b"row000500", b"q001"],
    ).fetchone()
    assert row == (cells[1501].value,)


def test_footer_metadata_entries() -> None:
    cells = make_cells(500)
    data, info = write_sstable(cells, block_size=4096, locality_group="g", column_bloom=True)
    parsed = parse_tail(data, len(data))
    meta = parsed.parquet.metadata
    assert meta is not None
    assert {k for k in meta if k.startswith(b"tabletstore.")} == {
        b"tabletstore." + k
        for k in (
            b"format_version",
            b"locality_group",
            b"compression",
            b"block_size",
            b"cells",
            b"rows",
            b"kind_counts",
            b"seq_range",
            b"first_row",
            b"last_row",
            b"block_index",
            b"row_bloom",
            b"column_bloom",
            b"pages",
        )
    }
    assert b"ARROW:schema" not in meta
    f = parsed.footer
    assert (f.cells, f.rows, f.block_size, f.locality_group) == (500, 167, 4096, "g")
    assert (f.min_seq, f.max_seq) == (1, 500)
    assert f.column_bloom is not None
    assert parsed.tail_size == info.tail_size
    core_keys = [(c.row, c.family, c.qualifier) for c in cells]
    from tabletstore.sstable.format import column_bloom_key

    assert all(f.column_bloom.may_contain(column_bloom_key(*k)) for k in core_keys)


def test_block_index_encoding_round_trips() -> None:
    blocks = (
        BlockHandle(4, 100, 3, 0xDEADBEEF, b"", b"a"),
        BlockHandle(104, 2**31, 2**31, 0, b"a", b"\x00" * 70_000),
    )
    assert decode_block_index(encode_block_index(blocks)) == blocks


def test_large_footer_round_trips() -> None:
    # 20,000 rows: a ~33 KB bloom filter, base64'd, and a 2,000-entry block index.
    cells = make_cells(20_000, per_row=1, value_size=10)
    data, info = write_sstable(cells, block_size=1024)
    assert info.tail_size > 64 * 1024
    assert read_sstable_bytes(data) == cells
    assert io.BytesIO(data).getbuffer().nbytes == info.size
