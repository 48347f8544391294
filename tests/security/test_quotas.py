"""Quotas per principal: how many tablets one create_table makes, how many tables one owns.

1. A real master and worker on loopback: one ``create_table`` with 300 split keys used to make
   301 tablets at once (10 s of the master's assignment). Now it is
   InvalidArgument naming ``max_split_keys`` and its value, and nothing is created.
2. The master's table quota, as a principal proven by the RPC layer would meet it (the
   master's handler run in that principal's scope): with ``max_tables_per_principal`` 3, a
   fourth table of the same principal is refused naming the setting, another principal and
   the cluster's own identities are not counted against it.

Bounded: one refused call against the processes; four tables in process.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.cluster import ClusterClient
from tabletstore.data.schema import TableSchema
from tabletstore.embedded import Database
from tabletstore.errors import InvalidArgument, NotFound
from tabletstore.rpc.auth import principal_scope
from tabletstore.rpc.messages import CreateTableRequest
from tabletstore.security.principal import Principal
from tests.security.request_support import create_when_ready, processes, start_cluster

__all__ = ["processes"]  # the fixture, used by name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


async def test_one_create_table_may_not_make_hundreds_of_tablets(
    etcd_url: str, s3_url: str, tmp_path: Path, processes: list[ProcessRecord]
) -> None:
    await start_cluster(tmp_path, etcd_url, s3_url, processes)
    async with await ClusterClient.open(etcd_url) as client:
        await create_when_ready(client, "first")  # the cluster serves
        splits = [b"k%04d" % i for i in range(1, 301)]
        with pytest.raises(InvalidArgument, match="max_split_keys=100") as info:
            async with asyncio.timeout(60):
                await client.create_table("wide", ["cf"], split_keys=splits)
        assert "300 split keys" in str(info.value)
        with pytest.raises(NotFound):
            await client.describe_table("wide")


async def test_a_principal_may_own_a_bounded_number_of_tables(tmp_path: Path) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        master = db.master
        master._options = dataclasses.replace(master._options, max_tables_per_principal=3)

        async def create(name: str, who: Principal) -> None:
            schema = TableSchema(name=name, families={}, admins=[who.name])
            with principal_scope(who):
                await master.create_table(CreateTableRequest.of(schema, ()))

        mallory = Principal("mallory", "client", "token")
        for i in range(3):
            await create(f"m{i}", mallory)
        with pytest.raises(InvalidArgument, match="max_tables_per_principal=3"):
            await create("m3", mallory)
        await create("other", Principal("alice", "client"))  # her own count
        await create("system", Principal("frontdoor", "function"))  # the cluster's own
        assert sorted(await db.list_tables()) == ["m0", "m1", "m2", "other", "system"]
    finally:
        await db.close()
