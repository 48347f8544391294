"""Tenants through the front door: a token holder reaches only its own instances and tables.

A real front door (``BigtableApiServer`` with TLS and bearer tokens, its certificate of the
delegating role ``function``) over a secured master and worker on loopback. t1 makes an
instance, a table in it and a table in the plain instance, and writes a row to each; t2, with
its own valid token, then tries every call on them. The front door acts as its caller: the
master and the worker authorize t1 and t2 themselves (delegation, rpc/auth.py), and each
instance belongs to its creator. Before, every call ran as the front door: t2 listed, read,
overwrote, altered, wiped and deleted t1's table and instance.

And the delegation itself: only a principal of a delegating role may make a request on behalf
of another; a plain cluster principal asserting one is refused.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tabletstore.coordination.tokens import TokenStore
from tabletstore.errors import PermissionDenied
from tabletstore.metadata.catalog import Catalog
from tabletstore.rpc.auth import ACTING_FOR, ClientAuth
from tabletstore.rpc.messages import TableNameRequest
from tabletstore.rpc.services import MASTER
from tabletstore.rpc.tcp import TcpTransport
from tabletstore.security import ca
from tests.security.secure_cluster import SecureCluster, secure_cluster, wait_for

pytestmark = pytest.mark.timeout(180)

grpc = pytest.importorskip("grpc")

PROJECT = "p"
PLAIN = "shared"
INSTANCE = f"projects/{PROJECT}/instances/t1-instance"
TABLE = f"{INSTANCE}/tables/ledger"
PLAIN_TABLE = f"projects/{PROJECT}/instances/{PLAIN}/tables/plain-ledger"


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SecureCluster]:
    async with secure_cluster(tmp_path) as running:
        ca.issue(running.certs, "frontdoor", role="function")
        yield running


class FrontDoor:
    """Calls to the front door over TLS with one caller's bearer token."""

    def __init__(self, channel: Any, modules: dict[str, Any]) -> None:
        self._channel = channel
        self.m = modules

    async def call(self, token: str, service: str, method: str, request: Any) -> Any:
        """A unary call; ``request`` is a proto-plus message, the answer is deserialized
        with the response class the module names (``{method}Response``, else Operation or
        Empty, as the API defines)."""
        response_type = self._response_type(method)
        stub = self._channel.unary_unary(
            f"/{service}/{method}",
            request_serializer=type(request).serialize,
            response_deserializer=response_type,
        )
        return await stub(request, metadata=(("authorization", f"Bearer {token}"),))

    def _response_type(self, method: str) -> Any:
        m = self.m
        if method in ("CreateInstance", "PartialUpdateInstance"):
            return m["operations"].Operation.FromString
        if method in ("DeleteInstance", "DeleteTable", "DropRowRange"):
            return m["empty"].Empty.FromString
        if method in ("GetInstance", "UpdateInstance"):
            return m["instance"].Instance.deserialize
        if method in ("CreateTable", "GetTable", "ModifyColumnFamilies"):
            return m["table"].Table.deserialize
        for module in ("bia", "bta", "bt"):
            response = getattr(m[module], f"{method}Response", None)
            if response is not None:
                return response.deserialize
        raise AssertionError(f"no response type for {method}")

    async def rows(self, token: str, table_name: str) -> list[bytes]:
        """The row keys ReadRows returns to this caller (whole rows of any cell)."""
        stub = self._channel.unary_stream(
            "/google.bigtable.v2.Bigtable/ReadRows",
            request_serializer=self.m["bt"].ReadRowsRequest.serialize,
            response_deserializer=self.m["bt"].ReadRowsResponse.deserialize,
        )
        keys = []
        request = self.m["bt"].ReadRowsRequest(table_name=table_name)
        async for response in stub(request, metadata=(("authorization", f"Bearer {token}"),)):
            keys.extend(chunk.row_key for chunk in response.chunks if chunk.row_key)
        return keys


DATA = "google.bigtable.v2.Bigtable"
TABLES = "google.bigtable.admin.v2.BigtableTableAdmin"
INSTANCES = "google.bigtable.admin.v2.BigtableInstanceAdmin"


