"""Trying to break in: a master and a worker with mutual TLS and
authorization, in this process on loopback, and callers that spoof, bypass or lack identity.

Each test here passed on the open cluster before the security work (a raw ``read_row`` claiming to be
alice read her cell; bob replaced her ACL and deleted her table; anyone could unload a
tablet) or could not be written at all (no TLS, no tokens).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import importlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tabletstore.client.cluster import ClusterClient
from tabletstore.clock import ManualClock
from tabletstore.coordination import open_coordinator
from tabletstore.coordination.tokens import TokenStore
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.data.schema import Acl, ColumnFamily
from tabletstore.errors import InvalidArgument, PermissionDenied, TabletStoreError
from tabletstore.master.master_process import run_master
from tabletstore.metadata.catalog import Catalog
from tabletstore.rpc.auth import ClientAuth
from tabletstore.rpc.messages import (
    LoadTabletRequest,
    MutateRowsRequest,
    ReadRowsRequest,
    UnloadTabletRequest,
)
from tabletstore.rpc.services import TABLET
from tabletstore.rpc.tcp import TcpTransport
from tabletstore.security import TlsConfig, ca
from tabletstore.worker.worker_process import run_worker
from tests.security.secure_cluster import (
    DEADLINE,
    STATUS_TOKEN,
    SecureCluster,
    secure_cluster,
    wait_for,
)

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SecureCluster]:
    async with secure_cluster(tmp_path) as running:
        yield running


PRIVATE = [
    ColumnFamily(name="p", acl=Acl(readers=["alice"], writers=["alice"])),
    ColumnFamily(name="pub"),
]


async def _alice_table(cluster: SecureCluster) -> tuple[ClusterClient, str, str]:
    """alice's table with her private cell; returns (alice's client, table id, tablet id)."""
    alice = await cluster.client("alice")
    table = await alice.create_table("secrets", PRIVATE)
    await wait_for(_write_ok(table), "alice's table to be served")
    return alice, *(await _tablet(alice))


async def _tablet(client: ClusterClient) -> tuple[str, str]:
    """(table id, tablet id) of the secrets table's one tablet, as its worker reports it."""
    table_id = (await Catalog(client.coordinator).get_table("secrets")).table_id
    status = await client.status()
    for answer in status.workers.values():
        assert not isinstance(answer, str), answer
        for t in answer.tablets:
            if t.table_id == table_id:
                return table_id, t.tablet_id
    raise AssertionError("the secrets table is not served")


def _write_ok(table):
    async def check() -> bool:
        try:
            await table.mutate_row(b"row", [SetCell("p", b"q", b"alice's secret")])
        except TabletStoreError:
            return False
        return True

    return check


@contextlib.asynccontextmanager
async def _raw(cluster: SecureCluster, auth: ClientAuth | None) -> AsyncIterator[TcpTransport]:
    transport = TcpTransport(timeout=10.0, auth=auth, connect_timeout=5.0)
    try:
        yield transport
    finally:
        await transport.close()


async def test_the_creator_reads_her_family_and_the_owner_is_admin(cluster: SecureCluster) -> None:
    alice, _, _ = await _alice_table(cluster)
    row = await alice.table("secrets").read_row(b"row")
    assert row is not None and row.cells[0].value == b"alice's secret"
    assert (await alice.describe_table("secrets")).admins == ["alice"]


async def test_spoofed_identity_on_raw_read_row_and_mutate_rows(cluster: SecureCluster) -> None:
    _, table_id, tablet_id = await _alice_table(cluster)
    async with _raw(cluster, ClientAuth(cluster.tls("bob"))) as transport:
        stub = TABLET.client(transport, cluster.worker_address)
        read = ReadRowsRequest(table_id, tablet_id, keys=(b"row",), identity="alice")
        reply = await stub.read_row(read)
        cells = [c for r in reply.rows for c in r.cells]  # type: ignore[union-attr]
        assert all(c.family != "p" for c in cells), "bob read alice's family by claiming her name"
        write = MutateRowsRequest(
            table_id,
            tablet_id,
            (RowMutation(b"row", (SetCell("p", b"q", b"bob was here"),)),),
            identity="alice",
        )
        response = await stub.mutate_rows(write)
        assert len(response.errors) == 1
        denied = response.errors[0].exception()
        assert isinstance(denied, PermissionDenied)
        assert "bob" in str(denied) and "secrets:p" in str(denied) and "write" in str(denied)
    alice = await cluster.client("alice")
    row = await alice.table("secrets").read_row(b"row")
    assert row is not None and row.cells[0].value == b"alice's secret"


