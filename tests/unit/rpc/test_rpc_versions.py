"""Protocol versions (tabletstore.rpc.versions): peers one version apart talk at the older one,
peers two apart are refused with both versions named, and what a version added is never sent
on an older connection."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator

import pytest

from tabletstore.errors import InvalidArgument, Unimplemented
from tabletstore.rpc.codec import Codec
from tabletstore.rpc.services import MASTER, TABLET, MasterService, TabletService
from tabletstore.rpc.tcp import RpcClient, RpcServer
from tabletstore.rpc.versions import (
    LOAD_TABLET_AT_VERSION,
    OLDEST_PROTOCOL_VERSION,
    PROTOCOL_VERSION,
    REQUEST_AS_VERSION,
    SET_REPLICA_VERSION,
    SPOKEN,
    Versions,
    negotiate,
    require,
    spoken,
)

pytestmark = pytest.mark.timeout(60)

N = PROTOCOL_VERSION


@dataclasses.dataclass(frozen=True, slots=True)
class Echo:
    text: str


CODEC = Codec()
CODEC.register(1, Echo)


# -- the negotiation, pure ---------------------------------------------------------------------


def test_this_build_speaks_n_and_n_minus_1() -> None:
    assert (SPOKEN.lowest, SPOKEN.highest) == (N - 1, N) == (OLDEST_PROTOCOL_VERSION, N)
    assert str(SPOKEN) == f"versions {N - 1} to {N}"
    assert str(Versions(N, N)) == f"version {N}"
    # The methods that came with the newest version are gated by it.
    assert LOAD_TABLET_AT_VERSION == SET_REPLICA_VERSION == N
    assert TABLET.method(TabletService.load_tablet_at).since == N
    assert MASTER.method(MasterService.set_replica).since == N
    assert MASTER.method(MasterService.restore_copied).since == N
    assert MASTER.method(MasterService.create_table).since == 0
    assert TABLET.method(TabletService.load_tablet).since == 0
    assert REQUEST_AS_VERSION <= N


@pytest.mark.parametrize(
    ("ours", "peer_highest", "expected"),
    [
        (Versions(N - 1, N), N, N),  # same release
        (Versions(N - 1, N), N + 1, N),  # a newer peer comes down to us
        (Versions(N - 1, N), N - 1, N - 1),  # an older peer: its version
        (Versions(N - 1, N - 1), N, N - 1),  # we are the older one
        (Versions(N, N + 1), N, N),  # the next release meets this one
    ],
)
def test_negotiate_uses_the_highest_version_both_speak(
    ours: Versions, peer_highest: int, expected: int
) -> None:
    assert negotiate(ours, peer_highest, peer="p", peer_role="client") == expected


def test_negotiate_is_the_same_on_both_sides() -> None:
    """Each side computes the version from the other's hello alone: they must agree."""
    ranges = [Versions(lo, hi) for lo in range(4, 9) for hi in range(lo, 9) if hi - lo <= 1]
    for a in ranges:
        for b in ranges:
            try:
                at_a = negotiate(a, b.highest, peer="b", peer_role="server")
            except Unimplemented:
                at_a = None
            try:
                at_b = negotiate(b, a.highest, peer="a", peer_role="client")
            except Unimplemented:
                at_b = None
            common = set(range(a.lowest, a.highest + 1)) & set(range(b.lowest, b.highest + 1))
            if common:  # both agree on the highest common version
                assert at_a == at_b == max(common), (a, b)
            else:  # at least one side refuses: the connection is not used
                assert at_a is None or at_b is None, (a, b)


def test_a_peer_two_versions_behind_is_refused_naming_both() -> None:
    with pytest.raises(Unimplemented) as refused:
        negotiate(SPOKEN, N - 2, peer="10.0.0.9:7000", peer_role="client")
    message = str(refused.value)
    assert f"client 10.0.0.9:7000 speaks tabletstore RPC protocol version {N - 2} at most" in (
        message
    )
    assert f"this side speaks versions {N - 1} to {N}" in message
    assert "docs/operations/upgrades.md" in message


def test_spoken_caps_the_highest_version() -> None:
    assert spoken() == SPOKEN
    assert spoken(N - 1) == Versions(N - 1, N - 1)
    assert spoken(N) == SPOKEN
    for bad in (N - 2, N + 1):
        with pytest.raises(
            InvalidArgument, match=rf"speaks \(versions {N - 1} to {N}\), got {bad}"
        ):
            spoken(bad)
    with pytest.raises(InvalidArgument, match="lowest <= highest"):
        Versions(N, N - 1)


def test_require_names_the_feature_and_both_versions() -> None:
    require(N, LOAD_TABLET_AT_VERSION, "load_tablet_at", connection="to server s")
    with pytest.raises(Unimplemented) as refused:
        require(N - 1, LOAD_TABLET_AT_VERSION, "load_tablet_at", connection="to server s:1")
    assert f"load_tablet_at needs tabletstore RPC protocol version {N}" in str(refused.value)
    assert f"the connection to server s:1 speaks version {N - 1}" in str(refused.value)


# -- over real sockets -------------------------------------------------------------------------


class _Service:
    def __init__(self) -> None:
        self.calls = 0

    async def echo(self, request: Echo) -> Echo:
        self.calls += 1
        return request

    async def count(self, request: Echo) -> AsyncIterator[int]:
        for i in range(3):
            yield i


@contextlib.asynccontextmanager
async def _server(versions: Versions, service: _Service) -> AsyncIterator[RpcServer]:
    handlers = {"echo": service.echo, "count": service.count, "load_tablet_at": service.echo}
    async with RpcServer(handlers, codec=CODEC, versions=versions) as server:  # type: ignore[arg-type]
        yield server


