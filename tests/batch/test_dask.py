"""Dask: a DataFrame over a snapshot's splits, computed on a
``distributed.LocalCluster`` with 2 worker processes, equals the client's read_rows; and a
Dask job's output bulk-loads."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
from distributed import Client, LocalCluster

from tabletstore.batch.engines import dask_dataframe, dask_write_sstables
from tabletstore.embedded import Database
from tests.batch.conftest import cells_of, fill


@pytest.fixture(scope="module")
def dask_client() -> Iterator[Client]:
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


async def test_dask_dataframe_equals_the_client(tmp_path: Path, dask_client: Client) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await fill(db)
        t = db.table("web")
        snap = await t.snapshot()
        expected = cells_of([r async for r in t.read_rows()])

        def compute() -> list[dict[str, object]]:
            df = dask_dataframe(db.store.url, snap.snapshot_id, max_split_bytes=2048)
            assert df.npartitions > 3  # finer than one per tablet
            out = df.compute()
            return [
                {
                    k: (bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else v)
                    for k, v in rec.items()
                }
                for rec in out.to_dict("records")
            ]

        got = await asyncio.to_thread(compute)
        assert got == expected

        def anchors() -> dict[bytes, int]:
            df = dask_dataframe(db.store.url, snap.snapshot_id, columns=["anchor"])
            return {bytes(k): int(v) for k, v in df.groupby("qualifier").size().compute().items()}

        per_site = await asyncio.to_thread(anchors)
        want: dict[bytes, int] = {}
        for c in expected:
            if c["family"] == "anchor":
                q = c["qualifier"]
                assert isinstance(q, bytes)
                want[q] = want.get(q, 0) + 1
        assert per_site == want

        # The output side: a Dask DataFrame (range-partitioned by row) written as SSTables
        # by the Dask workers, then bulk-loaded.
        import dask.dataframe as dd

        rows = [b"new%03d" % i for i in range(40)]
        pdf = pd.DataFrame(
            {
                "row": rows,
                "family": "anchor",
                "qualifier": b"dask.org",
                "value": [b"v" + r for r in rows],
                "timestamp": 9000,
            }
        )
        ddf = dd.from_pandas(pdf, npartitions=2, sort=False)
        out = await db.staging_url("out")
        keys = await asyncio.to_thread(dask_write_sstables, ddf, out)
        assert len(keys) == 2
        assert await db.bulk_load("web", out) == (1, 40)
        row = await t.read_row(b"new007")
        assert row is not None and row.cells[0].value == b"vnew007"
    finally:
        await db.close()
