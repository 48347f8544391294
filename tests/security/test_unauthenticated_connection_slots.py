"""Connection slots held for ever before authentication.

The attack: TLS connections without a client certificate, from several loopback source
addresses, send the hello and then a frame header announcing exactly the largest frame, and
nothing more. Such a connection was paused (its frame did not fit its own cap) and so exempt
from the stall and idle timeouts; enough of them took every slot of the server (the worker's
and the master's port run this server), and authenticated clients were refused.

Now a connection that has proven nothing counts in a small gate of its own, may send nothing
but its hello and one small AUTH frame (the header is refused at once), and must be
authenticated within ``handshake_timeout``; authenticated clients keep being served. Bounded:
32 attack connections from four addresses, a few seconds.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from tabletstore.errors import PermissionDenied
from tabletstore.rpc import frames
from tabletstore.rpc.auth import ClientAuth
from tabletstore.rpc.frames import Kind
from tabletstore.rpc.tcp import RpcClient
from tabletstore.security import TlsConfig
from tests.security.transport_support import (
    CODEC,
    GOOD_TOKEN,
    Blob,
    Certs,
    attacker_context,
    client,
    close_all,
    closing_error,
    open_raw,
    secure_server,
    until,
)

pytestmark = pytest.mark.timeout(120)

SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")


async def test_unauthenticated_connections_cannot_take_the_servers_slots(
    tmp_path: Path,
) -> None:
    certs = Certs(tmp_path)
    async with secure_server(
        certs,
        max_connections=16,
        max_connections_per_peer=8,
        max_unauthenticated=4,
        max_unauthenticated_per_peer=2,
        handshake_timeout=2.0,
        max_frame=1 << 20,
    ) as server:
        anonymous = attacker_context(certs.ca)  # trusts the CA, presents no certificate
        header = frames.HEADER.pack(server.max_frame, Kind.REQUEST, 1)
        conns = []
        closed_before_tls = 0
        for source in SOURCES:
            for _ in range(8):
                try:
                    reader, writer = await open_raw(server, anonymous, source)
                except (ConnectionError, ssl.SSLError):  # over the caps: closed unread
                    closed_before_tls += 1
                    continue
                writer.write(header)
                conns.append((reader, writer))
        try:
            # The victim, with a certificate, is served throughout.
            async with client(certs, server) as victim:
                for _ in range(5):
                    assert await victim.call("echo", Blob(b"ok"), timeout=10) == Blob(b"ok")
            # Every attack connection was refused or closed, never held.
            errors = await asyncio.gather(*(closing_error(r, 20) for r, _ in conns))
            refusals = [e for e in errors if e is not None]
            assert refusals or closed_before_tls
            assert all(
                isinstance(e, PermissionDenied) or "max_unauthenticated" in str(e) for e in refusals
            ), refusals
            await until(lambda: server.unauthenticated.open == 0, "no attacker is left open")
            assert server.gate.open == 0
        finally:
            close_all(conns)


async def test_a_connection_that_proves_nothing_is_closed_within_the_handshake_timeout(
    tmp_path: Path,
) -> None:
    certs = Certs(tmp_path)
    async with secure_server(certs, handshake_timeout=0.5) as server:
        anonymous = attacker_context(certs.ca)
        reader, writer = await open_raw(server, anonymous)  # the hello, then silence
        loop = asyncio.get_running_loop()
        start = loop.time()
        await closing_error(reader, 20)
        assert loop.time() - start < 10
        assert server.unauthenticated.refused["handshake"] == 1
        writer.close()
        # A token holder still gets in, within the unauthenticated gate, then moves out of it.
        auth = ClientAuth(TlsConfig(certs.ca), GOOD_TOKEN)
        async with RpcClient("127.0.0.1", server.port, codec=CODEC, auth=auth) as holder:
            big = b"x" * (300 * 1024)  # pipelined right behind the AUTH frame
            assert await holder.call("echo", Blob(big), timeout=10) == Blob(big[:16])
            assert server.gate.open == 1 and server.unauthenticated.open == 0


async def test_connections_over_the_caps_are_closed_before_their_tls_handshake(
    tmp_path: Path,
) -> None:
    """Plain TCP connections that never start TLS, from one address: the server admits
    ``max_unauthenticated_per_peer`` of them to a handshake and closes the rest at once,
    unread, instead of holding a TLS handshake (and its memory) open for each until the
    handshake timeout. A client with a certificate is served meanwhile."""
    certs = Certs(tmp_path)
    async with secure_server(
        certs, max_unauthenticated=16, max_unauthenticated_per_peer=4, handshake_timeout=60.0
    ) as server:
        loop = asyncio.get_running_loop()
        socks = []
        try:
            for _ in range(20):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setblocking(False)
                sock.bind(("127.0.0.2", 0))
                await loop.sock_connect(sock, ("127.0.0.1", server.port))
                socks.append(sock)

            async def closed(sock: socket.socket) -> bool:
                try:
                    async with asyncio.timeout(5):
                        return await loop.sock_recv(sock, 1) == b""
                except TimeoutError:
                    return False  # still open: held in its handshake
                except ConnectionError:
                    return True

            results = await asyncio.gather(*(closed(s) for s in socks))
            assert sum(results) == 16, results  # all but the four admitted, within 5 s
            assert server.handshaking.open == 4
            assert server.handshaking.refused["peer"] == 16
            async with client(certs, server) as victim:
                assert await victim.call("echo", Blob(b"ok"), timeout=10) == Blob(b"ok")
        finally:
            for sock in socks:
                sock.close()
        await until(lambda: server.handshaking.open == 0, "the admitted four are let go")