async def test_bob_cannot_change_alices_acl_or_delete_her_table(cluster: SecureCluster) -> None:
    await _alice_table(cluster)
    bob = await cluster.client("bob")
    with pytest.raises(PermissionDenied, match=r"bob.*secrets.*admin"):
        await bob.update_family("secrets", ColumnFamily(name="p", acl=Acl(readers=["bob"])))
    with pytest.raises(PermissionDenied, match=r"bob.*secrets.*admin"):
        await bob.delete_table("secrets")
    with pytest.raises(PermissionDenied, match=r"bob.*secrets.*admin"):
        await bob.set_admins("secrets", ["bob"])
    schema = (await Catalog(cluster.coordinator).get_table("secrets")).schema
    assert schema.families["p"].acl.readers == ["alice"]


async def test_control_rpcs_from_a_client_certificate_are_refused(cluster: SecureCluster) -> None:
    _, table_id, tablet_id = await _alice_table(cluster)
    async with _raw(cluster, ClientAuth(cluster.tls("bob"))) as transport:
        stub = TABLET.client(transport, cluster.worker_address)
        with pytest.raises(PermissionDenied, match=r"bob may not call unload_tablet.*cluster"):
            await stub.unload_tablet(UnloadTabletRequest(table_id, tablet_id))
        with pytest.raises(PermissionDenied, match="load_tablet"):
            await stub.load_tablet(LoadTabletRequest(table_id, tablet_id))
    alice = await cluster.client("alice")
    assert (await alice.table("secrets").read_row(b"row")) is not None  # still served


@pytest.mark.parametrize("who", ["nothing", "other-ca", "expired", "plain"])
async def test_callers_without_a_valid_certificate_are_refused(
    cluster: SecureCluster, tmp_path: Path, who: str
) -> None:
    _, table_id, tablet_id = await _alice_table(cluster)
    auth: ClientAuth | None
    if who == "nothing":
        auth = ClientAuth(cluster.ca_only())
    elif who == "other-ca":
        other = tmp_path / "other"
        ca.init_ca(other)
        ca.issue(other, "alice")  # the right name, from the wrong CA
        auth = ClientAuth(
            TlsConfig(
                str(cluster.certs / "ca.pem"), str(other / "alice.pem"), str(other / "alice.key")
            )
        )
    elif who == "expired":
        now = datetime.datetime.now(datetime.UTC)
        ca.issue(
            cluster.certs,
            "alice-old",
            out=tmp_path / "old",
            not_before=now - datetime.timedelta(days=30),
            not_after=now - datetime.timedelta(days=1),
        )
        auth = ClientAuth(
            TlsConfig(
                str(cluster.certs / "ca.pem"),
                str(tmp_path / "old/alice-old.pem"),
                str(tmp_path / "old/alice-old.key"),
            )
        )
    else:
        auth = None
    async with _raw(cluster, auth) as transport:
        stub = TABLET.client(transport, cluster.worker_address)
        with pytest.raises(TabletStoreError) as caught:
            await stub.read_row(
                ReadRowsRequest(table_id, tablet_id, keys=(b"row",), identity="alice")
            )
    assert not caught.value.may_have_applied


async def test_tokens_authenticate_until_revoked(cluster: SecureCluster) -> None:
    _, table_id, tablet_id = await _alice_table(cluster)
    tokens = TokenStore(cluster.coordinator)
    token = await tokens.create("alice")
    client = await ClusterClient.open(cluster.url, tls=cluster.ca_only(), token=token)
    row = await client.table("secrets").read_row(b"row")
    assert row is not None and row.cells[0].value == b"alice's secret"
    await client.close()
    assert await tokens.revoke("alice") == 1
    with pytest.raises(PermissionDenied, match="unknown or was revoked"):
        await ClusterClient.open(cluster.url, tls=cluster.ca_only(), token=token)
    # The servers check it themselves, whatever a client does.
    async with _raw(cluster, ClientAuth(cluster.ca_only(), token)) as transport:
        stub = TABLET.client(transport, cluster.worker_address)
        with pytest.raises(PermissionDenied, match="unknown or was revoked"):
            await stub.read_row(ReadRowsRequest(table_id, tablet_id, keys=(b"row",)))


