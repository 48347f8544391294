"""What the transport attacks share: a cluster CA in a temporary directory, an RPC server with
mutual TLS and bearer tokens on loopback (the code every worker and master port runs), and raw
TLS sockets from chosen loopback source addresses, as an attacker on the same network would
open them.

Every attack is bounded in count and time and stays on 127.0.0.0/8.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path

from tabletstore.errors import TabletStoreError
from tabletstore.options import RpcServerOptions
from tabletstore.rpc import frames
from tabletstore.rpc.auth import ClientAuth, ServerAuth
from tabletstore.rpc.codec import Codec, decode_error
from tabletstore.rpc.frames import Kind
from tabletstore.rpc.tcp import RpcClient, RpcServer
from tabletstore.security import Principal, TlsConfig, ca

#: The one token the fake verifier accepts.
GOOD_TOKEN = "tst_good"


@dataclasses.dataclass(frozen=True, slots=True)
class Blob:
    data: bytes = b""


CODEC = Codec()
CODEC.register(1, Blob)


class Tokens:
    """A token verifier that knows one token (the coordinator's TokenStore in a real server)."""

    async def verify(self, token: str) -> Principal:
        from tabletstore.errors import PermissionDenied

        if token != GOOD_TOKEN:
            raise PermissionDenied("the bearer token is unknown or was revoked")
        return Principal("t1", "client", "token")


class Certs:
    """A CA and certificates issued on demand."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        ca.init_ca(directory)
        self.ca = str(directory / "ca.pem")

    def tls(self, name: str, role: str = "client", hosts: tuple[str, ...] = ()) -> TlsConfig:
        """NAME's certificate: issued on first use, the same files after."""
        cert, key = self.dir / f"{name}.pem", self.dir / f"{name}.key"
        if not cert.exists():
            ca.issue(self.dir, name, role=role, hosts=hosts)
        return TlsConfig(self.ca, str(cert), str(key))


async def echo(request: Blob) -> Blob:
    return Blob(request.data[:16])


@contextlib.asynccontextmanager
async def secure_server(certs: Certs, **options: object) -> AsyncIterator[RpcServer]:
    """A worker-role RPC server with mutual TLS and tokens, and ``echo``."""
    auth = ServerAuth(certs.tls("server", "worker"), Tokens())
    server = RpcServer(
        {"echo": echo},
        codec=CODEC,
        auth=auth,
        options=dataclasses.replace(RpcServerOptions(), **options),  # type: ignore[arg-type]
    )
    await server.start()
    try:
        yield server
    finally:
        await server.close(grace=0.5)


def client(certs: Certs, server: RpcServer, name: str = "u1") -> RpcClient:
    """An authenticated client (a certificate of its own)."""
    return RpcClient("127.0.0.1", server.port, codec=CODEC, auth=ClientAuth(certs.tls(name)))


def attacker_context(ca_file: str, tls: TlsConfig | None = None) -> ssl.SSLContext:
    """A TLS client context trusting the cluster CA, with a certificate only if given."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(ca_file)
    if tls is not None and tls.cert is not None:
        ctx.load_cert_chain(tls.cert, tls.key)
    return ctx


async def open_raw(
    server: RpcServer, ctx: ssl.SSLContext, source: str = "127.0.0.1"
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TLS socket from ``source`` that has sent and read the hello."""
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.port, ssl=ctx, local_addr=(source, 0)
    )
    writer.write(frames.encode_hello(frames.DEFAULT_MAX_FRAME))
    await writer.drain()
    return reader, writer


async def closing_error(
    reader: asyncio.StreamReader, deadline: float = 30.0
) -> TabletStoreError | None:
    """The ERROR (request id 0) the server sends before it closes (None if it just closes).
    Raises TimeoutError if the connection is still open after ``deadline`` seconds."""
    async with asyncio.timeout(deadline):
        try:
            await reader.readexactly(frames.HELLO_SIZE)
            while True:
                head = await reader.readexactly(frames.HEADER.size)
                length, kind, rid = frames.HEADER.unpack(head)
                body = await reader.readexactly(length - 5)
                if (kind, rid) == (Kind.ERROR, 0):
                    return decode_error(body)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            return None


async def until(condition: Callable[[], bool], what: str, deadline: float = 30.0) -> None:
    """Wait for ``condition`` (polled), failing with ``what`` after ``deadline`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not condition():
        if loop.time() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        await asyncio.sleep(0.02)


def close_all(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in conns:
        writer.close()
