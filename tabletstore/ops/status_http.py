"""The per-process HTTP endpoint: the status page, ``/metrics`` (Prometheus) and JSON.

Every cluster process (worker, master) started with ``--metrics-port`` serves, on its own
port, what an operator or a Prometheus server looks at (the paper's master watches tablet
servers through Chubby, §5.2; humans watch the processes through this), with aiohttp:

=====================  =============================================================
``GET /``              the status page (HTML, :mod:`tabletstore.ops.status_pages`): the master's
                       shows the cluster, tables, tablets, events and charts; a
                       worker's its tablets and charts
``GET /static/NAME``   the page's script and style sheet (package data, ``web/``)
``GET /metrics``       the process's registry (:mod:`tabletstore.ops.metrics`) in
                       Prometheus' text exposition format
``GET /status``        :class:`WorkerStatus` or :class:`MasterStatus` (JSON)
``GET /api/cluster``   the master's page as JSON (:class:`ClusterView`)
``GET /api/worker``    a worker's page as JSON (:class:`WorkerView`)
``GET /api/charts``    the charts' samples (:class:`Charts`)
=====================  =============================================================

Every JSON document is a pydantic model of :mod:`tabletstore.ops.status_api` (the status API is
a boundary, docs/architecture/conventions.md convention 9). Any other path is 404, a method other
than GET or HEAD
405. A status that cannot be built because the cluster cannot be read (the coordinator is
down) answers 503 with ``{"error": ...}``; a bug answers 500 and is logged.

Bounded like the RPC servers: at most ``max_connections`` (64) connections at once and
``max_per_peer`` (8) from one IP address -- one more is answered ``503`` and closed at once --,
request lines and header fields of at most 8190 bytes and 128 headers (aiohttp's limits,
answered 400), request bodies of at most 64 KiB (every route is a GET), and a connection idle
for 60 s between requests is closed. Holding a place costs a client a request: each request's
line and headers must arrive within ``head_timeout`` (10 s) of its first byte (the first
request's within ``head_timeout`` of the connection, TLS handshake included), or the connection
is closed; when every place is taken, a new connection takes the place of the one that has
waited longest for a request (part way through its head, or idle since its last one for
``head_timeout``) rather than being refused, so connections that never finish a request cannot
keep scrapers out; and with TLS an unauthenticated request is answered 401 and its connection
closed.

With TLS (``tls``: the process's TlsConfig) the endpoint is ``https://`` and answers only a
client that presents a certificate of the cluster CA, or a scraper's ``Authorization: Bearer
<token>`` matching the process's read-only status token (``--status-token-file``); anyone else
gets 401. A master's page reads its workers' pages with its own certificate. The viewer (the
certificate's principal, or the status token's) sees row keys only of the tables it may read
(:mod:`tabletstore.ops.status_redaction`): :meth:`StatusServer.shown` says which, from the
``tables`` the server is given.

The charts need history: a :class:`~tabletstore.ops.history.Sampler` runs while the server
does (the master scrapes its workers' ``/status``; a worker samples itself), owned by the
server and cancelled by :meth:`StatusServer.close`.
"""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import json
import logging
import ssl
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, cast

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel

from tabletstore.client.replicator import read_progress
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.metadata.catalog import Catalog
from tabletstore.ops.history import DEFAULT_INTERVAL, Reading, Sampler
from tabletstore.ops.metrics import MasterMetrics, ProcessMetrics, WorkerMetrics
from tabletstore.ops.status_api import (
    AssignmentInfo,
    ClusterView,
    EventInfo,
    MasterStatus,
    ProcessStatus,
    TabletInfo,
    WorkerStatus,
    WorkerView,
    parse_status,
)
from tabletstore.ops.status_pages import STATIC_FILES, render_master, render_worker, static_file
from tabletstore.ops.status_redaction import STATUS_TOKEN_VIEWER, Shown, hide_keys, shown_to
from tabletstore.ops.views import (
    MasterLike,
    WorkerLike,
    cluster_view,
    master_status,
    scrape_workers,
    worker_status,
    worker_view,
)
from tabletstore.security.principal import Principal
from tabletstore.security.table_visibility import TableLike
from tabletstore.security.tls import TlsConfig, principal_from_peercert

