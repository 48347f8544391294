"""The partitioning proxy: a link forwards bytes both ways; a cut link drops them (the client
waits, as on a lost network) and accepts new connections without forwarding; the heal closes
the connections that lived through the cut and forwards new ones again."""

from __future__ import annotations

import asyncio

import pytest

from tabletstore.testing.chaos.netproxy import NetProxy


async def _echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while data := await reader.read(1024):
        writer.write(data)
        await writer.drain()
    writer.close()


async def _roundtrip(port: int, data: bytes, wait: float = 2.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(1024), wait)
    finally:
        writer.close()


def test_cut_drops_bytes_and_heal_restores() -> None:
    async def run() -> None:
        server = await asyncio.start_server(_echo, "127.0.0.1", 0)
        upstream = server.sockets[0].getsockname()[1]
        proxy = NetProxy()
        link = await proxy.open("worker-1/etcd", f"127.0.0.1:{upstream}")
        assert (await proxy.open("worker-1/etcd", "ignored:1")).port == link.port
        assert await _roundtrip(link.port, b"hello") == b"hello"

        reader, writer = await asyncio.open_connection("127.0.0.1", link.port)
        writer.write(b"before")
        assert await reader.read(1024) == b"before"
        proxy.set_cut("worker-1/etcd", True)
        writer.write(b"during")
        await writer.drain()
        with pytest.raises(TimeoutError):  # dropped: no answer, no reset
            await asyncio.wait_for(reader.read(1024), 0.5)
        with pytest.raises(TimeoutError):  # a new connection is accepted, then silence
            await _roundtrip(link.port, b"new", wait=0.5)

        proxy.set_cut("worker-1/etcd", False)
        assert await asyncio.wait_for(reader.read(1024), 2.0) == b""  # closed at the heal
        writer.close()
        assert await _roundtrip(link.port, b"again") == b"again"
        assert link.view()["dropped"] >= 2 and not link.view()["cut"]
        with pytest.raises(KeyError):
            proxy.set_cut("nobody", True)
        with pytest.raises(ValueError):
            await proxy.open("bad", "no-port")
        for lk in proxy.links.values():
            assert lk.server is not None
            lk.server.close()
        server.close()

    asyncio.run(run())