async def test_a_revoked_token_stops_its_live_connections(cluster: SecureCluster) -> None:
    """A connection authenticated by a token is not served once the token is revoked: its
    next calls fail PermissionDenied within the server's re-check interval (2 s)."""
    _, table_id, tablet_id = await _alice_table(cluster)
    tokens = TokenStore(cluster.coordinator)
    token = await tokens.create("alice")
    client = await ClusterClient.open(cluster.url, tls=cluster.ca_only(), token=token)
    async with _raw(cluster, ClientAuth(cluster.ca_only(), token)) as transport:
        stub = TABLET.client(transport, cluster.worker_address)
        request = ReadRowsRequest(table_id, tablet_id, keys=(b"row",))
        try:
            assert await client.table("secrets").read_row(b"row") is not None
            assert (await stub.read_row(request)).rows  # both connections are up and served
            await tokens.revoke("alice")

            async def refused(call) -> bool:  # type: ignore[no-untyped-def]
                try:
                    await call()
                except PermissionDenied as exc:
                    assert "revoked" in str(exc) or "refused" in str(exc), exc
                    return True
                return False

            await wait_for(
                lambda: refused(lambda: stub.read_row(request)), "the raw connection's refusal"
            )
            await wait_for(
                lambda: refused(lambda: client.table("secrets").read_row(b"row")),
                "the client's refusal",
            )
            with pytest.raises(PermissionDenied):  # and it stays refused
                await stub.read_row(request)
        finally:
            await client.close()


async def test_a_token_needs_tls() -> None:
    with pytest.raises(InvalidArgument, match="only over TLS"):
        await ClusterClient.open("memory://x", token="tst_abc")


@pytest.mark.parametrize("role", ["worker", "master"])
async def test_a_non_loopback_bind_without_tls_is_refused(role: str) -> None:
    coordinator = open_coordinator(f"memory://bind-{uuid.uuid4().hex[:8]}")
    try:
        with pytest.raises(
            InvalidArgument,
            match=r"refusing to serve the .* on '0.0.0.0' without authenticating callers",
        ):
            if role == "worker":
                await run_worker(coordinator, host="0.0.0.0", store_url="memory://x")
            else:
                await run_master(coordinator, host="0.0.0.0", store_url="memory://x")
    finally:
        await coordinator.close()


def test_check_bind_allows_loopback_tls_or_an_explicit_insecure() -> None:
    from tabletstore.security import check_bind

    check_bind("127.0.0.1", authenticated=False)
    check_bind("::1", authenticated=False)
    check_bind("localhost", authenticated=False)
    check_bind("0.0.0.0", authenticated=True)
    check_bind("0.0.0.0", authenticated=False, insecure=True)
    with pytest.raises(InvalidArgument, match="--insecure"):
        check_bind("10.1.2.3", authenticated=False)


async def test_the_status_endpoint_wants_a_certificate_or_the_status_token(
    cluster: SecureCluster,
) -> None:
    import aiohttp

    assert cluster.status_url.startswith("https://")
    metrics = f"{cluster.status_url}/metrics"
    anonymous = aiohttp.TCPConnector(ssl=cluster.ca_only().client_context())
    async with aiohttp.ClientSession(connector=anonymous) as session:
        async with session.get(metrics) as response:
            assert response.status == 401
        async with session.get(metrics, headers={"Authorization": "Bearer wrong"}) as response:
            assert response.status == 401
        auth = {"Authorization": f"Bearer {STATUS_TOKEN}"}
        async with session.get(metrics, headers=auth) as response:
            assert response.status == 200
            assert "tabletstore_permission_denied_total" in await response.text()
    with_cert = aiohttp.TCPConnector(ssl=cluster.tls("bob").client_context())
    async with aiohttp.ClientSession(connector=with_cert) as session:
        async with session.get(f"{cluster.status_url}/status") as response:
            assert response.status == 200
    plain = cluster.status_url.replace("https://", "http://")
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            async with session.get(f"{plain}/metrics") as response:
                assert response.status != 200


async def test_denials_are_counted(cluster: SecureCluster) -> None:
    import aiohttp

    _, table_id, tablet_id = await _alice_table(cluster)
    async with _raw(cluster, ClientAuth(cluster.tls("bob"))) as transport:
        stub = TABLET.client(transport, cluster.worker_address)
        with pytest.raises(PermissionDenied):
            await stub.unload_tablet(UnloadTabletRequest(table_id, tablet_id))
    connector = aiohttp.TCPConnector(ssl=cluster.tls("bob").client_context())
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(f"{cluster.status_url}/metrics") as response:
            text = await response.text()
    assert (
        'tabletstore_permission_denied_total{method="unload_tablet",permission="cluster"} 1.0'
        in text
    )


