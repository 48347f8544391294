"""Point-in-time restore on a cluster of real processes: the master checkpoints a table with
history on its own, a worker serving it is killed (SIGKILL) between two markers and its
tablets recovered elsewhere, and a restore as of each marker (through the cluster's catalog
and bucket, as ``tabletstore --url etcd://... restore`` does) equals a model of the
acknowledged writes cell for cell, its log sorted by the live workers' sorters for every other
marker."""

from __future__ import annotations

import asyncio
import random
import struct
import time
from pathlib import Path

import pytest

from tabletstore.clock import SystemClock
from tabletstore.data.model import AddToCell, DeleteCells, SetCell
from tabletstore.data.schema import ColumnFamily
from tabletstore.embedded import connect_async
from tabletstore.master.log_recovery import WorkerSortExecutor
from tabletstore.master.pitr_restore import restore_as_of
from tabletstore.metadata.catalog import ClusterSettings
from tabletstore.storage_s3 import open_store
from tests.integration.cluster_harness import (
    PROCESS_ENV,
    Cluster,
    eventually,
    placement,
    table_id_of,
)
from tests.integration.test_cluster import _record_of, _start

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

BUCKET = 86_400_000_000
Model = dict[tuple[bytes, str, bytes, int], bytes]


async def _read(client: object, table: str) -> Model:
    out: Model = {}
    async for row in client.table(table).read_rows():  # type: ignore[attr-defined]
        for c in row.cells:
            out[(row.key, c.family, c.qualifier, c.timestamp)] = c.value
    return out


async def test_restore_as_of_markers_across_a_worker_kill(
    etcd_server: str, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in PROCESS_ENV.items():
        monkeypatch.setenv(k, v)
    cluster = _start(
        Cluster.on(etcd_server, s3_server, tmp_path, "cluster", lease_ttl=3.0),
        masters=1,
        workers=2,
    )
    rnd = random.Random(7)
    cells: Model = {}
    sums: dict[tuple[bytes, bytes], int] = {}
    markers: list[tuple[float, Model]] = []

    def view() -> Model:
        out = dict(cells)
        out.update({(r, "n", q, BUCKET): struct.pack(">q", s) for (r, q), s in sums.items()})
        return out

    try:
        client = await connect_async(cluster.url)
        try:
            table = await client.create_table(
                "h",
                ["f", ColumnFamily(name="n", value_type="sum")],
                split_keys=[b"row5"],
                history=3600.0,
            )
            await eventually(
                lambda: _truthy(client.list_snapshots("h")),
                deadline=60,
                what="the master's first checkpoint of the table",
            )
            ts = 1
            for step in range(240):
                row = b"row%d" % rnd.randrange(10)
                q = b"q%d" % rnd.randrange(2)
                ts += 1
                roll = rnd.random()
                if roll < 0.65:
                    value = b"v%d" % step
                    await table.mutate_row(row, [SetCell("f", q, value, ts)])
                    cells[(row, "f", q, ts)] = value
                elif roll < 0.85:
                    await table.mutate_row(row, [AddToCell("n", q, step, BUCKET)])
                    sums[(row, q)] = sums.get((row, q), 0) + step
                else:
                    await table.mutate_row(row, [DeleteCells("f", q)])
                    for key in [k for k in cells if k[0] == row and k[2] == q]:
                        del cells[key]
                if step % 40 == 39:
                    markers.append((time.time(), view()))
                if step == 100:
                    await client.flush("h")
                if step == 120:  # SIGKILL a worker serving the table, between two writes
                    table_id = await table_id_of(client, "h")
                    where = placement(await client.status(), table_id)
                    victim_id = next(w for w, t in where.items() if t)
                    status = await client.status()
                    await asyncio.to_thread(
                        cluster.kill, _record_of(cluster, status.workers[victim_id])
                    )
                    await eventually(
                        lambda t=table_id, v=victim_id: _moved_off(client, t, v),  # type: ignore[misc]
                        deadline=60,
                        what="the killed worker's tablets served elsewhere",
                    )
            settings = await ClusterSettings.load(client.coordinator)  # type: ignore[attr-defined]
            store = open_store(settings.store_url)
            try:
                for i, (instant, expected) in enumerate(markers):
                    # Every other marker's log is sorted by the live workers' sorters (the
                    # CLI's default on a cluster), the others in this process.
                    workers = WorkerSortExecutor(store, client.coordinator)  # type: ignore[attr-defined]
                    await restore_as_of(
                        store,
                        client.catalog,
                        table="h",
                        instant=instant,
                        new_table=f"h{i}",
                        clock=SystemClock(),
                        executor=workers if i % 2 else None,
                        task_bytes=4096,
                    )
                    got = await eventually(
                        lambda n=f"h{i}": _readable(client, n),  # type: ignore[misc]
                        deadline=60,
                        what=f"restored table h{i} served",
                    )
                    assert got == expected, f"marker {i}"
            finally:
                await store.close()
        finally:
            await client.close()
    finally:
        cluster.close()


async def _truthy(value: object) -> bool:
    return bool(await value)  # type: ignore[misc]


async def _moved_off(client: object, table_id: str, victim: str) -> bool:
    where = placement(await client.status(), table_id)  # type: ignore[attr-defined]
    return sum(len(t) for t in where.values()) == 2 and victim not in where


async def _readable(client: object, table: str) -> Model | None:
    try:
        return await _read(client, table)
    except Exception:  # not served yet: the master assigns it in its next round
        return None
