"""Fast failure detection with real processes (master/failure_detector.py, §5.2).

* a SIGKILLed worker refuses connections: the master revokes its lease and its tablet is
  served elsewhere long before the lease's TTL could have run out;
* a SIGSTOPped worker still accepts connections (its kernel does): it is never revoked early,
  its lease ends by its TTL as before, and it acknowledges nothing once it wakes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tabletstore.cli.localstack import ProcessRecord
from tabletstore.coordination import open_coordinator, paths
from tabletstore.data.model import SetCell
from tests.integration.cluster_harness import Cluster, eventually, rejoined_or_gone, table_id_of
from tests.integration.test_cluster import _start, client_of, wait_served

pytestmark = pytest.mark.timeout(240)

#: A lease long enough that recovery within SOON can only be the detector's doing: with
#: keep-alives every TTL / 3, the lease of a worker killed at t cannot end before t + 2 TTL / 3.
LONG_LEASE = 30.0
SOON = 15.0


@pytest.fixture
def clusters(
    etcd_server: str, s3_server: str, tmp_path: Path
) -> Iterator[Callable[[float], Cluster]]:
    """Private clusters (a master, 2 workers) with the given lease TTL; stopped at teardown."""
    made: list[Cluster] = []

    def make(lease_ttl: float) -> Cluster:
        cluster = Cluster.on(
            etcd_server, s3_server, tmp_path / f"c{len(made)}", "cluster", lease_ttl=lease_ttl
        )
        made.append(cluster)
        return _start(cluster, masters=1, workers=2)

    try:
        yield make
    finally:
        for cluster in made:
            cluster.close()


def _revoked_in_log(cluster: Cluster, worker_id: str) -> bool:
    for record in cluster.records:
        if record.role.startswith("master"):
            text = Path(record.log).read_text(errors="replace")
            if f"worker {worker_id} refuses connections" in text:
                return True
    return False


async def _owner(cluster: Cluster, client: object, table: str) -> tuple[str, ProcessRecord]:
    status = await client.status()  # type: ignore[attr-defined]
    table_id = await table_id_of(client, table)  # type: ignore[arg-type]
    for worker_id, ws in status.workers.items():
        if any(t.table_id == table_id for t in getattr(ws, "tablets", ())):
            record = next(r for r in cluster.records if r.url == ws.address)
            return worker_id, record
    raise AssertionError(f"nobody serves {table}: {status.workers}")


async def _registered(url: str, worker_id: str) -> bool:
    coord = open_coordinator(url)
    try:
        return await coord.get(paths.server(worker_id)) is not None
    finally:
        await coord.close()


async def test_killed_worker_is_recovered_before_its_lease_could_end(
    clusters: Callable[[float], Cluster],
) -> None:
    cluster = clusters(LONG_LEASE)
    async with client_of(cluster) as client:
        table = await client.create_table("detect", ["f"])
        await wait_served(client, "detect", 1)
        await table.mutate_row(b"r", [SetCell("f", b"c", b"before")])
        worker_id, owner = await _owner(cluster, client, "detect")
        killed = time.monotonic()
        cluster.kill(owner)

        async def unregistered() -> bool:
            return not await _registered(cluster.url, worker_id)

        await eventually(unregistered, deadline=SOON, what=f"the killed worker {worker_id} revoked")
        assert time.monotonic() - killed < 2 * LONG_LEASE / 3  # not by its TTL
        assert _revoked_in_log(cluster, worker_id), cluster.logs()
        await wait_served(client, "detect", 1)
        row = await table.read_row(b"r")
        assert row is not None and row.cells[0].value == b"before"
        await table.mutate_row(b"r", [SetCell("f", b"c", b"after")])


async def test_paused_worker_is_not_revoked_early(
    clusters: Callable[[float], Cluster],
) -> None:
    cluster = clusters(6.0)
    async with client_of(cluster) as client:
        table = await client.create_table("pause", ["f"])
        await wait_served(client, "pause", 1)
        await table.mutate_row(b"r", [SetCell("f", b"c", b"before")])
        worker_id, owner = await _owner(cluster, client, "pause")
        cluster.pause(owner)
        try:

            async def unregistered() -> bool:
                return not await _registered(cluster.url, worker_id)

            # Its lease ends by its TTL (keep-alives stopped); the probes connected all along.
            await eventually(unregistered, deadline=60, what="the paused worker's lease ended")
            assert not _revoked_in_log(cluster, worker_id), cluster.logs()
        finally:
            cluster.resume(owner)
        # The zombie wakes, learns its lease is gone and rejoins as a new worker (or exits);
        # the tablet serves elsewhere.
        await eventually(
            lambda: rejoined_or_gone(client, owner, worker_id),
            deadline=60,
            what="the woken zombie rejoins or exits",
        )
        assert not _revoked_in_log(cluster, worker_id)
    async with client_of(cluster) as client:
        await wait_served(client, "pause", 1)
        table = client.table("pause")
        await table.mutate_row(b"r", [SetCell("f", b"c", b"moved")])
        row = await table.read_row(b"r")
        assert row is not None and row.cells[0].value == b"moved"