async def test_the_front_door_wants_a_bearer_token_and_acts_for_its_principal(
    cluster: SecureCluster,
) -> None:
    grpc = pytest.importorskip("grpc")
    # Imported on a thread: these imports take seconds on a loaded machine, and blocking the
    # event loop that long lets the in-process master's 5 s lease expire.
    bt = await asyncio.to_thread(importlib.import_module, "google.cloud.bigtable_v2.types.bigtable")
    server_module = await asyncio.to_thread(
        importlib.import_module, "tabletstore.bigtable_api.front_door"
    )
    BigtableApiServer = server_module.BigtableApiServer

    await _alice_table(cluster)
    ca.issue(cluster.certs, "frontdoor", role="function")
    tokens = TokenStore(cluster.coordinator)
    alice_token, bob_token = await tokens.create("alice"), await tokens.create("bob")
    client = await cluster.client("frontdoor")
    # The front door keeps a token's good answer token_recheck seconds of this clock.
    clock = ManualClock()
    server = BigtableApiServer(
        client, tls=cluster.tls("frontdoor"), tokens=tokens, plain_instance="i", clock=clock
    )
    port = await server.start()
    channel = grpc.aio.secure_channel(
        f"127.0.0.1:{port}",  # the certificate names 127.0.0.1 too
        grpc.ssl_channel_credentials((cluster.certs / "ca.pem").read_bytes()),
    )
    read_rows = channel.unary_stream(
        "/google.bigtable.v2.Bigtable/ReadRows",
        request_serializer=bt.ReadRowsRequest.serialize,
        response_deserializer=bt.ReadRowsResponse.deserialize,
    )
    request = bt.ReadRowsRequest(table_name="projects/p/instances/i/tables/secrets")

    async def families(token: str | None) -> set[str]:
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        found = set()
        async for response in read_rows(request, metadata=metadata):
            for chunk in response.chunks:
                if chunk.family_name:
                    found.add(chunk.family_name)
        return found

    try:
        assert await families(alice_token) == {"p"}
        assert await families(bob_token) == set()  # bob may not read alice's family
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await families(None)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        await tokens.revoke("alice")
        clock.advance(server_module.TOKEN_RECHECK)  # the longest a revoked token still works
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await families(alice_token)
        assert caught.value.code() == grpc.StatusCode.PERMISSION_DENIED
    finally:
        await channel.close()
        await server.stop()
        await client.close()


@pytest.mark.parametrize("verb", ["worker", "master", "bigtable-api"])
def test_the_cli_refuses_a_public_bind_without_tls(verb: str) -> None:
    from click.testing import CliRunner

    from tabletstore.cli.main import main

    result = CliRunner().invoke(main, ["--url", "etcd://127.0.0.1:1/x", verb, "--host", "0.0.0.0"])
    assert result.exit_code == 1
    assert "without authenticating callers" in result.output and "--insecure" in result.output


