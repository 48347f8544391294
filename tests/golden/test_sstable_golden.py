"""Golden test pinning the SSTable format (format.py's docstring is the specification).

Two pins per format version (1: before pages; 2: the pages of ``pages.py``, the default):

1. ``data/sstable_v<N>.parquet`` — a committed SSTable written by this code. It must keep
   opening, its footer must decode to exactly ``data/sstable_v<N>.expected.json`` (block and
   page byte ranges and checksums included) and it must read back to :func:`golden_cells`,
   through point reads and scans. Old versions stay readable: their files are never
   regenerated.
2. A fresh write of the same cells with the same settings (and that format version) must
   produce the same footer facts (everything but byte offsets, lengths and checksums, which
   depend on the Parquet encoder's version, and the trailer/footer size, which carries its
   ``created_by`` string).

A deliberate format change bumps FORMAT_VERSION and writes the new version's two files::

    python tests/golden/test_sstable_golden.py --regenerate
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tabletstore.keys import TS_MAX, Cell, CellKind, cell_sort_key, encode_ts_range
from tabletstore.sstable import SSTable, read_sstable_bytes, write_sstable
from tabletstore.sstable.format import FORMAT_VERSION, READABLE_VERSIONS, Footer, parse_tail
from tabletstore.storage_s3.base import ObjectStore

DATA = Path(__file__).parent / "data"
VERSIONS = pytest.mark.parametrize("version", READABLE_VERSIONS)


def golden(version: int) -> Path:
    return DATA / f"sstable_v{version}.parquet"


def expected_file(version: int) -> Path:
    return DATA / f"sstable_v{version}.expected.json"


SETTINGS: dict[str, Any] = {
    "compression": "zstd",
    "block_size": 1024,
    "locality_group": "golden",
    "bloom_bits_per_key": 10,
    "column_bloom": True,
}


def settings(version: int) -> dict[str, Any]:
    """The writer settings of a version's golden file (format 2: pages of ~256 raw bytes, so
    blocks hold several)."""
    return SETTINGS | {"format_version": version} | ({"page_size": 256} if version >= 2 else {})


def golden_cells() -> list[Cell]:
    """A fixed input: puts, every deletion kind, empty values, binary rows, a row spanning
    several blocks, two families."""
    cells = [
        Cell(b"", "cf", b"", 5, 1, CellKind.PUT, b"empty row key"),
        Cell(b"\x00\xff", "cf", b"\x00", 7, 2, CellKind.PUT, b""),
        Cell(b"del", "", b"", TS_MAX, 40, CellKind.DELETE_ROW, b""),
        Cell(b"del", "cf", b"", TS_MAX, 41, CellKind.DELETE_FAMILY, b""),
        Cell(b"del", "cf", b"q", TS_MAX, 42, CellKind.DELETE_COLUMN, encode_ts_range(3, 9)),
        Cell(b"del", "cf", b"q", 8, 43, CellKind.PUT, b"after"),
    ]
    cells += [
        Cell(b"span", "wide", b"col", 1000 - i, 100 + i, CellKind.PUT, b"%0200d" % i)
        for i in range(20)
    ]
    cells += [
        Cell(
            b"user%03d" % r,
            fam,
            b"q%d" % q,
            1_700_000_000_000_000 + r,
            200 + 4 * r + q,
            0,
            b"x" * r,
        )
        for r in range(12)
        for fam in ("cf", "meta")
        for q in range(2)
    ]
    return sorted(cells, key=cell_sort_key)


def _hex(b: bytes) -> str:
    return b.hex()


def footer_facts(footer: Footer, *, bytes_level: bool) -> dict[str, Any]:
    """The footer as JSON-able values; ``bytes_level`` adds byte ranges and checksums."""
    facts: dict[str, Any] = {
        "format_version": footer.format_version,
        "locality_group": footer.locality_group,
        "compression": footer.compression,
        "block_size": footer.block_size,
        "cells": footer.cells,
        "rows": footer.rows,
        "kind_counts": list(footer.kind_counts),
        "seq_range": [footer.min_seq, footer.max_seq],
        "first_row": _hex(footer.first_row),
        "last_row": _hex(footer.last_row),
        "blocks": [
            {"cells": b.cells, "first_row": _hex(b.first_row), "last_row": _hex(b.last_row)}
            | ({"offset": b.offset, "length": b.length, "crc32c": b.crc32c} if bytes_level else {})
            for b in footer.blocks
        ],
        "row_bloom_sha256": hashlib.sha256(footer.row_bloom.to_bytes()).hexdigest(),
        "column_bloom_sha256": None
        if footer.column_bloom is None
        else hashlib.sha256(footer.column_bloom.to_bytes()).hexdigest(),
    }
    pages = footer.pages
    if pages is not None:
        facts["pages"] = {
            "page_cells": pages.page_cells,
            "first_rows": [_hex(r) for r in pages.first_rows],
            "blocks": [int(b) for b in pages.table[:, 0]],
            "flags": [int(f) for f in pages.table[:, -1]],
        } | (
            {"table_sha256": hashlib.sha256(pages.table.astype("<u4").tobytes()).hexdigest()}
            if bytes_level
            else {}
        )
    return facts


def golden_expected(data: bytes) -> dict[str, Any]:
    parsed = parse_tail(data, len(data))
    meta = parsed.parquet.metadata or {}
    return {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "tail_size": parsed.tail_size,
        "kv_keys": sorted(k.decode() for k in meta),
        "footer": footer_facts(parsed.footer, bytes_level=True),
    }


def regenerate() -> None:
    """Write the current format version's files (older versions' files are never rewritten)."""
    DATA.mkdir(parents=True, exist_ok=True)
    data, _ = write_sstable(golden_cells(), **settings(FORMAT_VERSION))
    golden(FORMAT_VERSION).write_bytes(data)
    expected_file(FORMAT_VERSION).write_text(
        json.dumps(golden_expected(data), indent=1, sort_keys=True) + "\n"
    )


@VERSIONS
def test_committed_golden_file_decodes_to_the_expected_footer(version: int) -> None:
    data = golden(version).read_bytes()
    expected = json.loads(expected_file(version).read_text())
    assert golden_expected(data) == expected
    assert expected["footer"]["format_version"] == version
    assert len(expected["footer"]["blocks"]) > 3
    assert any(
        b["first_row"] == b["last_row"] == b"span".hex() for b in expected["footer"]["blocks"]
    )
    if version >= 2:
        # Some block holds several pages, and the wide row continues across pages.
        pages = expected["footer"]["pages"]
        assert len(pages["blocks"]) > len(set(pages["blocks"]))
        assert 1 in pages["flags"]


@VERSIONS
def test_committed_golden_file_reads_back_to_the_cells(version: int) -> None:
    assert read_sstable_bytes(golden(version).read_bytes()) == golden_cells()


@VERSIONS
async def test_committed_golden_file_serves_reads_through_a_store(
    object_store: ObjectStore, version: int
) -> None:
    data = golden(version).read_bytes()
    await object_store.create("golden.parquet", data)
    table = await SSTable.open(object_store, "golden.parquet", size=len(data))
    cells = golden_cells()
    for row in sorted({c.row for c in cells}):
        assert await table.get_row(row) == [c for c in cells if c.row == row], row
    assert await table.get_row(b"absent") == []
    assert [c async for c in table.scan()] == cells


@VERSIONS
def test_golden_files_are_plain_parquet(version: int) -> None:
    """pyarrow and DuckDB read every version's cells with no tabletstore code."""
    import duckdb
    import pyarrow.parquet as pq

    path = golden(version)
    cells = golden_cells()
    table = pq.read_table(path)
    assert [tuple(r.values()) for r in table.to_pylist()] == [tuple(c) for c in cells]
    rows = duckdb.sql(
        f"SELECT row, family, qualifier, ts, seq, kind, value FROM read_parquet('{path}')"
    ).fetchall()
    assert rows == [tuple(c) for c in cells]


@VERSIONS
def test_a_fresh_write_produces_the_same_footer_facts(version: int) -> None:
    data, info = write_sstable(golden_cells(), **settings(version))
    expected = json.loads(expected_file(version).read_text())
    facts = footer_facts(parse_tail(data, len(data)).footer, bytes_level=False)
    want = dict(expected["footer"])
    want["blocks"] = [
        {k: v for k, v in b.items() if k in ("cells", "first_row", "last_row")}
        for b in want["blocks"]
    ]
    if "pages" in want:
        want["pages"] = {k: v for k, v in want["pages"].items() if k != "table_sha256"}
    assert facts == want
    assert info.blocks == len(want["blocks"])
    assert read_sstable_bytes(data) == golden_cells()


if __name__ == "__main__":
    if sys.argv[1:] == ["--regenerate"]:
        regenerate()
        print(f"wrote {golden(FORMAT_VERSION)} and {expected_file(FORMAT_VERSION)}")
    else:
        print(__doc__)
