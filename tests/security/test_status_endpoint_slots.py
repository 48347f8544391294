"""The status endpoint's places held by unfinished request lines.

The attack: connections that send the start of a request line and nothing more. The endpoint
took at most 64 connections and answered any more with 503, so 64 such connections (no
credentials needed) made it answer 503 to every scraper for as long as they stayed open.

Now each source address has at most ``max_per_peer`` places, a request's head must arrive
within ``head_timeout``, and when every place is taken a newcomer takes the place of the one
that has waited longest for a request; with TLS, an unauthenticated request is answered 401 and
its connection closed. Bounded: 24 attack connections from four loopback addresses, held for
at most 20 s.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tabletstore.ops.metrics import WorkerMetrics
from tabletstore.ops.status_http import StatusServer
from tests.security.transport_support import Certs, attacker_context, close_all

pytestmark = pytest.mark.timeout(120)

SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
TOKEN = "scraper-secret"


async def _status(url: str) -> object:
    raise AssertionError("not asked for")


@contextlib.asynccontextmanager
async def _endpoint(certs: Certs) -> AsyncIterator[tuple[str, int]]:
    async with StatusServer(
        WorkerMetrics("w"),
        _status,  # type: ignore[arg-type]
        max_connections=12,
        head_timeout=30.0,  # longer than the attack: the places must be won back without it
        tls=certs.tls("w", "worker"),
        token=TOKEN,
    ) as http:
        host, port = http.url.removeprefix("https://").rsplit(":", 1)
        yield host, int(port)


async def test_unfinished_request_lines_cannot_keep_scrapers_out(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    ctx = attacker_context(certs.ca)
    async with _endpoint(certs) as (host, port):
        conns = []
        for source in SOURCES:
            for _ in range(6):
                with contextlib.suppress(ConnectionError, OSError):
                    reader, writer = await asyncio.open_connection(
                        host, port, ssl=ctx, local_addr=(source, 0)
                    )
                    writer.write(b"GET /metrics HTTP/1.1\r\nHo")
                    conns.append((reader, writer))
        try:
            # A scraper with the token is served at once, every time.
            for _ in range(5):
                reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
                writer.write(
                    b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                    b"Authorization: Bearer " + TOKEN.encode() + b"\r\n\r\n"
                )
                async with asyncio.timeout(10):
                    status = await reader.readline()
                writer.close()
                assert status.startswith(b"HTTP/1.1 200"), status
            # An unauthenticated request is answered 401 and keeps no place.
            reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(10):
                answer = await reader.read()  # to the close
            assert answer.startswith(b"HTTP/1.1 401"), answer[:40]
            writer.close()
        finally:
            close_all(conns)


async def test_a_request_head_must_arrive_within_the_deadline(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    ctx = attacker_context(certs.ca)
    async with StatusServer(
        WorkerMetrics("w"),
        _status,  # type: ignore[arg-type]
        head_timeout=0.5,
        tls=certs.tls("w", "worker"),
        token=TOKEN,
    ) as http:
        host, port = http.url.removeprefix("https://").rsplit(":", 1)
        reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
        writer.write(b"GET /metrics HTTP/1.1\r\nHo")
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with asyncio.timeout(20):
            with contextlib.suppress(ConnectionError):
                assert await reader.read() == b""  # closed, without an answer
        assert loop.time() - start < 10
        writer.close()