def test_local_stack_with_tls_serves_over_mutual_tls_and_etcd_wants_a_certificate(
    tmp_path: Path,
) -> None:
    """local-stack up --tls: etcd with client-cert auth, a master and a worker with their own
    certificates; the client certificate it prints works, none does not."""
    from tabletstore import connect
    from tabletstore.cli import localstack

    directory = tmp_path / "stack"
    stack = localstack.up(directory, workers=1, store_url=(tmp_path / "objects").as_uri(), tls=True)
    try:
        assert stack.cluster_url is not None and "&ca=" in stack.cluster_url
        db = connect(stack.cluster_url, tls=stack.tls("client"))
        try:
            table = db.create_table("t", ["f"])
            table.mutate_row(b"r", [SetCell("f", b"c", b"over TLS")])
            row = table.read_row(b"r")
            assert row is not None and row.cells[0].value == b"over TLS"
            assert db.describe_table("t").admins == ["client"]
        finally:
            db.close()
        plain_etcd = with_tls_only(stack).split("?", 1)[0]
        with pytest.raises(TabletStoreError):
            connect(plain_etcd, tls=stack.tls("client")).close()
        # etcd's own users: the printed URL can neither read nor write the schemas or ACLs; a
        # certificate without an etcd user gets nothing; the operator URL makes tokens.
        assert "tabletstore-reader@" in stack.cluster_url and "password_file=" in stack.cluster_url
        assert stack.admin_url is not None and "tabletstore-cluster@" in stack.admin_url

        async def etcd_checks() -> None:
            from tabletstore.coordination import paths

            reader = open_coordinator(stack.cluster_url)
            anonymous = open_coordinator(with_tls_only(stack))
            admin = open_coordinator(stack.admin_url)
            try:
                # The reader does not even read them (test_etcd_reader_keys.py); the cluster does.
                assert await admin.get(paths.schema("t")) is not None
                with pytest.raises(PermissionDenied):
                    await reader.get(paths.schema("t"))
                for client in (reader, anonymous):
                    with pytest.raises(PermissionDenied):
                        await client.put(paths.schema("t"), b"forged")
                    with pytest.raises(PermissionDenied):
                        await client.put(paths.acl("t"), b"forged")
                with pytest.raises(PermissionDenied):
                    await anonymous.get(paths.schema("t"))
                assert (await TokenStore(admin).create("carol")).startswith("tst_")
            finally:
                for c in (reader, anonymous, admin):
                    await c.close()

        asyncio.run(etcd_checks())
    finally:
        localstack.down(directory)


def with_tls_only(stack) -> str:  # type: ignore[no-untyped-def]
    """The stack's cluster URL with its client certificate and no etcd user."""
    from tabletstore.cli import localstack

    host_port = stack.etcd_url.split("://", 1)[1].split("/", 1)[0]
    return localstack.with_tls(f"etcd://{host_port}/cluster", stack.tls("client"))


async def test_etcd_users_and_roles_guard_the_schemas_and_acls(restartable_etcd) -> None:  # type: ignore[no-untyped-def]
    """etcd's own authentication: a client with no etcd user, or with the read-only
    one, cannot write the schema and ACL keys; the cluster's user can, also after an etcd
    restart (its token is gone: the coordinator authenticates again)."""
    from tabletstore.coordination import paths
    from tabletstore.coordination.etcd import EtcdGrant, enable_auth

    ns = "cluster"
    base = restartable_etcd.url(ns)
    secrets = restartable_etcd.root
    (secrets / "cluster.password").write_text("cluster-pw\n")
    (secrets / "reader.password").write_text("reader-pw\n")
    await enable_auth(
        base,
        root_password="root-pw",
        grants=[
            EtcdGrant("tabletstore-cluster", "cluster-pw", "readwrite", (ns,)),
            EtcdGrant("tabletstore-reader", "reader-pw", "read", (ns,)),
        ],
    )
    endpoint = restartable_etcd.endpoint

    def url(user: str, file: str, namespace: str = ns) -> str:
        return f"etcd://{user}@{endpoint}/{namespace}?password_file={secrets / file}"

    cluster = open_coordinator(url("tabletstore-cluster", "cluster.password"))
    reader = open_coordinator(url("tabletstore-reader", "reader.password"))
    anonymous = open_coordinator(base)
    other_ns = open_coordinator(url("tabletstore-cluster", "cluster.password", "elsewhere"))
    wrong = open_coordinator(f"etcd://tabletstore-cluster:nope@{endpoint}/{ns}")
    try:
        schema, acl = paths.schema("t"), paths.acl("t")
        await cluster.put(schema, b"{}")
        await cluster.put(acl, b"{}")
        lease = await cluster.grant_lease(5)
        await cluster.put(paths.server("w1"), b"w1", lease=lease)
        assert (await reader.get(schema)) is not None  # the reader reads...
        for client in (reader, anonymous):  # ...and neither it nor a stranger writes
            for key in (schema, acl, paths.TOKENS + "x"):
                with pytest.raises(PermissionDenied):
                    await client.put(key, b"forged")
            with pytest.raises(PermissionDenied):
                await client.delete(schema)
        with pytest.raises(PermissionDenied):
            await anonymous.get(schema)
        with pytest.raises(PermissionDenied):
            await other_ns.put("x", b"outside its namespace")
        with pytest.raises(PermissionDenied, match="refused the user"):
            await wrong.get(schema)
        assert "nope" not in wrong.url
        assert (await cluster.get(schema)).value == b"{}"  # type: ignore[union-attr]

        # A watch on a coordinator that does nothing else (a standby master's election): no
        # other call renews its token after the restart.
        watcher = open_coordinator(url("tabletstore-reader", "reader.password"))
        watch = watcher.watch_prefix(paths.SCHEMAS)
        await watch.__aenter__()
        restartable_etcd.stop()  # etcd forgets its tokens
        restartable_etcd.start()
        await cluster.put(schema, b'{"v": 2}')
        assert (await reader.get(schema)).value == b'{"v": 2}'  # type: ignore[union-attr]
        # The watch resumes with a new token (etcd would cancel it silently otherwise).
        async with asyncio.timeout(DEADLINE):
            event = await anext(aiter(watch))
        assert event.kv.key == schema and event.kv.value == b'{"v": 2}'
        await watcher.close()
    finally:
        for c in (cluster, reader, anonymous, other_ns, wrong):
            await c.close()