__all__ = [
    "AssignmentInfo",
    "EventInfo",
    "MasterStatus",
    "ProcessStatus",
    "StatusServer",
    "TabletInfo",
    "WorkerStatus",
    "master_status",
    "parse_status",
    "serve_master",
    "serve_worker",
    "worker_status",
]

log = logging.getLogger(__name__)

#: A builder of a page or document, given the server's base URL (``http://HOST:PORT``).
Build = Callable[[str], Awaitable[BaseModel]]
#: Every table (id, name, schema), for deciding whose row keys a viewer sees.
Tables = Callable[[], Awaitable[Iterable[tuple[str, str, TableLike]]]]
#: The principal viewing the request being served (with TLS; None without).
_VIEWER: contextvars.ContextVar[Principal | None] = contextvars.ContextVar(
    "tabletstore_status_viewer", default=None
)
BuildHtml = Callable[[str], Awaitable[str]]
_INDEX = "tabletstore: GET /metrics (Prometheus), /status (JSON)\n"
#: Connections at once; more are answered 503 (module docstring).
MAX_CONNECTIONS = 64
#: Connections at once from one IP address.
MAX_PER_PEER = 8
#: Seconds a request's line and headers may take to arrive (module docstring).
HEAD_TIMEOUT = 10.0
#: Largest request body (every route is a GET: none is needed).
_MAX_BODY = 64 * 1024
#: Seconds a connection may stay idle between requests.
_KEEPALIVE = 60.0