async def _connection_versions(server: RpcServer, client: RpcClient) -> tuple[int, int]:
    """The version the client's connection and the server's side of it use."""
    conn = await client.connection()
    (server_side,) = server._connections  # one connection, this one
    return conn.version, server_side.version


@pytest.mark.parametrize(
    ("server_versions", "client_versions", "expected"),
    [
        (SPOKEN, SPOKEN, N),
        (SPOKEN, spoken(N - 1), N - 1),  # a client of the previous release
        (spoken(N - 1), SPOKEN, N - 1),  # a server of the previous release
    ],
)
async def test_peers_one_version_apart_talk_at_the_older_one(
    server_versions: Versions, client_versions: Versions, expected: int
) -> None:
    service = _Service()
    async with (
        _server(server_versions, service) as server,
        RpcClient("127.0.0.1", server.port, codec=CODEC, versions=client_versions) as client,
    ):
        assert await client.call("echo", Echo("hi")) == Echo("hi")
        assert [i async for i in client.stream("count", Echo(""))] == [0, 1, 2]
        assert await _connection_versions(server, client) == (expected, expected)


async def test_a_client_two_versions_behind_is_refused_with_both_versions() -> None:
    """The server refuses the hello; the client's call fails Unimplemented (not Indeterminate:
    nothing ran) with the server's reason, and the server serves others as before."""
    service = _Service()
    async with (
        _server(SPOKEN, service) as server,
        RpcClient("127.0.0.1", server.port, codec=CODEC, versions=Versions(N - 2, N - 2)) as old,
    ):
        for _ in range(2):  # a second call reconnects and is refused again, just as clearly
            with pytest.raises(Unimplemented) as refused:
                await old.call("echo", Echo("x"))
            message = str(refused.value)
            assert f"speaks tabletstore RPC protocol version {N - 2} at most" in message
            assert f"this side speaks versions {N - 1} to {N}" in message
        assert service.calls == 0
        async with RpcClient("127.0.0.1", server.port, codec=CODEC) as current:
            assert await current.call("echo", Echo("still")) == Echo("still")


async def test_a_server_two_versions_behind_is_refused_by_the_client() -> None:
    service = _Service()
    async with (
        _server(Versions(N - 2, N - 2), service) as server,
        RpcClient("127.0.0.1", server.port, codec=CODEC) as client,
    ):
        with pytest.raises(Unimplemented) as refused:
            await client.call("echo", Echo("x"))
        message = str(refused.value)
        assert f"server {server.address} speaks tabletstore RPC protocol version {N - 2}" in (
            message
        )
        assert f"this side speaks versions {N - 1} to {N}" in message
        assert service.calls == 0


async def test_request_as_reaches_a_server_of_the_previous_version() -> None:
    """REQUEST_AS came with version 7, which the previous release speaks: sent to it."""
    service = _Service()
    async with _server(spoken(N - 1), service) as old:
        async with RpcClient("127.0.0.1", old.port, codec=CODEC) as client:
            assert await client.call("echo", Echo("as"), on_behalf="alice") == Echo("as")
    assert REQUEST_AS_VERSION <= N - 1
    assert service.calls == 1


async def test_a_method_a_version_added_is_not_sent_to_a_server_of_the_previous_version() -> None:
    """``load_tablet_at`` (version 8) to a worker of version 7: Unimplemented before anything
    is sent, so the master sends it ``load_tablet`` instead."""
    service = _Service()
    async with _server(spoken(N - 1), service) as old:
        async with RpcClient("127.0.0.1", old.port, codec=CODEC) as client:
            with pytest.raises(Unimplemented) as refused:
                await client.call("load_tablet_at", Echo("x"), since=N)
            assert f"method 'load_tablet_at' needs tabletstore RPC protocol version {N}" in str(
                refused.value
            )
            assert service.calls == 0  # never sent
            assert await client.call("echo", Echo("after")) == Echo("after")
    async with (
        _server(SPOKEN, service) as current,
        RpcClient("127.0.0.1", current.port, codec=CODEC) as client,
    ):
        assert await client.call("load_tablet_at", Echo("x"), since=N) == Echo("x")


def test_a_restore_request_without_what_a_copy_verified_is_what_older_builds_send() -> None:
    """RestoreTableRequest's ``copied`` field is optional on the wire: without it the request
    is the two fields every build has sent and read (an older client's request decodes here,
    and one from here decodes on an older master); with it, a third, decoded with its type
    checked."""
    from tabletstore.rpc import messages as m
    from tabletstore.rpc.wire import register_all

    @dataclasses.dataclass(frozen=True, slots=True)
    class OlderRestore:  # the request as builds before the field define it
        backup_id: str
        new_table: str

    @dataclasses.dataclass(frozen=True, slots=True)
    class Garbled:
        backup_id: str
        new_table: str
        copied: int

    older, garbled = Codec(), Codec()
    older.register(104, OlderRestore)
    garbled.register(104, Garbled)
    this = register_all(Codec())
    plain = m.RestoreTableRequest("b1", "t2")
    assert this.encode(plain) == older.encode(OlderRestore("b1", "t2"))
    assert this.decode(older.encode(OlderRestore("b1", "t2"))) == plain
    verified = m.RestoreTableRequest(
        "b1", "t2", m.CopiedBackup(1, {"tables/x/t0/f/a.parquet": 10}, {"k": "sha256:00"})
    )
    assert this.decode(this.encode(verified)) == verified
    with pytest.raises(InvalidArgument, match=r"RestoreTableRequest .*'copied' must be"):
        this.decode(garbled.encode(Garbled("b1", "t2", 5)))