async def _modules() -> dict[str, Any]:
    # Imported on a thread: these imports take seconds on a loaded machine, and blocking the
    # event loop that long lets the in-process master's 5 s lease expire.
    names = {
        "bt": "google.cloud.bigtable_v2.types.bigtable",
        "data": "google.cloud.bigtable_v2.types.data",
        "bta": "google.cloud.bigtable_admin_v2.types.bigtable_table_admin",
        "bia": "google.cloud.bigtable_admin_v2.types.bigtable_instance_admin",
        "table": "google.cloud.bigtable_admin_v2.types.table",
        "instance": "google.cloud.bigtable_admin_v2.types.instance",
        "operations": "google.longrunning.operations_pb2",
        "empty": "google.protobuf.empty_pb2",
        "field_mask": "google.protobuf.field_mask_pb2",
        "server": "tabletstore.bigtable_api.front_door",
    }
    return {
        key: await asyncio.to_thread(importlib.import_module, name) for key, name in names.items()
    }


@pytest.fixture
async def front_door(cluster: SecureCluster) -> AsyncIterator[tuple[FrontDoor, str, str]]:
    async with open_front_door(cluster, "t1", "t2") as opened:
        yield opened


@contextlib.asynccontextmanager
async def open_front_door(
    cluster: SecureCluster, first: str, second: str
) -> AsyncIterator[tuple[FrontDoor, str, str]]:
    """A front door (the ``frontdoor`` function identity) over ``cluster``, a channel to it,
    and tokens for the principals ``first`` and ``second``."""
    modules = await _modules()
    tokens = TokenStore(cluster.coordinator)
    t1, t2 = await tokens.create(first), await tokens.create(second)
    client = await cluster.client("frontdoor")
    server = modules["server"].BigtableApiServer(
        client, tls=cluster.tls("frontdoor"), tokens=tokens, plain_instance=PLAIN
    )
    port = await server.start()
    channel = grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        grpc.ssl_channel_credentials((cluster.certs / "ca.pem").read_bytes()),
    )
    try:
        yield FrontDoor(channel, modules), t1, t2
    finally:
        await channel.close()
        await server.stop()
        await client.close()


async def _t1_builds(door: FrontDoor, t1: str) -> None:
    """t1's instance with a table, a table in the plain instance, and a row in each."""
    m = door.m
    await door.call(
        t1,
        INSTANCES,
        "CreateInstance",
        m["bia"].CreateInstanceRequest(
            parent=f"projects/{PROJECT}",
            instance_id="t1-instance",
            instance=m["instance"].Instance(display_name="t1's"),
        ),
    )
    family = {"cf": m["table"].ColumnFamily()}
    for parent, table_id in (
        (INSTANCE, "ledger"),
        (PLAIN_TABLE.rsplit("/tables/")[0], "plain-ledger"),
    ):
        await door.call(
            t1,
            TABLES,
            "CreateTable",
            m["bta"].CreateTableRequest(
                parent=parent, table_id=table_id, table=m["table"].Table(column_families=family)
            ),
        )
    for name in (TABLE, PLAIN_TABLE):

        async def written(name: str = name) -> bool:
            try:
                await door.call(t1, DATA, "MutateRow", _set_cell(m, name, b"t1's secret"))
            except grpc.aio.AioRpcError:
                return False
            return True

        await wait_for(written, f"t1's write to {name}")


def _set_cell(m: dict[str, Any], table_name: str, value: bytes) -> Any:
    return m["bt"].MutateRowRequest(
        table_name=table_name,
        row_key=b"row",
        mutations=[
            m["data"].Mutation(
                set_cell=m["data"].Mutation.SetCell(
                    family_name="cf", column_qualifier=b"q", timestamp_micros=-1, value=value
                )
            )
        ],
    )


def _drop_family(m: dict[str, Any], table_name: str) -> Any:
    modification = m["bta"].ModifyColumnFamiliesRequest.Modification(id="cf", drop=True)
    return m["bta"].ModifyColumnFamiliesRequest(name=table_name, modifications=[modification])


