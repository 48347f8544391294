"""Tokens that never expire, and tokens on the command line.

The attack: a bearer token, once leaked (a log, a shell history, another user reading
``/proc/PID/cmdline`` while ``--token`` was on it), worked for ever. Now every token expires
(30 days unless ``tokens create --days``; records made before tokens had an expiry expire 30
days after their creation), servers that check a live connection's token again end the
connection when it expires, and ``--token-file`` / ``TABLETSTORE_TOKEN`` keep it off command
lines. A real RPC server on loopback, the clock moved forward by the test.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletstore.coordination import open_coordinator, paths
from tabletstore.coordination import tokens as tokens_module
from tabletstore.coordination.tokens import DEFAULT_TTL, TokenStore, token_digest
from tabletstore.errors import PermissionDenied
from tabletstore.rpc.auth import ClientAuth, ServerAuth, current_principal
from tabletstore.rpc.tcp import RpcClient, RpcServer
from tabletstore.security import TlsConfig
from tests.security.transport_support import Certs

pytestmark = pytest.mark.timeout(120)


class Clock:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1_800_000_000.0
        monkeypatch.setattr(tokens_module, "wall_time", lambda: self.now)


async def test_a_token_expires_and_an_old_record_too(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    coordinator = open_coordinator(f"memory://tokens-{uuid.uuid4().hex[:8]}")
    try:
        store = TokenStore(coordinator)
        short = await store.create("t1", ttl=60)
        default = await store.create("t2")
        assert (await store.verify(short)).name == "t1"
        clock.now += 61
        with pytest.raises(PermissionDenied, match="expired"):
            await store.verify(short)
        assert (await store.verify(default)).name == "t2"
        clock.now += DEFAULT_TTL
        with pytest.raises(PermissionDenied, match="expired"):
            await store.verify(default)
        # A record written before tokens had an expiry: DEFAULT_TTL after its creation.
        old = "tst_old"
        record = {"name": "t3", "role": "master", "created": clock.now - DEFAULT_TTL - 1}
        await coordinator.put(paths.TOKENS + token_digest(old), json.dumps(record).encode())
        with pytest.raises(PermissionDenied, match="expired"):
            await store.verify(old)
        listed = {info.name: info.expires for info in await store.list()}
        assert listed["t3"] == record["created"] + DEFAULT_TTL
    finally:
        await coordinator.close()


async def _who(request: object) -> str:
    principal = current_principal()
    return principal.name if principal is not None else "-"


async def test_an_expired_token_ends_a_live_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock(monkeypatch)
    certs = Certs(tmp_path)
    coordinator = open_coordinator(f"memory://tokens-{uuid.uuid4().hex[:8]}")
    try:
        token = await TokenStore(coordinator).create("t1", ttl=3600)
        auth = ServerAuth(
            certs.tls("server", "worker"), TokenStore(coordinator), token_recheck=0.05
        )
        async with RpcServer({"who": _who}, auth=auth) as server:  # type: ignore[dict-item]
            client = RpcClient(
                "127.0.0.1", server.port, auth=ClientAuth(TlsConfig(certs.ca), token)
            )
            try:
                assert await client.call("who", None) == "t1"
                clock.now += 3601
                loop = asyncio.get_running_loop()
                end = loop.time() + 30
                while True:  # refused within a recheck or two
                    try:
                        await client.call("who", None)
                    except PermissionDenied as exc:
                        assert "expired" in str(exc)
                        break
                    assert loop.time() < end, "the expired token kept working"
                    await asyncio.sleep(0.05)
            finally:
                await client.close()
    finally:
        await coordinator.close()


def test_the_token_can_come_from_a_file(tmp_path: Path) -> None:
    from tabletstore.cli.main import main

    runner = CliRunner()
    secret = tmp_path / "token"
    secret.write_text("tst_from_a_file\n")
    # Read: the embedded database refuses a token (tokens are for a cluster), naming it.
    result = runner.invoke(main, ["--url", "memory://x", "--token-file", str(secret), "ls"])
    assert result.exit_code != 0 and "token are for a cluster" in result.output, result.output
    assert runner.invoke(main, ["--url", "memory://x", "ls"]).exit_code == 0
    both = runner.invoke(
        main, ["--url", "memory://x", "--token", "tst_x", "--token-file", str(secret), "ls"]
    )
    assert both.exit_code != 0 and "give the token once" in both.output
    empty = tmp_path / "empty"
    empty.write_text("")
    result = runner.invoke(main, ["--url", "memory://x", "--token-file", str(empty), "ls"])
    assert result.exit_code != 0 and "is empty" in result.output