def test_etcd_urls_carry_a_user_and_a_password_file(tmp_path: Path) -> None:
    from tabletstore.coordination.etcd import parse_etcd_credentials, parse_etcd_url, redact_url

    (tmp_path / "pw").write_text("s3cret\n")
    url = f"etcd://alice@127.0.0.1:2379/ns?password_file={tmp_path / 'pw'}"
    assert parse_etcd_credentials(url) == ("alice", "s3cret")
    assert parse_etcd_url(url) == ([("127.0.0.1", 2379)], "ns")
    assert parse_etcd_credentials("etcd://a:b%40c@h:1/ns") == ("a", "b@c")
    assert redact_url("etcd://a:b@h:1/ns") == "etcd://a:***@h:1/ns"
    assert parse_etcd_credentials("etcd://h:1/ns") is None
    with pytest.raises(InvalidArgument, match="no password"):
        parse_etcd_credentials("etcd://alice@h:1/ns")
    with pytest.raises(InvalidArgument, match="needs a user"):
        parse_etcd_credentials(f"etcd://h:1/ns?password_file={tmp_path / 'pw'}")
    with pytest.raises(InvalidArgument, match="not both"):
        parse_etcd_credentials(f"etcd://a:b@h:1/ns?password_file={tmp_path / 'pw'}")
    with pytest.raises(InvalidArgument, match="cannot read"):
        parse_etcd_credentials(f"etcd://a@h:1/ns?password_file={tmp_path / 'missing'}")


async def test_an_etcd_users_watch_over_tls_survives_an_etcd_restart(tmp_path: Path) -> None:
    """etcd with client certificates and users (as local-stack up --tls and bench.chaos --tls
    run it): a watch of a coordinator that does nothing else (a standby master waiting for
    the master lock) sees a change made after etcd restarted, and lost its token."""
    from tabletstore.cli import localstack

    certs = localstack.make_certs(tmp_path / "tls")

    def files(name: str) -> TlsConfig:
        return localstack._tls_files(certs, name)

    record, port = await asyncio.to_thread(
        localstack.start_etcd,
        tmp_path / "etcd",
        log=tmp_path / "etcd.log",
        fast_leases=True,
        tls=files("etcd"),
    )
    try:
        users = await asyncio.to_thread(
            localstack.etcd_auth,
            tmp_path,
            certs,
            localstack.with_tls(record.url, files("master")),
            namespaces=("ns",),
        )
        user_url = localstack.with_user(
            f"etcd://127.0.0.1:{port}/ns", users, localstack.CLUSTER_USER
        )
        url = localstack.with_tls(user_url, files("master"))
        writer, watcher = open_coordinator(url), open_coordinator(url)
        try:
            await writer.put("k/0", b"before")
            watch = watcher.watch_prefix("k/")
            await watch.__aenter__()
            await asyncio.to_thread(localstack.stop, record)
            record = await asyncio.to_thread(
                localstack.spawn, "etcd", record.argv, log=tmp_path / "etcd.log", url=record.url
            )
            restarted = record
            await asyncio.to_thread(
                localstack.wait_healthy,
                record,
                lambda: localstack.etcd_answers(restarted),
                localstack.HEALTH_DEADLINE,
            )
            await writer.put("k/1", b"after the restart")
            async with asyncio.timeout(DEADLINE):
                event = await anext(aiter(watch))
            assert event.kv.key == "k/1" and event.kv.value == b"after the restart"
        finally:
            await watcher.close()
            await writer.close()
    finally:
        await asyncio.to_thread(localstack.stop, record)