async def _code(call: Any) -> str:
    """The status t2's call got: OK or the gRPC status code's name."""
    try:
        await call
    except grpc.aio.AioRpcError as exc:
        return str(exc.code().name)
    return "OK"


async def test_t2_cannot_reach_t1s_instance_or_tables(
    front_door: tuple[FrontDoor, str, str], cluster: SecureCluster
) -> None:
    door, t1, t2 = front_door
    m = door.m
    await _t1_builds(door, t1)
    parent = f"projects/{PROJECT}"

    listed = await door.call(
        t2, INSTANCES, "ListInstances", m["bia"].ListInstancesRequest(parent=parent)
    )
    assert INSTANCE not in [i.name for i in listed.instances]
    mask = m["field_mask"].FieldMask(paths=["display_name"])
    attempts: dict[str, Any] = {
        "GetInstance": (INSTANCES, m["bia"].GetInstanceRequest(name=INSTANCE)),
        "PartialUpdateInstance": (
            INSTANCES,
            m["bia"].PartialUpdateInstanceRequest(
                instance=m["instance"].Instance(name=INSTANCE, display_name="t2 was here"),
                update_mask=mask,
            ),
        ),
        "ListClusters": (INSTANCES, m["bia"].ListClustersRequest(parent=INSTANCE)),
        "ListTables": (TABLES, m["bta"].ListTablesRequest(parent=INSTANCE)),
        "GetTable": (TABLES, m["bta"].GetTableRequest(name=TABLE)),
        "CreateTable": (
            TABLES,
            m["bta"].CreateTableRequest(
                parent=INSTANCE, table_id="squatter", table=m["table"].Table()
            ),
        ),
        "ModifyColumnFamilies": (
            TABLES,
            _drop_family(m, TABLE),
        ),
        "DropRowRange": (
            TABLES,
            m["bta"].DropRowRangeRequest(name=TABLE, delete_all_data_from_table=True),
        ),
        "DeleteTable": (TABLES, m["bta"].DeleteTableRequest(name=TABLE)),
        "MutateRow": (DATA, _set_cell(m, TABLE, b"t2 overwrote this")),
        "DeleteInstance": (INSTANCES, m["bia"].DeleteInstanceRequest(name=INSTANCE)),
    }
    got = {}
    for method, (service, request) in attempts.items():
        got[method] = await _code(door.call(t2, service, method, request))
    # The admin calls name t1's instance: PERMISSION_DENIED. A data call is answered as its
    # caller's lookup of the table is: t2 may not know of it, NOT_FOUND as for a missing table.
    assert got == {**dict.fromkeys(attempts, "PERMISSION_DENIED"), "MutateRow": "NOT_FOUND"}, got
    assert await _code(door.rows(t2, TABLE)) == "NOT_FOUND"

    # In the plain instance (no owner: the cluster alone decides) t1's table is still hers:
    # the worker reads and writes, and the master administers, as t2 itself. t2 may not know
    # of it: it is not listed, and described or altered it is NOT_FOUND like a table that
    # does not exist; deleting either is PERMISSION_DENIED.
    plain_parent = PLAIN_TABLE.rsplit("/tables/")[0]
    listed_plain = await door.call(
        t2, TABLES, "ListTables", m["bta"].ListTablesRequest(parent=plain_parent)
    )
    assert [t.name for t in listed_plain.tables] == []
    listed_by_t1 = await door.call(
        t1, TABLES, "ListTables", m["bta"].ListTablesRequest(parent=plain_parent)
    )
    assert [t.name for t in listed_by_t1.tables] == [PLAIN_TABLE]
    missing = f"{plain_parent}/tables/no-such-table"
    plain = {
        "GetTable": (TABLES, m["bta"].GetTableRequest(name=PLAIN_TABLE)),
        "GetTable (missing)": (TABLES, m["bta"].GetTableRequest(name=missing)),
        "ModifyColumnFamilies": (
            TABLES,
            _drop_family(m, PLAIN_TABLE),
        ),
        "DeleteTable": (TABLES, m["bta"].DeleteTableRequest(name=PLAIN_TABLE)),
        "DeleteTable (missing)": (TABLES, m["bta"].DeleteTableRequest(name=missing)),
        "MutateRow": (DATA, _set_cell(m, PLAIN_TABLE, b"t2 overwrote this")),
        "DropRowRange": (
            TABLES,
            m["bta"].DropRowRangeRequest(name=PLAIN_TABLE, delete_all_data_from_table=True),
        ),
    }
    got_plain = {}
    for label, (service, request) in plain.items():
        method = label.split(" ")[0]
        got_plain[label] = await _code(door.call(t2, service, method, request))
    # MutateRow and DropRowRange look the table up as t2, though the front door has served
    # t1's calls on it (test_frontdoor_lookup_cache.py): NOT_FOUND.
    assert got_plain == {
        "GetTable": "NOT_FOUND",
        "GetTable (missing)": "NOT_FOUND",
        "ModifyColumnFamilies": "NOT_FOUND",
        "DeleteTable": "PERMISSION_DENIED",
        "DeleteTable (missing)": "PERMISSION_DENIED",
        "MutateRow": "NOT_FOUND",
        "DropRowRange": "NOT_FOUND",
    }, got_plain
    assert await _code(door.rows(t2, PLAIN_TABLE)) == "NOT_FOUND"

    # t1's things are intact, and t1 still has every right on them.
    for name in (TABLE, PLAIN_TABLE):
        assert await door.rows(t1, name) == [b"row"]
    catalog = Catalog(cluster.coordinator)
    stored = [t for t in await catalog.list_tables() if t.schema.name.endswith("ledger")]
    assert len(stored) == 2
    for info in stored:
        assert info.schema.admins == ["t1"]
        assert info.schema.families["cf"].acl.readers == ["t1"]
    instance = await door.call(
        t1, INSTANCES, "GetInstance", m["bia"].GetInstanceRequest(name=INSTANCE)
    )
    assert instance.display_name == "t1's"
    await door.call(t1, TABLES, "DeleteTable", m["bta"].DeleteTableRequest(name=TABLE))
    await door.call(t1, INSTANCES, "DeleteInstance", m["bia"].DeleteInstanceRequest(name=INSTANCE))


