"""Apache Spark: ``spark.read.format("tabletstore")`` in local mode, one
Spark partition per split, equals the client's read_rows. One SparkSession per module."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from tabletstore import connect_async
from tabletstore.batch.spark import register
from tabletstore.embedded import Database
from tests.batch.conftest import cells_of, fill
from tests.integration.cluster_harness import Cluster


@pytest.fixture(scope="module")
def spark() -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tabletstore-batch-test")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    register(session)
    try:
        yield session
    finally:
        session.stop()


async def test_spark_reads_a_snapshot_like_the_client(tmp_path: Path, spark: SparkSession) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await fill(db)
        t = db.table("web")
        snap = await t.snapshot()
        expected = cells_of([r async for r in t.read_rows()])
        store = db.store.url

        def read() -> tuple[int, list[dict[str, object]], list[tuple[bytes, int]]]:
            df = (
                spark.read.format("tabletstore")
                .option("store", store)
                .option("snapshot", snap.snapshot_id)
                .option("max_split_bytes", "2048")
                .load()
            )
            parts = df.rdd.getNumPartitions()
            rows = [r.asDict() for r in df.collect()]
            sites = df.where("family = 'anchor'").groupBy("qualifier").count().orderBy("qualifier")
            return parts, rows, [(bytes(r[0]), int(r[1])) for r in sites.collect()]

        parts, rows, sites = await asyncio.to_thread(read)
        assert parts > len(snap.tablets)
        got = [
            {k: (bytes(v) if isinstance(v, bytearray) else v) for k, v in r.items()} for r in rows
        ]
        assert got == expected
        want: dict[bytes, int] = {}
        for c in expected:
            if c["family"] == "anchor":
                q = c["qualifier"]
                assert isinstance(q, bytes)
                want[q] = want.get(q, 0) + 1
        assert sites == sorted(want.items())

        def wide() -> list[tuple[bytes, bytes | None]]:
            df = (
                spark.read.format("tabletstore")
                .option("store", store)
                .option("snapshot", snap.snapshot_id)
                .option("shape", "wide")
                .option("columns", "meta:len")
                .option("start_row", "row010")
                .option("end_row", "row020")
                .load()
            )
            return [(bytes(r[0]), None if r[1] is None else bytes(r[1])) for r in df.collect()]

        want_wide = [
            (r.key, r.cells[0].value)
            async for r in t.read_rows(start=b"row010", end=b"row020", families=["meta"])
        ]
        assert await asyncio.to_thread(wide) == want_wide
    finally:
        await db.close()


def test_spark_writes_small_outputs_through_the_client(
    spark: SparkSession, cluster: Cluster
) -> None:
    """``df.write.format("tabletstore")``: each Spark task writes its rows with the client's
    batched mutations."""
    asyncio.run(_create(cluster.url))
    rows = [(b"s%03d" % i, "f", b"q", b"v%03d" % i) for i in range(25)]
    df = spark.createDataFrame(rows, "row binary, family string, qualifier binary, value binary")
    df.repartition(2).write.format("tabletstore").option("cluster", cluster.url).option(
        "table", "sparkout"
    ).mode("append").save()
    got = asyncio.run(_read(cluster.url))
    assert got == [(r, v) for r, _, _, v in rows]


async def _create(url: str) -> None:
    client = await connect_async(url)
    try:
        await client.create_table("sparkout", ["f"])
    finally:
        await client.close()


async def _read(url: str) -> list[tuple[bytes, bytes]]:
    client = await connect_async(url)
    try:
        return [(r.key, r.cells[0].value) async for r in client.table("sparkout").read_rows()]
    finally:
        await client.close()
