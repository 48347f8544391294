"""Scan progress and read statistics (``read_rows_with_stats``): the worker reports how far a
filtered scan got and what it saw; the client sums the counts over tablets and streams, and
resumes a broken forward scan after the last row *scanned*."""

from __future__ import annotations

from typing import Any

import pytest

from tabletstore import AsyncClient, RowKeyRegex, RowMutation, SetCell
from tabletstore.engine.scan_stats import REPORT_DROPPED_ROWS, ScanStats
from tabletstore.rpc.messages import ScanProgress
from tests.integration.api_support import db, db_url  # noqa: F401

ROWS = 3000


def key(i: int) -> bytes:
    return b"r%05d" % i


def test_scan_stats_reports_after_a_run_of_dropped_rows() -> None:
    stats = ScanStats(report_every=3)
    assert [stats.dropped() for _ in range(7)] == [False, False, True, False, False, True, False]
    stats.returned()
    assert [stats.dropped() for _ in range(3)] == [False, False, True]
    assert REPORT_DROPPED_ROWS >= 100


async def make_table(db: AsyncClient) -> object:  # noqa: F811
    table = await db.create_table("p", ["cf"], split_keys=[key(1000), key(2000)])
    await table.mutate_rows(
        [
            RowMutation(key(i), (SetCell("cf", b"a", b"x", 1000), SetCell("cf", b"b", b"y", 1000)))
            for i in range(ROWS)
        ]
    )
    return table


async def test_progress_and_totals_of_a_filtered_scan(db: AsyncClient) -> None:  # noqa: F811
    table = await make_table(db)
    # Only r00005 and r02995 pass: long runs of dropped rows in every tablet.
    items = [
        item async for item in table.read_rows_with_stats(filter=RowKeyRegex(rb"r0(0005|2995)"))
    ]
    rows = [i.key for i in items if not isinstance(i, ScanProgress)]
    assert rows == [key(5), key(2995)]
    progress = [i for i in items if isinstance(i, ScanProgress)]
    assert isinstance(items[-1], ScanProgress)
    assert (items[-1].rows_seen, items[-1].cells_seen) == (ROWS, 2 * ROWS)
    scanned = [p.last_scanned for p in progress if p.last_scanned]
    assert scanned == sorted(scanned) and len(scanned) >= 3
    # Some report comes between the two rows, from the middle of the dropped run.
    between = items[items.index(next(i for i in items if getattr(i, "key", None) == key(5))) :]
    assert any(isinstance(i, ScanProgress) and key(5) < i.last_scanned < key(2995) for i in between)
    counts = [p.rows_seen for p in progress]
    assert counts == sorted(counts)


async def test_totals_with_keys_limits_and_reverse(db: AsyncClient) -> None:  # noqa: F811
    table = await make_table(db)
    items = [i async for i in table.read_rows_with_stats(keys=[key(1), key(1500), b"none"])]
    assert [i.key for i in items if not isinstance(i, ScanProgress)] == [key(1), key(1500)]
    assert isinstance(items[-1], ScanProgress) and items[-1].rows_seen == 2
    items = [i async for i in table.read_rows_with_stats(reverse=True, limit=5)]
    rows = [i.key for i in items if not isinstance(i, ScanProgress)]
    assert rows == [key(i) for i in range(ROWS - 1, ROWS - 6, -1)]
    last = items[-1]
    assert isinstance(last, ScanProgress) and last.rows_seen >= 5 and last.last_scanned == b""
    # Plain read_rows has no progress items.
    plain = [r async for r in table.read_rows(limit=3)]
    assert len(plain) == 3 and not any(isinstance(r, ScanProgress) for r in plain)


async def test_a_broken_filtered_scan_resumes_after_the_last_row_scanned(
    db_url: str,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker's stream breaks right after a progress report: the retry starts after the
    reported key, not after the last row returned (which is far behind)."""
    import tabletstore
    from tabletstore.errors import Unavailable
    from tabletstore.worker.data_service import DataService

    original = DataService.read_rows
    requests: list[object] = []

    async def breaking(self: DataService, req: Any) -> Any:
        if req.filter is None:  # the catalog's reads
            async for item in original(self, req):
                yield item
            return
        requests.append(req)
        async for item in original(self, req):
            yield item
            if len(requests) == 1 and isinstance(item, ScanProgress) and item.last_scanned:
                raise Unavailable("injected: the stream broke")

    monkeypatch.setattr(DataService, "read_rows", breaking)
    client = await tabletstore.connect_async(db_url)  # its worker serves the patched method
    try:
        table: Any = await make_table(client)
        flt = RowKeyRegex(rb"r0(0005|2995)")
        items = [i async for i in table.read_rows_with_stats(filter=flt)]
    finally:
        await client.close()
    assert [i.key for i in items if not isinstance(i, ScanProgress)] == [key(5), key(2995)]
    retry: Any = requests[1]
    first_range = retry.ranges[0]
    assert first_range.start is not None and first_range.start > key(5)
