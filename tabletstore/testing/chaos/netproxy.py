"""A TCP proxy on loopback that can partition one process from a server (chaos harness only).

The S3 fault proxy (:mod:`.s3proxy`) speaks HTTP and injects errors; a network partition is
below HTTP: the packets stop. This proxy forwards bytes, so it carries etcd's gRPC (HTTP/2,
with or without TLS: the bytes pass through untouched) as well as S3's HTTP. Each *link* is
one listening port in front of one upstream, for one client process (a worker's link to etcd,
its link to S3, the master's link to etcd), so a partition cuts exactly one process off from
one server while every other process still reaches it.

A cut link is a partition, not a refusal: connections stay open and new ones are accepted,
but no byte is forwarded in either direction (what arrives is dropped), so the client sees
what a lost network gives, requests that time out, not a quick "connection refused". When the
link is healed, the connections that lived through the cut are closed (bytes were dropped
from their streams, as a real partition's TCP retransmissions would end in a reset) and new
ones are forwarded again.

Control, over HTTP on its own port: ``POST /links`` with ``{"name": N, "upstream":
"host:port"}`` opens a link and answers ``{"port": P}`` (opening a name twice returns the same
port); ``POST /cut`` with ``{"name": N, "cut": true|false}``; ``GET /links`` answers each link's
port, upstream, whether it is cut, and how many connections it forwarded and dropped. Run it as
``python -m tabletstore.testing.chaos.netproxy --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from dataclasses import dataclass, field

from aiohttp import web

__all__ = ["Link", "NetProxy", "main"]

_CHUNK = 1 << 16


@dataclass
class Link:
    name: str
    upstream: tuple[str, int]
    port: int = 0
    cut: bool = False
    forwarded: int = 0  # connections accepted while healed
    dropped: int = 0  # connections accepted while cut, or closed at the heal
    server: asyncio.Server | None = None
    #: Every open connection: the writers of both ends and whether it lived through a cut.
    conns: set[_Conn] = field(default_factory=set)

    def view(self) -> dict[str, object]:
        return {
            "port": self.port,
            "upstream": f"{self.upstream[0]}:{self.upstream[1]}",
            "cut": self.cut,
            "forwarded": self.forwarded,
            "dropped": self.dropped,
            "open": len(self.conns),
        }


class _Conn:
    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.upstream: asyncio.StreamWriter | None = None
        #: Saw a cut: closed when the link heals.
        self.broken = False

    def close(self) -> None:
        for w in (self.client, self.upstream):
            if w is not None:
                w.close()


class NetProxy:
    """The links of one proxy process (module docstring)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.links: dict[str, Link] = {}

    async def open(self, name: str, upstream: str) -> Link:
        link = self.links.get(name)
        if link is not None:
            return link
        host, _, port = upstream.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"upstream must be host:port, got {upstream!r}")
        link = Link(name, (host, int(port)))
        link.server = await asyncio.start_server(lambda r, w: self._serve(link, r, w), self.host, 0)
        link.port = link.server.sockets[0].getsockname()[1]
        self.links[name] = link
        return link

    def set_cut(self, name: str, cut: bool) -> Link:
        link = self.links.get(name)
        if link is None:
            raise KeyError(f"no link named {name!r}")
        link.cut = cut
        if cut:
            for conn in link.conns:
                conn.broken = True
        else:
            for conn in [c for c in link.conns if c.broken]:
                link.dropped += 1
                conn.close()
        return link

    async def _serve(
        self, link: Link, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        conn = _Conn(writer)
        link.conns.add(conn)
        try:
            if link.cut:
                conn.broken = True
                # Accepted, then silence: drain what arrives until the heal closes it.
                while await reader.read(_CHUNK):
                    pass
                return
            link.forwarded += 1
            try:
                up_reader, conn.upstream = await asyncio.open_connection(*link.upstream)
            except OSError:
                return  # the upstream is down: the client sees its connection closed
            await asyncio.gather(
                self._pump(link, conn, reader, conn.upstream),
                self._pump(link, conn, up_reader, writer),
            )
        finally:
            link.conns.discard(conn)
            conn.close()

    async def _pump(
        self, link: Link, conn: _Conn, src: asyncio.StreamReader, dst: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while True:
                data = await src.read(_CHUNK)
                if not data:
                    break
                if conn.broken:
                    continue  # a partition: the bytes are lost
                dst.write(data)
                await dst.drain()
        conn.close()

    def app(self) -> web.Application:
        async def links(request: web.Request) -> web.Response:
            if request.method == "GET":
                return web.json_response({n: link.view() for n, link in self.links.items()})
            try:
                body = json.loads(await request.read())
                link = await self.open(str(body["name"]), str(body["upstream"]))
            except (ValueError, KeyError, TypeError) as exc:
                return web.Response(status=400, text=f"bad link request: {exc!r}")
            return web.json_response(link.view())

        async def cut(request: web.Request) -> web.Response:
            try:
                body = json.loads(await request.read())
                link = self.set_cut(str(body["name"]), bool(body["cut"]))
            except (ValueError, KeyError, TypeError) as exc:
                return web.Response(status=400, text=f"bad cut request: {exc!r}")
            return web.json_response(link.view())

        app = web.Application()
        app.router.add_route("*", "/links", links)
        app.router.add_post("/cut", cut)
        return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="the control port")
    args = parser.parse_args(argv)
    web.run_app(NetProxy(args.host).app(), host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
