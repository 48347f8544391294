"""Batch jobs against a real cluster: etcd, moto's S3 server, a master and two
workers as processes. The snapshot is taken through the master's RPC (which drives the
workers' ``snapshot_hold``/``snapshot_write``), read from S3 through a store that refuses
every write (read-only credentials are all a job needs), and a job's output comes back both
through ``tabletstore bulkload`` and through the client's batched mutations."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pyarrow as pa
import pytest

from tabletstore import batch, connect_async
from tabletstore.batch.engines import awrite_rows, dask_write_rows
from tabletstore.coordination import open_coordinator, paths
from tabletstore.errors import PermissionDenied
from tabletstore.master.bulk_load import DONE, LOADING, LoadRecord
from tabletstore.rpc.messages import BulkLoadTabletRequest
from tabletstore.rpc.services import TABLET
from tabletstore.storage_s3 import layout, open_store
from tabletstore.storage_s3.base import ObjectStore
from tests.batch.conftest import SPLITS, cells_of, fill
from tests.integration.cluster_harness import PROCESS_ENV, Cluster

pytestmark = pytest.mark.timeout(300)


class ReadOnly:
    """What read-only bucket credentials allow: GET, HEAD, LIST; anything else is refused."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.url = inner.url

    def __getattr__(self, name: str) -> object:
        if name in ("create", "delete", "delete_many"):
            raise PermissionDenied(f"read-only credentials: {name} refused")
        return getattr(self.inner, name)


def _env() -> dict[str, str]:
    return {**os.environ, **PROCESS_ENV}


async def test_snapshot_bulk_load_and_client_writes_on_a_cluster(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in PROCESS_ENV.items():
        monkeypatch.setenv(k, v)
    client = await connect_async(cluster.url)
    try:
        await fill(client, "web")  # type: ignore[arg-type]
        t = client.table("web")
        expected = cells_of([r async for r in t.read_rows()])
        snap = await t.snapshot(ttl=3600)
        assert [m.snapshot_id for m in await client.list_snapshots("web")] == [snap.snapshot_id]

        store = ReadOnly(open_store(cluster.store_url))
        got: list[dict[str, object]] = []
        opened = await batch.aopen_snapshot(cluster.store_url, snap.snapshot_id)
        for split in await opened.asplits():
            async for b in batch.aread_split(split, store=store):  # type: ignore[arg-type]
                got.extend(b.to_pylist())
        await store.inner.close()
        assert got == expected
        # The cluster's own URL opens it too: the splits name the store its master recorded.
        by_cluster = await batch.aopen_snapshot(cluster.url, snap.snapshot_id)
        assert by_cluster.store_url == cluster.store_url

        # Bulk load from the caller's staging area of the bucket, with the CLI.
        staging = await client.staging_url(f"job-{uuid.uuid4().hex[:6]}")
        rows = [b"row%03d" % i for i in range(0, 120, 3)]
        await batch.awrite_sstables(
            pa.table(
                {
                    "row": pa.array(rows, pa.binary()),
                    "family": ["anchor"] * len(rows),
                    "qualifier": pa.array([b"bulk"] * len(rows), pa.binary()),
                    "value": pa.array([b"b" + r for r in rows], pa.binary()),
                }
            ),
            staging,
            split_keys=SPLITS,  # every file inside one tablet: adopted over the wire
        )
        out = await asyncio.to_thread(
            subprocess.run,
            [
                sys.executable,
                "-m",
                "tabletstore.cli.main",
                "--url",
                cluster.url,
                "bulkload",
                "web",
                staging,
            ],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "loaded 40 cells into 3 tablets" in out.stdout
        bucket = open_store(cluster.store_url)
        staged = [i.key async for i in bucket.list("tables/") if "/bulk/" in i.key]
        await bucket.close()
        assert len(staged) == 3  # one file per tablet, each adopted as it is
        # The same load again (the default load id is a hash of the files): nothing loads.
        load = ["bulkload", "web", staging]
        again = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "tabletstore.cli.main", "--url", cluster.url, *load],
            capture_output=True,
            text=True,
            env=_env(),
            timeout=120,
        )
        assert again.returncode == 0, again.stderr
        assert "nothing to load" in again.stdout, again.stdout
        row = await t.read_row(b"row030")
        assert row is not None and any(
            c.qualifier == b"bulk" and c.value == b"brow030" for c in row.cells
        )

        # Small outputs through the client's batched mutations (the Dask/Spark writers' path).
        n = await awrite_rows(
            cluster.url,
            "web",
            pa.table(
                {
                    "row": [b"client%02d" % i for i in range(10)],
                    "family": ["meta"] * 10,
                    "qualifier": [b"q"] * 10,
                    "value": [b"v"] * 10,
                }
            ),
        )
        assert n == 10
        assert len([r async for r in t.read_rows(prefix=b"client")]) == 10

        # The CLI's snapshot verbs.
        async def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return await asyncio.to_thread(
                subprocess.run,
                [sys.executable, "-m", "tabletstore.cli.main", "--url", cluster.url, *args],
                capture_output=True,
                text=True,
                env=_env(),
                timeout=120,
            )

        created = await cli("snapshot", "create", "web", "--ttl", "1h")
        assert created.returncode == 0, created.stderr
        new_id = created.stdout.split()[0]
        listed = await cli("snapshot", "list", "web")
        assert [line.split("\t")[0] for line in listed.stdout.splitlines()] == [
            snap.snapshot_id,
            new_id,
        ]
        assert (await cli("snapshot", "delete", new_id)).returncode == 0
        missing = await cli("snapshot", "create", "nosuch")
        assert missing.returncode == 1 and "nosuch" in missing.stderr
    finally:
        await client.close()


