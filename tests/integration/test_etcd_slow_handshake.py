"""Connecting to etcd over a link whose handshake is slow (a loaded machine, a long link).

A TCP relay in front of the session's etcd holds etcd's first bytes on every connection for
:data:`HANDSHAKE` seconds, so each connection's HTTP/2 handshake takes that long. The
coordinator must wait for it, within its call timeout, instead of abandoning every attempt and
reporting etcd unreachable (gRPC gives a connection attempt only ``min_reconnect_backoff_ms``;
see ``_CHANNEL_OPTIONS``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from tabletstore.coordination.etcd import EtcdCoordinator

#: Longer than the longest attempt gRPC's back-off alone allows (1 s, jitter 20 %), well
#: within the call timeout (5 s).
HANDSHAKE = 2.0


async def _relay(src: asyncio.StreamReader, dst: asyncio.StreamWriter, hold: float) -> None:
    with contextlib.suppress(OSError):
        data = await src.read(1 << 16)
        await asyncio.sleep(hold)
        while data:
            dst.write(data)
            await dst.drain()
            data = await src.read(1 << 16)
    dst.close()


@contextlib.asynccontextmanager
async def slow_relay(upstream: str) -> AsyncIterator[str]:
    """A relay to ``upstream`` (host:port) that holds the server's first bytes HANDSHAKE s."""
    host, _, port = upstream.rpartition(":")
    tasks: set[asyncio.Task[object]] = set()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(host, int(port))
        await asyncio.gather(_relay(reader, up_writer, 0.0), _relay(up_reader, writer, HANDSHAKE))

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(serve(reader, writer))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_slow_handshake_connects_instead_of_reporting_etcd_unreachable(
    etcd_server: str,
) -> None:
    async with slow_relay(etcd_server) as endpoint:
        coordinator = EtcdCoordinator(f"etcd://{endpoint}/slow-handshake", retry_deadline=10.0)
        try:
            await coordinator.put("k", b"v")
            got = await coordinator.get("k")
            assert got is not None and got.value == b"v"
        finally:
            await coordinator.close()