def _busy(transport: asyncio.BaseTransport, why: str) -> None:
    """What a connection past a cap gets: 503 naming the limit, then the close."""
    body = f"tabletstore: {why}; try again later\n".encode()
    head = (
        "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    cast(asyncio.Transport, transport).write(head + body)
    transport.close()


class _Places:
    """The endpoint's connections, in total and per peer address. When all places are taken,
    a newcomer takes the place of the connection that has waited longest for a request: part
    way through a request's head, or idle since its last head for ``head_timeout`` or more
    (then probably idle on keep-alive). Otherwise it is refused."""

    def __init__(self, limit: int, per_peer: int, head_timeout: float) -> None:
        self.limit = limit
        self.per_peer = per_peer
        self.head_timeout = head_timeout
        self.open: dict[_Guarded, str] = {}
        self._per_peer: Counter[str] = Counter()

    def admit(self, conn: _Guarded, peer: str) -> str | None:
        """Count ``conn`` in; or why it is refused."""
        if self._per_peer[peer] >= self.per_peer:
            return (
                f"too many connections to this status endpoint from {peer} "
                f"(limit {self.per_peer} per address)"
            )
        if len(self.open) >= self.limit:
            now = asyncio.get_running_loop().time()
            oldest = min(self.open, key=self._waited)
            if self._waited(oldest) > now:
                return f"too many connections to this status endpoint (limit {self.limit})"
            oldest.evict()
        self.open[conn] = peer
        self._per_peer[peer] += 1
        return None

    def _waited(self, conn: _Guarded) -> float:
        """Since when ``conn`` may give its place away (loop time)."""
        return conn.since if conn.waiting else conn.since + self.head_timeout

    def release(self, conn: _Guarded) -> None:
        peer = self.open.pop(conn, None)
        if peer is not None:
            self._per_peer[peer] -= 1
            if self._per_peer[peer] <= 0:
                del self._per_peer[peer]


class _Guarded(asyncio.Protocol):
    """aiohttp's protocol for one connection, behind the endpoint's caps (:class:`_Places`)
    and the deadline on each request's head (the bytes up to an empty line)."""

    def __init__(self, places: _Places, inner: asyncio.Protocol) -> None:
        self._places = places
        self._inner = inner
        self._transport: asyncio.Transport | None = None
        self._admitted = False
        self._tail = b""  # the last bytes received, to find a head's end across reads
        self._timer: asyncio.TimerHandle | None = None
        self._loop = asyncio.get_running_loop()
        #: Whether a request's head is awaited (part way, or the first), and since when; else
        #: when the last head was complete.
        self.waiting = True
        self.since = self._loop.time()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        refusal = self._places.admit(self, str(peer[0]) if peer else "unknown")
        if refusal is not None:
            _busy(transport, refusal)
            return
        self._admitted = True
        self._wait_for_head()
        self._inner.connection_made(transport)

    def _wait_for_head(self) -> None:
        self.waiting, self.since = True, self._loop.time()
        self._timer = self._loop.call_later(self._places.head_timeout, self.evict)

    def _head_done(self) -> None:
        self.waiting, self.since = False, self._loop.time()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def evict(self) -> None:
        self._places.release(self)
        if self._transport is not None:
            self._transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self._admitted:
            return
        seen = self._tail + data
        end = seen.rfind(b"\r\n\r\n")
        if end >= 0:
            self._head_done()
        if (end < 0 or end + 4 < len(seen)) and self._timer is None:
            self._wait_for_head()  # a head has begun: the deadline runs from its first byte
        self._tail = seen[-3:]
        self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._places.release(self)
        if self._admitted:
            self._inner.connection_lost(exc)


class _CappedSite(web.TCPSite):
    """aiohttp's TCPSite (``ssl_context`` included), with its connections counted and
    deadlined by :class:`_Places`."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        *,
        places: _Places,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(runner, host, port, ssl_context=ssl_context)
        self._places = places

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registers the site with its runner
        server = self._runner.server
        assert server is not None
        places = self._places

        def factory() -> asyncio.BaseProtocol:
            return _Guarded(places, cast(asyncio.Protocol, server()))

        self._server = await asyncio.get_running_loop().create_server(
            factory,
            self._host,
            self._port,
            ssl=self._ssl_context,
            ssl_handshake_timeout=places.head_timeout if self._ssl_context else None,
            backlog=self._backlog,
            reuse_address=self._reuse_address,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]


class StatusServer:
    """Serves ``/metrics`` from ``metrics``, ``/status`` from ``status(url)``, the page from
    ``page(url)`` and each ``api`` path's document, on ``host:port`` (0: a free port), while
    running each of ``background`` as a task. ``url`` is ``http://HOST:PORT`` once started.
    Use ``async with`` or :meth:`start` / :meth:`close`."""

    def __init__(
        self,
        metrics: ProcessMetrics,
        status: Build,
        *,
        page: BuildHtml | None = None,
        api: Mapping[str, Build] | None = None,
        background: Sequence[Callable[[], Coroutine[Any, Any, None]]] = (),
        host: str = "127.0.0.1",
        port: int = 0,
        max_connections: int = MAX_CONNECTIONS,
        max_per_peer: int = MAX_PER_PEER,
        head_timeout: float = HEAD_TIMEOUT,
        tls: TlsConfig | None = None,
        token: str | None = None,
        tables: Tables | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise InvalidArgument(f"metrics port must be 0..65535, got {port}")
        self._metrics = metrics
        self._status = status
        self._page = page
        self._api = dict(api or {})
        self._background = tuple(background)
        self._host = host
        self._port = port
        self.max_connections = max_connections
        self._places = _Places(max_connections, max_per_peer, head_timeout)
        self._runner: web.AppRunner | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None
        self._tls = tls
        self._token = token
        self._tables = tables
        self.url = ""

    async def shown(self) -> Shown | None:
        """The tables whose row keys the current request's viewer may see; None: all (no
        TLS, or a cluster identity). Without ``tables``, none (for a restricted viewer)."""
        viewer = _VIEWER.get()
        if viewer is None or viewer.is_cluster:
            return None
        return shown_to(viewer, await self._tables() if self._tables is not None else ())

    def session(self) -> aiohttp.ClientSession:
        """An HTTP client session for the server's background work (closed with it)."""
        if self._session is None:
            connector = (
                aiohttp.TCPConnector(ssl=self._tls.client_context())
                if self._tls is not None
                else None
            )
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    @web.middleware
    async def _authenticate(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """With TLS: a verified client certificate, or the status token (module docstring)."""
        transport = request.transport
        peercert = transport.get_extra_info("peercert") if transport is not None else None
        viewer: Principal | None = None
        if peercert:
            try:
                viewer = principal_from_peercert(peercert)
            except InvalidArgument:
                viewer = None  # a certificate of the CA naming no valid principal: refused
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if (
            viewer is None
            and self._token is not None
            and scheme.lower() == "bearer"
            and hmac.compare_digest(given.strip().encode(), self._token.encode())
        ):
            viewer = STATUS_TOKEN_VIEWER
        if viewer is not None:
            _VIEWER.set(viewer)
            return await handler(request)
        refusal = web.Response(
            status=401,
            text="tabletstore: a client certificate of the cluster CA or the status token "
            "(Authorization: Bearer ...) is required\n",
            headers={"WWW-Authenticate": "Bearer"},
        )
        refusal.force_close()  # an unauthenticated client keeps no place
        return refusal

    async def start(self) -> None:
        app = web.Application(
            client_max_size=_MAX_BODY,
            middlewares=[self._authenticate] if self._tls is not None else [],
        )
        app.router.add_get("/", self._index)
        app.router.add_get("/metrics", self._metrics_text)
        app.router.add_get("/status", self._document(self._status))
        app.router.add_get("/static/{name}", self._static)
        for path, build in self._api.items():
            app.router.add_get(path, self._document(build))
        runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            shutdown_timeout=1.0,
            keepalive_timeout=_KEEPALIVE,
        )
        await runner.setup()
        ssl_context = (
            self._tls.server_context(require_client_cert=False) if self._tls is not None else None
        )
        site = _CappedSite(
            runner, self._host, self._port, places=self._places, ssl_context=ssl_context
        )
        try:
            await site.start()
        except OSError as exc:
            await runner.cleanup()
            raise InvalidArgument(
                f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from exc
        self._runner = runner
        port = runner.addresses[0][1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.url = f"{'https' if self._tls is not None else 'http'}://{host}:{port}"
        self._tasks = [asyncio.create_task(run()) for run in self._background]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        # The background tasks end on cancellation (they sleep or await HTTP between rounds).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        if self._session is not None:
            await self._session.close()
            self._session = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> StatusServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ handlers

    async def _index(self, request: web.Request) -> web.Response:
        if self._page is None:
            return web.Response(text=_INDEX, content_type="text/plain", charset="utf-8")
        try:
            html = await self._page(self.url)
        except TabletStoreError as exc:
            return web.Response(
                status=503,
                text=f"tabletstore: the cluster cannot be read: {type(exc).__name__}: {exc}\n",
                content_type="text/plain",
                charset="utf-8",
            )
        return web.Response(text=html, content_type="text/html", charset="utf-8")

    async def _metrics_text(self, request: web.Request) -> web.Response:
        response = web.Response(body=self._metrics.exposition())
        response.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return response

    async def _static(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        body = static_file(name)
        if body is None:
            raise web.HTTPNotFound(text=f"no such file {name!r}\n")
        response = web.Response(body=body)
        response.headers["Content-Type"] = STATIC_FILES[name]
        return response

    def _document(self, build: Build) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            try:
                model = await build(self.url)
            except TabletStoreError as exc:
                # E.g. the coordinator is unreachable: the process is up, its view is not.
                return _json(503, {"error": f"{type(exc).__name__}: {exc}"})
            except Exception as exc:  # a bug in a builder: answer 500 and log it, not hang
                log.exception("building %s failed", request.path)
                return _json(500, {"error": f"internal: {type(exc).__name__}"})
            return web.Response(body=model.model_dump_json().encode(), content_type=_JSON)

        return handler


_JSON = "application/json"


def _json(status: int, body: object) -> web.Response:
    return web.Response(status=status, body=json.dumps(body).encode(), content_type=_JSON)


# ---------------------------------------------------------------------------- process hooks


async def serve_worker(
    server: WorkerLike,
    metrics: WorkerMetrics,
    *,
    host: str,
    port: int,
    coordinator: Coordinator | None = None,
    interval: float = DEFAULT_INTERVAL,
    tls: TlsConfig | None = None,
    token: str | None = None,
) -> StatusServer:
    """Start a worker's endpoint and page (``run_worker`` calls this for ``--metrics-port``).
    ``coordinator``: where the page finds the masters' pages to link to."""
    http: StatusServer

    async def own_status(url: str) -> WorkerStatus:
        return await worker_status(server, metrics, metrics_url=url)

    async def status(url: str) -> WorkerStatus:
        return hide_keys(await own_status(url), await http.shown())

    async def read_self() -> Reading:
        return {server.worker_id: (http.url, await own_status(http.url))}

    sampler = Sampler(read_self, interval=interval)

    async def view(url: str) -> WorkerView:
        return hide_keys(
            await worker_view(await own_status(url), sampler, coordinator), await http.shown()
        )

    async def page(url: str) -> str:
        return render_worker(await view(url), sampler.charts())

    async def api_worker(url: str) -> BaseModel:
        return await view(url)

    async def api_charts(url: str) -> BaseModel:
        return sampler.charts()

    http = StatusServer(
        metrics,
        status,
        page=page,
        api={"/api/worker": api_worker, "/api/charts": api_charts},
        background=[sampler.run],
        host=host,
        port=port,
        tls=tls,
        token=token,
        tables=_worker_tables(coordinator),
    )
    await http.start()
    return http


def _worker_tables(coordinator: Coordinator | None) -> Tables | None:
    if coordinator is None:
        return None
    catalog = Catalog(coordinator)
    return _catalog_tables(lambda: catalog)


def _catalog_tables(catalog: Callable[[], Catalog]) -> Tables:
    """Every table of the catalog ``catalog()`` gives when asked (the master's: read then)."""

    async def tables() -> list[tuple[str, str, TableLike]]:
        return [(i.table_id, i.schema.name, i.schema) for i in await catalog().list_tables()]

    return tables


async def serve_master(
    master: MasterLike,
    metrics: MasterMetrics,
    *,
    address: str,
    host: str,
    port: int,
    coordinator: Coordinator | None = None,
    interval: float = DEFAULT_INTERVAL,
    tls: TlsConfig | None = None,
    token: str | None = None,
) -> StatusServer:
    """Start a master's endpoint (``run_master`` calls this for ``--metrics-port``). With
    ``coordinator`` it also serves the cluster's page, scraping the workers' pages every
    ``interval`` seconds for the charts."""
    http: StatusServer

    async def status(url: str) -> MasterStatus:
        built = await master_status(master, metrics, address=address, metrics_url=url)
        return hide_keys(built, await http.shown())

    tables = _catalog_tables(lambda: master.catalog)
    if coordinator is None:
        http = StatusServer(
            metrics, status, host=host, port=port, tls=tls, token=token, tables=tables
        )
        await http.start()
        return http
    coord = coordinator

    async def read_workers() -> Reading:
        return await scrape_workers(master, coord, http.session)

    sampler = Sampler(read_workers, interval=interval)

    async def sample_replication() -> None:
        await watch_replication(coord, metrics, interval=interval)

    async def view(url: str) -> ClusterView:
        built = await cluster_view(
            master, coord, metrics, sampler, address=address, metrics_url=url
        )
        return hide_keys(built, await http.shown())

    async def api_cluster(url: str) -> BaseModel:
        return await view(url)

    async def page(url: str) -> str:
        return render_master(await view(url), sampler.charts())

    async def api_charts(url: str) -> BaseModel:
        return sampler.charts()

    http = StatusServer(
        metrics,
        status,
        page=page,
        api={"/api/cluster": api_cluster, "/api/charts": api_charts},
        background=[sampler.run, sample_replication],
        host=host,
        port=port,
        tls=tls,
        token=token,
        tables=tables,
    )
    await http.start()
    return http


async def watch_replication(
    coordinator: Coordinator, metrics: MasterMetrics, *, interval: float
) -> None:
    """Keep ``metrics.replication`` (the replica tables' progress: the page's replication
    section and the lag metrics) as the coordinator has it, every ``interval`` seconds."""
    while True:
        try:
            metrics.replication = await read_progress(coordinator)
        except TabletStoreError as exc:  # the coordinator away: the last reading stays
            log.warning("cannot read the replication progress: %s", exc)
        await asyncio.sleep(interval)
