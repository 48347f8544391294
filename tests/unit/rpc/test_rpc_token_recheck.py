"""A token connection's token is checked again while the connection lives: revoked,
the connection is refused at its next request; while the coordinator cannot answer, the last
good check holds for ``token_stale_limit`` seconds, then requests fail Unavailable."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tabletstore.errors import InvalidArgument, PermissionDenied, TabletStoreError, Unavailable
from tabletstore.rpc.auth import ClientAuth, ServerAuth, current_principal
from tabletstore.rpc.rpc_client import RpcClient
from tabletstore.rpc.rpc_server import RpcServer
from tabletstore.security import Principal, TlsConfig, ca

pytestmark = pytest.mark.timeout(60)
DEADLINE = 30.0


class FakeTokens:
    """A verifier whose answer the test sets: a principal, or an error to raise."""

    def __init__(self) -> None:
        self.answer: Principal | TabletStoreError = Principal("alice", "client", "token")
        self.calls = 0

    async def verify(self, token: str) -> Principal:
        self.calls += 1
        if isinstance(self.answer, TabletStoreError):
            raise self.answer
        return self.answer


async def _who() -> str:
    principal = current_principal()
    return principal.name if principal is not None else "-"


async def _until_raises(client: RpcClient, error: type[Exception]) -> Exception:
    loop = asyncio.get_running_loop()
    end = loop.time() + DEADLINE
    while True:
        try:
            await client.call("who", None)
        except error as exc:
            return exc
        assert loop.time() < end, f"no {error.__name__} before the deadline"
        await asyncio.sleep(0.02)


def test_recheck_settings_are_checked(tmp_path: Path) -> None:
    ca.init_ca(tmp_path)
    with pytest.raises(InvalidArgument, match="token_recheck"):
        ServerAuth(TlsConfig(str(tmp_path / "ca.pem")), token_recheck=0)
    with pytest.raises(InvalidArgument, match="token_stale_limit"):
        ServerAuth(TlsConfig(str(tmp_path / "ca.pem")), token_recheck=5, token_stale_limit=1)


async def test_a_token_is_rechecked_and_revocation_ends_the_connection(tmp_path: Path) -> None:
    ca.init_ca(tmp_path)
    issued = ca.issue(tmp_path, "server", role="worker")
    server_tls = TlsConfig(str(tmp_path / "ca.pem"), str(issued.cert), str(issued.key))
    tokens = FakeTokens()
    auth = ServerAuth(server_tls, tokens, token_recheck=0.05, token_stale_limit=0.5)
    async with RpcServer({"who": _handler}, auth=auth) as server:
        client = RpcClient(
            "127.0.0.1", server.port, auth=ClientAuth(TlsConfig(str(tmp_path / "ca.pem")), "tst_x")
        )
        try:
            assert await client.call("who", None) == "alice"
            # The coordinator stops answering: served on the last good check for a while...
            tokens.answer = Unavailable("etcd is down")
            assert await client.call("who", None) == "alice"
            # ...then refused as Unavailable (retryable), on the same connection.
            await _until_raises(client, Unavailable)
            tokens.answer = Principal("alice", "client", "token")
            assert await client.call("who", None) == "alice"
            calls = tokens.calls
            tokens.answer = PermissionDenied("the bearer token is unknown or was revoked")
            refusal = await _until_raises(client, PermissionDenied)
            assert "revoked" in str(refusal)
            assert tokens.calls > calls
            with pytest.raises(PermissionDenied):  # refused for good, new connection or not
                await client.call("who", None)
        finally:
            await client.close()


async def _handler(_: object) -> str:
    return await _who()