async def test_a_dask_job_writes_small_outputs_through_the_client(cluster: Cluster) -> None:
    import dask.dataframe as dd
    import pandas as pd

    client = await connect_async(cluster.url)
    try:
        await client.create_table("out", ["f"])
        rows = [b"k%03d" % i for i in range(30)]
        pdf = pd.DataFrame({"row": rows, "family": "f", "qualifier": b"q", "value": rows})
        n = await asyncio.to_thread(
            dask_write_rows, dd.from_pandas(pdf, npartitions=3), cluster.url, "out"
        )
        assert n == 30
        got = [(r.key, r.cells[0].value) async for r in client.table("out").read_rows()]
        assert got == [(r, r) for r in rows]
    finally:
        await client.close()


async def test_a_bulk_load_cut_short_by_a_master_failover_completes(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The leading master dies in the middle of a load: the first tablet has its part (and
    its mark), the load's record says loading. The client's call goes to the standby that
    takes over, which loads the other tablets' parts only: every cell once."""
    for k, v in PROCESS_ENV.items():
        monkeypatch.setenv(k, v)
    leader = next(r for r in cluster.records if r.role.startswith("master"))
    cluster.start_master()  # the standby
    client = await connect_async(cluster.url)
    coordinator = open_coordinator(cluster.url)
    try:
        await client.create_table("loads", ["cf"], split_keys=[b"row040", b"row080"])
        table_id = (await client._info("loads")).table_id
        load_name = f"job-{uuid.uuid4().hex[:6]}"
        staging = await client.staging_url(load_name)
        rows = [b"row%03d" % i for i in range(120)]
        keys = await batch.awrite_sstables(
            pa.table(
                {
                    "row": pa.array(rows, pa.binary()),
                    "family": ["cf"] * len(rows),
                    "qualifier": pa.array([b"q"] * len(rows), pa.binary()),
                    "value": pa.array(rows, pa.binary()),
                }
            ),
            staging,
        )
        # What the leader leaves when it dies after the first tablet: the load's record and
        # that tablet's part, marked in its METADATA row.
        await coordinator.put(
            paths.bulk_load(table_id, "job-f"),
            LoadRecord("job-f", table_id, staging, LOADING, 0.0).to_bytes(),
        )
        first = next(r for r in await client.catalog.list_tablets(table_id) if not r.start_row)
        assert first.location is not None
        stub = TABLET.client(client._transport, first.location)
        part = await stub.bulk_load_tablet(
            BulkLoadTabletRequest(
                table_id,
                first.tablet_id,
                cluster.store_url,  # the master names files by their keys in the bucket
                tuple(layout.staging_prefix("anonymous", load_name) + k for k in keys),
                load_id="job-f",
            )
        )
        assert part.cells == 40
        await asyncio.to_thread(cluster.kill, leader)

        assert await client.bulk_load("loads", staging, load_id="job-f") == (2, 80)
        got = [r async for r in client.table("loads").read_rows()]
        assert [(r.key, [c.value for c in r.cells]) for r in got] == [(r, [r]) for r in rows]
        records = await client.catalog.list_tablets(table_id)
        assert sum(x.cells for r in records for refs in r.sstables.values() for x in refs) == 120
        kv = await coordinator.get(paths.bulk_load(table_id, "job-f"))
        assert kv is not None and LoadRecord.from_bytes(kv.value).state == DONE
        assert await client.bulk_load("loads", staging, load_id="job-f") == (0, 0)
    finally:
        await coordinator.close()
        await client.close()