async def test_a_plain_cluster_principal_cannot_assert_delegation(cluster: SecureCluster) -> None:
    alice = await cluster.client("alice")
    await alice.create_table("alices", ["f"])

    async def as_for(name: str, on_behalf: str, request: Any, method: Any) -> Any:
        transport = TcpTransport(timeout=10.0, auth=ClientAuth(cluster.tls(name)))
        master = await Catalog(cluster.coordinator).master_address()
        stub = MASTER.client(transport, master)
        token = ACTING_FOR.set(on_behalf)
        try:
            return await getattr(stub, method)(request)
        finally:
            ACTING_FOR.reset(token)
            await transport.close()

    # bob (a client certificate) claims to be alice: refused outright, whatever the call.
    with pytest.raises(PermissionDenied, match=r"bob.*may not make requests on behalf of 'alice'"):
        await as_for("bob", "alice", TableNameRequest("alices"), "delete_table")
    with pytest.raises(PermissionDenied, match="on behalf of"):
        await as_for("bob", "alice", TableNameRequest("alices"), "get_table")
    # A worker's certificate is a cluster identity but does not delegate either.
    ca.issue(cluster.certs, "worker2", role="worker")
    with pytest.raises(PermissionDenied, match=r"worker2.*on behalf of 'alice'"):
        await as_for("worker2", "alice", TableNameRequest("alices"), "delete_table")
    # The front door's certificate (role function) delegates: acting for bob it is bob, who is not alice's
    # table's admin; acting for alice it may delete her table.
    with pytest.raises(PermissionDenied, match=r"bob may not delete_table table 'alices'"):
        await as_for("frontdoor", "bob", TableNameRequest("alices"), "delete_table")
    await as_for("frontdoor", "alice", TableNameRequest("alices"), "delete_table")
    assert "alices" not in await alice.list_tables()
    await alice.close()
