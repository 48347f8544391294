"""Change streams across a tablet merge and a master failover, on a cluster of real processes.

The seeded writer and the follower of ``test_change_stream_cluster.py``: a reader follows
every partition of a table's change stream (and the partitions that replace them) while

* the master merges the table's two tablets into one (both partitions end, and the merged
  partition is read with the tokens of both), writes going on before, during and after;
* the leading master is SIGKILLed, a worker serving the table is SIGKILLed while no master
  leads, and the standby takes over and recovers its tablets, writes going on throughout.

Either way the changes read equal the acknowledged writes, each exactly once, in commit order
per row, across partition ends and their successors.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from tabletstore.client.change_plan import ChangePartition, PartitionEnd
from tabletstore.client.change_stream import ChangeItem
from tabletstore.data.schema import ColumnFamily
from tabletstore.embedded import connect_async
from tests.integration.cluster_harness import (
    PROCESS_ENV,
    Cluster,
    eventually,
    placement,
    table_id_of,
)
from tests.integration.test_change_stream_cluster import (
    SeededWriter,
    finish_following,
    follow_into,
)
from tests.integration.test_cluster import _record_of

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]

FAMILIES = ["f", ColumnFamily(name="n", value_type="sum")]
#: The workers' lease: long enough that a loaded machine's stalls do not end one at start-up
#: (a worker that loses its lease exits); a killed one's tablets move after it.
LEASE = 8.0
#: The masters': the standby takes over this soon after the leader is killed.
MASTER_LEASE = 4.0


async def test_the_change_stream_is_every_acknowledged_write_once_across_a_merge(
    etcd_server: str, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in PROCESS_ENV.items():
        monkeypatch.setenv(k, v)
    cluster = Cluster.on(etcd_server, s3_server, tmp_path, "changes-merge", lease_ttl=LEASE)
    try:
        # Two small tablets stay apart this long before the master merges them: long enough
        # for writes to both first.
        cluster.start_master(extra_args=("--merge-after", "15"))
        cluster.start_worker()
        client = await connect_async(cluster.url)
        try:
            began = time.time()
            table = await client.create_table("m", FAMILIES, split_keys=[b"r030"], changes=3600.0)
            seen: list[tuple[ChangePartition, ChangeItem]] = []
            follower = asyncio.create_task(follow_into(table, began, seen))
            writer = SeededWriter(table, 35)

            async def merged() -> bool:
                return len(await table.change_partitions()) == 1

            await writer.write(20)
            assert not await merged(), "merged before any write: raise --merge-after"
            await writer.write_until(merged, "the master merges the two tablets")
            await writer.write(60)
            ended = time.time()
            await finish_following(follower, seen, writer.writes, ended)
            ends = [(p, item) for p, item in seen if isinstance(item, PartitionEnd)]
            assert len(ends) == 2, f"both partitions end at the merge: {ends}"
            successors = {succ for _, end in ends for succ, _ in end.successors}
            assert successors == {ChangePartition(b"", None)}
            read_after = [p for p, _ in seen if p == ChangePartition(b"", None)]
            assert read_after, "the merged partition was never read"
        finally:
            await client.close()
    finally:
        cluster.close()


async def test_the_change_stream_is_every_acknowledged_write_once_across_a_master_kill(
    etcd_server: str, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in PROCESS_ENV.items():
        monkeypatch.setenv(k, v)
    cluster = Cluster.on(etcd_server, s3_server, tmp_path, "changes-master", lease_ttl=LEASE)
    try:
        leader = cluster.start_master(lease_ttl=MASTER_LEASE)
        standby = cluster.start_master(lease_ttl=MASTER_LEASE)
        for _ in range(2):
            cluster.start_worker()
        client = await connect_async(cluster.url)
        try:
            began = time.time()
            table = await client.create_table(
                "k", FAMILIES, split_keys=[b"r020", b"r040"], changes=3600.0
            )
            table_id = await table_id_of(client, "k")
            seen: list[tuple[ChangePartition, ChangeItem]] = []
            follower = asyncio.create_task(follow_into(table, began, seen))
            writer = SeededWriter(table, 36)
            await writer.write(100)
            status = await client.status()
            assert status.master == leader.url
            where = placement(status, table_id)
            victim = max(where, key=lambda w: len(where[w]))
            await asyncio.to_thread(cluster.kill, leader)
            await writer.write(40)
            # A worker dies while no master leads (or just after the standby took over): the
            # standby recovers its tablets.
            await asyncio.to_thread(cluster.kill, _record_of(cluster, status.workers[victim]))
            await writer.write(60)

            async def recovered() -> bool:
                status = await client.status()
                where = placement(status, table_id)
                served = sum(len(t) for t in where.values())
                return status.master == standby.url and served == 3 and victim not in where

            await eventually(recovered, deadline=120, what="the standby recovered the tablets")
            await writer.write(60)
            ended = time.time()
            await finish_following(follower, seen, writer.writes, ended)
            assert not any(isinstance(item, PartitionEnd) for _, item in seen), (
                "a failover and a recovery end no partition"
            )
        finally:
            await client.close()
    finally:
        cluster.close()
