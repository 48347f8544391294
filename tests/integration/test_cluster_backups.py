"""Backups, restores and clones on a cluster of real processes (etcd, moto's S3 server, a
master and workers as ``tabletstore`` processes), through ``connect_async("etcd://...")``.

* a backup equals the table as of its creation: written on after it, flushed and compacted,
  the restore still reads the state at the backup;
* a backup copied to another bucket restores into another cluster after the source cluster is
  stopped and every object of its bucket is deleted;
* a clone and its source diverge, and the clone survives its source's deletion.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tabletstore import connect_async
from tabletstore.data.model import DeleteRow
from tabletstore.errors import AlreadyExists
from tests.integration.cluster_harness import PROCESS_ENV, Cluster
from tests.integration.test_backups import _rows, _write
from tests.plugins.s3_server import boto3_client

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(autouse=True)
def _credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process reads and writes the buckets too (the client copies backups)."""
    for name, value in PROCESS_ENV.items():
        monkeypatch.setenv(name, value)


def _bucket(s3_server: str, name: str) -> str:
    boto3_client(s3_server).create_bucket(Bucket=name)
    return f"s3://{name}/data?endpoint_url={s3_server}&region=us-east-1"


def _cluster(etcd_server: str, s3_server: str, directory: Path, workers: int) -> Cluster:
    name = f"backups-{uuid.uuid4().hex[:12]}"
    cluster = Cluster(
        url=f"etcd://{etcd_server}/{name}",
        store_url=_bucket(s3_server, name),
        directory=directory,
        lease_ttl=5.0,
    )
    try:
        cluster.start_master()
        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(lambda _: cluster.start_worker(), range(workers)))
    except BaseException:
        cluster.close()
        raise
    return cluster


@pytest.fixture
def cluster(etcd_server: str, s3_server: str, tmp_path: Path) -> Iterator[Cluster]:
    c = _cluster(etcd_server, s3_server, tmp_path / "a", workers=2)
    try:
        yield c
    finally:
        c.close()


async def test_restore_equals_the_table_at_backup_time(cluster: Cluster) -> None:
    client = await connect_async(cluster.url)
    try:
        await client.create_table("t", ["f"], split_keys=[b"row0020"])
        await _write(client, "t", range(40), b"old")
        await client.flush("t")
        await _write(client, "t", range(10, 30), b"mid")
        await client.table("t").mutate_row(b"row0000", [DeleteRow()])
        expected = await _rows(client, "t")
        backup = await client.create_backup("t", "b1")
        await _write(client, "t", range(50), b"new")
        await client.compact("t")
        await client.restore_table("b1", "r")
        assert await _rows(client, "r") == expected
        assert [b.backup_id for b in await client.list_backups("t")] == [backup.backup_id]
        with pytest.raises(AlreadyExists):
            await client.restore_table("b1", "r")
        # A clone diverges from its source and outlives it.
        await client.clone_table("t", "c")
        await _write(client, "c", range(0, 5), b"clone")
        await _write(client, "t", range(5, 10), b"source")
        src, clone = await _rows(client, "t"), await _rows(client, "c")
        assert clone[b"row0001"] == b"clone" and src[b"row0001"] == b"new"
        assert clone[b"row0006"] == b"new" and src[b"row0006"] == b"source"
        await client.delete_table("t")
        assert await _rows(client, "c") == clone
    finally:
        await client.close()


async def test_backup_in_another_bucket_outlives_the_source(
    cluster: Cluster, etcd_server: str, s3_server: str, tmp_path: Path
) -> None:
    far = _bucket(s3_server, f"far-{uuid.uuid4().hex[:12]}")
    client = await connect_async(cluster.url)
    try:
        await client.create_table("t", ["f"], split_keys=[b"row0010"])
        await _write(client, "t", range(20), b"v")
        await client.flush("t")
        await _write(client, "t", range(5, 8), b"w")
        expected = await _rows(client, "t")
        await client.create_backup("t", "far1", to=far)
    finally:
        await client.close()
    cluster.close()
    # The source cluster is gone, and so is every object of its bucket.
    s3 = boto3_client(s3_server)
    bucket = cluster.store_url.removeprefix("s3://").split("/")[0]
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=bucket, Key=obj["Key"])
    other = _cluster(etcd_server, s3_server, tmp_path / "b", workers=1)
    try:
        client = await connect_async(other.url)
        try:
            await client.restore_table("far1", "r", source=far)
            assert await _rows(client, "r") == expected
            await _write(client, "r", range(0, 1), b"after")
            assert (await _rows(client, "r"))[b"row0000"] == b"after"
        finally:
            await client.close()
    finally:
        other.close()
