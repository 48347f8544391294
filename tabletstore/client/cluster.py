"""Connecting to a cluster: ``etcd://host:port/<namespace>`` (§5.1, §5.2).

A cluster client reads from the coordinator the root tablet's location (the first level of
the tablet location hierarchy, ``client.location``; the other two are METADATA rows served by
workers) and the elected master's address (the master lock's value) for administration. Data
goes straight to workers over TCP (``rpc.tcp.TcpTransport``); nothing but admin requests
reaches the master.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

from tabletstore.client.client import AsyncClient
from tabletstore.client.location import LocationCache
from tabletstore.coordination import open_coordinator, paths
from tabletstore.coordination.base import Coordinator, KeyValue
from tabletstore.coordination.election import Election
from tabletstore.data.schema import ColumnFamily, LocalityGroup, TableSchema
from tabletstore.errors import NotServing, Unavailable
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.snapshot import SnapshotManifest
from tabletstore.rpc.messages import (
    BulkLoadRequest,
    BulkLoadResponse,
    CompactTableRequest,
    CreateSnapshotRequest,
    CreateTableRequest,
    DeleteSnapshotRequest,
    ListSnapshotsRequest,
    ListSnapshotsResponse,
    ListTablesRequest,
    ListTablesResponse,
    ModifyFamiliesRequest,
    SnapshotInfoMessage,
    TableInfoMessage,
    TableNameRequest,
)
from tabletstore.rpc.tcp import TcpTransport
from tabletstore.rpc.wire import register_all

__all__ = ["CALL_TIMEOUT", "ClusterClient", "MasterStub"]

#: Seconds a client waits for one worker call (or one streamed item) before retrying.
CALL_TIMEOUT = 15.0


async def _first_leader(election: Election, wait: float) -> KeyValue | None:
    """The first leader ``election`` has within ``wait`` seconds (None if none by then)."""
    try:
        async with asyncio.timeout(wait), election.observe() as leaders:
            async for leader in leaders:
                if leader is not None:
                    return leader
    except TimeoutError:
        pass
    return None


def _table_info(msg: TableInfoMessage) -> TableInfo:
    return TableInfo(msg.table_id, TableSchema.model_validate_json(msg.schema_json), msg.revision)


class MasterStub:
    """The client's view of the master: admin calls, re-finding the master when it moves."""

    def __init__(
        self, coordinator: Coordinator, transport: TcpTransport, *, deadline: float = 30.0
    ) -> None:
        self._coord = coordinator
        self._transport = transport
        self._address: str | None = None
        self._deadline = deadline

    async def address(self, *, refresh: bool = False, wait: float = 0.0) -> str:
        """The elected master's address. With none elected (a cluster starting, a master
        failing over), wait up to ``wait`` seconds for an election, watching for it."""
        if self._address is None or refresh:
            self._address = None
            election = self._coord.election(paths.MASTER_ELECTION)
            leader = await election.leader()
            if leader is None and wait > 0:
                leader = await _first_leader(election, wait)
            if leader is None:
                raise Unavailable(f"no master was elected in this cluster within {wait:g} s")
            self._address = leader.value.decode()
        return self._address

    async def _call(self, method: str, request: Any) -> Any:
        """``method`` on the elected master, retried (the master looked up again) while no
        master is elected or it does not answer, until the deadline."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline
        refresh = False
        for attempt in itertools.count():
            try:
                address = await self.address(refresh=refresh, wait=deadline - loop.time())
                return await self._transport.call(address, method, request)
            except (NotServing, Unavailable):
                if loop.time() >= deadline:
                    raise
            refresh = True
            await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
        raise AssertionError("unreachable")

    async def create_table(
        self, schema: TableSchema, *, split_keys: Sequence[bytes] = ()
    ) -> TableInfo:
        req = CreateTableRequest(schema.model_dump_json().encode(), tuple(split_keys))
        msg: TableInfoMessage = await self._call("create_table", req)
        return _table_info(msg)

    async def delete_table(self, name: str) -> None:
        await self._call("delete_table", TableNameRequest(name))

    async def list_tables(self) -> list[TableInfo]:
        resp: ListTablesResponse = await self._call("list_tables", ListTablesRequest())
        return [_table_info(m) for m in resp.tables]

    async def get_table(self, name: str) -> TableInfo:
        return _table_info(await self._call("get_table", TableNameRequest(name)))

    async def modify_families(
        self,
        name: str,
        *,
        create: Sequence[ColumnFamily] = (),
        update: Sequence[ColumnFamily] = (),
        drop: Sequence[str] = (),
        locality_groups: Sequence[LocalityGroup] = (),
    ) -> TableInfo:
        req = ModifyFamiliesRequest(
            name,
            tuple(f.model_dump_json().encode() for f in create),
            tuple(f.model_dump_json().encode() for f in update),
            tuple(drop),
            tuple(g.model_dump_json().encode() for g in locality_groups),
        )
        return _table_info(await self._call("modify_families", req))

    async def compact_table(self, name: str, *, major: bool) -> None:
        await self._call("compact_table", CompactTableRequest(name, major))

    async def create_snapshot(self, name: str, *, ttl: float | None = None) -> SnapshotManifest:
        msg: SnapshotInfoMessage = await self._call(
            "create_snapshot", CreateSnapshotRequest(name, ttl)
        )
        return SnapshotManifest.from_bytes(msg.manifest_json)

    async def list_snapshots(self, name: str | None = None) -> list[SnapshotManifest]:
        resp: ListSnapshotsResponse = await self._call("list_snapshots", ListSnapshotsRequest(name))
        return [SnapshotManifest.from_bytes(m.manifest_json) for m in resp.snapshots]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._call("delete_snapshot", DeleteSnapshotRequest(snapshot_id))

    async def bulk_load(self, name: str, url: str) -> tuple[int, int]:
        resp: BulkLoadResponse = await self._call("bulk_load", BulkLoadRequest(name, url))
        return resp.tablets, resp.cells


class ClusterClient(AsyncClient):
    """An :class:`AsyncClient` connected to a cluster through its coordinator URL."""

    def __init__(
        self,
        url: str,
        coordinator: Coordinator,
        transport: TcpTransport,
        *,
        identity: str | None = None,
    ) -> None:
        locations = LocationCache(coordinator, transport)
        super().__init__(
            catalog=Catalog(coordinator, metadata=locations),
            transport=transport,
            admin=MasterStub(coordinator, transport),
            identity=identity,
            locations=locations,
        )
        self.url = url
        self.coordinator = coordinator

    @classmethod
    async def open(cls, url: str, *, identity: str | None = None) -> ClusterClient:
        register_all()
        coordinator = open_coordinator(url)
        try:
            await coordinator.check()
        except BaseException:
            await coordinator.close()
            raise
        # A call to a worker that stopped answering (paused, partitioned) gives up after this
        # long and is retried at the tablet's new location; its lease (seconds) moves the
        # tablet long before that.
        return cls(url, coordinator, TcpTransport(timeout=CALL_TIMEOUT), identity=identity)

    async def close(self) -> None:
        await self._transport.close()
        await self.coordinator.close()

    async def __aenter__(self) -> ClusterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
