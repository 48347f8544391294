"""Reversed scans (``read_rows(reverse=True)``) through the public API: rows in descending key
order across tablets, over memtable and SSTable data with deletions, versions and small SSTable
blocks (many windows), every kind of row selection, limits and filters -- always exactly the
forward scan reversed. Plus the window planner on its own and ``tabletstore read reversed=true``.
"""

from __future__ import annotations

import random

import pytest

from tabletstore import (
    AsyncClient,
    CellsPerColumnLimit,
    ColumnFamily,
    LocalityGroup,
    RowKeyRegex,
    RowMutation,
    RowRange,
    RowSet,
    SetCell,
    ValueRegex,
)
from tabletstore.data.model import DeleteRow
from tabletstore.engine import read_path as read_path_module
from tabletstore.engine.reverse import next_window_start, sorted_block_starts
from tests.integration.api_support import db, db_url, rows_of  # noqa: F401

ROWS = 1200


def test_window_edges_come_from_blocks_and_memtables() -> None:
    blocks = sorted_block_starts([b"m", b"c", b"m", b"t"])
    assert blocks == [b"c", b"m", b"t"]
    assert next_window_start(None, b"", blocks, []) == b"t"
    assert next_window_start(b"t", b"", blocks, []) == b"m"
    assert next_window_start(b"c", b"", blocks, []) == b""
    assert next_window_start(b"t", b"n", blocks, []) == b"n"  # never below the scan's start

    def probe(upper: bytes | None, start: bytes) -> bytes | None:
        return b"p" if (upper is None or upper > b"p") and start < b"p" else None

    assert next_window_start(b"t", b"", blocks, [probe]) == b"p"
    assert next_window_start(b"p", b"", blocks, [probe]) == b"m"


def key(i: int) -> bytes:
    return b"row%05d" % i


async def make_table(db: AsyncClient) -> object:  # noqa: F811
    table = await db.create_table(
        "rev",
        [ColumnFamily(name="cf", locality_group="small"), ColumnFamily(name="other")],
        split_keys=[key(300), key(700), key(701)],
        locality_groups=[LocalityGroup(name="small", block_size=1024)],
    )
    rnd = random.Random(7)
    order = list(range(ROWS))
    rnd.shuffle(order)
    half = order[: ROWS // 2]
    await table.mutate_rows(
        [
            RowMutation(
                key(i),
                (SetCell("cf", b"q", b"v%d" % i, 1000), SetCell("cf", b"q", b"new%d" % i, 2000)),
            )
            for i in half
        ]
    )
    await table.mutate_rows([RowMutation(key(i), (DeleteRow(),)) for i in half[::7]])
    await db.flush("rev")  # SSTables of 1 KiB blocks: many windows
    await table.mutate_rows(
        [
            RowMutation(
                key(i), (SetCell("cf", b"q", b"v%d" % i, 1000), SetCell("other", b"o", b"x", 1000))
            )
            for i in order[ROWS // 2 :]
        ]
    )
    await table.mutate_rows([RowMutation(key(i), (DeleteRow(),)) for i in order[ROWS // 2 :: 11]])
    return table


async def test_reversed_is_the_forward_scan_reversed(
    db: AsyncClient,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Small memtable windows too, and count the windows: the scans must use many.
    monkeypatch.setattr(read_path_module, "MEMTABLE_WINDOW_ROWS", 16)
    windows: list[bytes] = []

    def counting(*args: object) -> bytes:
        edge = next_window_start(*args)  # type: ignore[arg-type]
        windows.append(edge)
        return edge

    monkeypatch.setattr(read_path_module, "next_window_start", counting)
    table = await make_table(db)
    selections: list[dict[str, object]] = [
        {},
        {"start": key(250), "end": key(800)},
        {"prefix": b"row006"},
        {"keys": [key(5), key(299), key(300), key(700), key(701), key(1199), b"nope"]},
        {
            "row_set": RowSet(
                keys=[key(3), key(650)],
                ranges=[
                    RowRange(key(100), key(350), start_inclusive=False, end_inclusive=True),
                    RowRange(key(690), key(720)),
                    RowRange(key(1100), None),
                ],
            )
        },
    ]
    filters = [None, CellsPerColumnLimit(1), RowKeyRegex(rb".*[37]"), ValueRegex(rb"new.*")]
    for sel in selections:
        for flt in filters:
            forward = await rows_of(table, filter=flt, **sel)  # type: ignore[arg-type]
            backward = await rows_of(table, filter=flt, reverse=True, **sel)  # type: ignore[arg-type]
            assert backward == forward[::-1], (sel, flt)
            assert len(forward) > 0 or "keys" in sel
            for limit in (1, 3, 57):
                got = await rows_of(table, filter=flt, reverse=True, limit=limit, **sel)  # type: ignore[arg-type]
                assert got == forward[::-1][:limit], (sel, flt, limit)
    everything = await rows_of(table, reverse=True)
    keys = [r.key for r in everything]
    assert keys == sorted(keys, reverse=True) and len(keys) > ROWS // 2
    windows.clear()
    await rows_of(table, reverse=True)
    assert len(windows) > 40


def test_tabletstore_read_reversed(tmp_path: object) -> None:
    import subprocess
    import sys

    import tabletstore

    url = f"file://{tmp_path}/db"
    client = tabletstore.connect(url)
    try:
        table = client.create_table("t", ["cf"])
        table.mutate_rows(
            [RowMutation(b"k%d" % i, (SetCell("cf", b"q", b"v", 1000),)) for i in range(5)]
        )
    finally:
        client.close()
    args = ["--url", url, "read", "t", "reversed=true", "count=3", "keys-only=true"]
    out = subprocess.run(
        [sys.executable, "-m", "tabletstore.cli.main", *args],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.split()
    assert out == ["k4", "k3", "k2"]
