"""The per-process HTTP endpoint: ``GET /metrics`` (Prometheus) and ``GET /status`` (JSON).

Every cluster process (worker, master) started with ``--metrics-port`` serves, on its own
loopback port, what an operator or a Prometheus server scrapes (the paper's master watches
tablet servers through Chubby, §5.2; humans watch the processes through this):

* ``GET /metrics`` — the process's registry (:mod:`tabletstore.ops.metrics`) in Prometheus' text
  exposition format (``prometheus_client.generate_latest``).
* ``GET /status`` — one JSON object, a :class:`WorkerStatus` or a :class:`MasterStatus`
  (pydantic models: the status API is a boundary, STYLE.md convention 9). ``role`` tells
  which; :func:`parse_status` validates a body back into its model.
* ``GET /`` — a one-line index. Any other path is 404, any other method 405.

The server is deliberately minimal HTTP/1.1 on asyncio streams: one request per connection
(``Connection: close``), request line and headers bounded in size and time, no body read.
That is all a scraper or ``curl`` needs, and it adds no dependency.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal, Protocol
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.metadata.catalog import Catalog
from tabletstore.ops.metrics import MasterMetrics, ProcessMetrics, WorkerMetrics
from tabletstore.rpc.messages import ServerStatusRequest, ServerStatusResponse

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

#: Bounds on one request: time to send the request line and headers, header lines, line size.
_REQUEST_TIMEOUT = 10.0
_MAX_HEADERS = 100
_MAX_LINE = 8192
#: Tablet events shown by a master's /status.
DEFAULT_EVENTS = 20


# ---------------------------------------------------------------------------- the status API


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TabletInfo(_Model):
    """One served tablet. Row keys are shown as text (bytes that are not UTF-8 as ``\\xNN``)."""

    table_id: str
    tablet_id: str
    start_row: str
    end_row: str | None = Field(description="None: the tablet runs to the end of the table")
    sstables: int = Field(ge=0)
    sstable_bytes: int = Field(ge=0)
    memtable_bytes: int = Field(ge=0)
    requests: int = Field(ge=0, description="Requests for this tablet since it was loaded")


class WorkerStatus(_Model):
    role: Literal["worker"] = "worker"
    id: str
    address: str
    metrics_url: str | None
    lease_remaining_seconds: float | None = Field(ge=0)
    tablets: list[TabletInfo]
    memtable_bytes: int = Field(ge=0)
    sstable_bytes: int = Field(ge=0)


class EventInfo(_Model):
    at: float = Field(description="Wall-clock seconds since the epoch")
    tablet: str = Field(description="table name / tablet id")
    kind: str
    detail: str


class AssignmentInfo(_Model):
    at: float
    assigned: int = Field(ge=0)
    error: str | None


class MasterStatus(_Model):
    role: Literal["master"] = "master"
    id: str
    address: str
    metrics_url: str | None
    leading: bool = Field(description="False: a standby waiting for the master lock")
    lease_remaining_seconds: float | None = Field(ge=0)
    live_workers: dict[str, str] = Field(description="worker id -> RPC address")
    last_assignment: AssignmentInfo | None
    recent_events: list[EventInfo]


ProcessStatus = Annotated[WorkerStatus | MasterStatus, Field(discriminator="role")]
_STATUS: TypeAdapter[WorkerStatus | MasterStatus] = TypeAdapter(ProcessStatus)


def parse_status(body: bytes | str) -> WorkerStatus | MasterStatus:
    """A ``/status`` body validated into its model; InvalidArgument naming what is wrong."""
    try:
        return _STATUS.validate_json(body)
    except ValidationError as exc:
        raise InvalidArgument(f"not a tabletstore /status document: {exc}") from exc


def _text_key(key: bytes) -> str:
    return key.decode("utf-8", "backslashreplace")


class WorkerLike(Protocol):
    """What the worker's status reads (``worker.TabletServer`` has it)."""

    @property
    def worker_id(self) -> str: ...

    @property
    def address(self) -> str: ...

    async def server_status(self, req: ServerStatusRequest) -> ServerStatusResponse: ...


class MasterLike(Protocol):
    """What the master's status reads (``master.Master`` has it)."""

    @property
    def catalog(self) -> Catalog: ...

    async def live_workers(self) -> dict[str, str]: ...


async def worker_status(
    server: WorkerLike, metrics: WorkerMetrics, *, metrics_url: str | None = None
) -> WorkerStatus:
    """A worker's status: its tablets as the ``server_status`` RPC reports them."""
    st = await server.server_status(ServerStatusRequest())
    tablets = [
        TabletInfo(
            table_id=t.table_id,
            tablet_id=t.tablet_id,
            start_row=_text_key(t.start_row),
            end_row=_text_key(t.end_row) if t.end_row is not None else None,
            sstables=t.sstables,
            sstable_bytes=t.sstable_bytes,
            memtable_bytes=t.memtable_bytes,
            requests=t.requests,
        )
        for t in st.tablets
    ]
    return WorkerStatus(
        id=st.worker_id,
        address=st.address,
        metrics_url=metrics_url,
        lease_remaining_seconds=metrics.lease_remaining(),
        tablets=tablets,
        memtable_bytes=sum(t.memtable_bytes for t in tablets),
        sstable_bytes=sum(t.sstable_bytes for t in tablets),
    )


async def master_status(
    master: MasterLike,
    metrics: MasterMetrics,
    *,
    address: str,
    metrics_url: str | None = None,
    events: int = DEFAULT_EVENTS,
) -> MasterStatus:
    """A master's status: leadership, live workers, the last assignment round, and the most
    recent tablet events (read from the catalog, so a standby shows them too)."""
    recent: list[EventInfo] = []
    for info in await master.catalog.list_tables():
        for rec in await master.catalog.list_tablets(info.table_id):
            name = f"{info.schema.name}/{rec.tablet_id}"
            recent.extend(
                EventInfo(at=e.at, tablet=name, kind=e.kind, detail=e.detail) for e in rec.events
            )
    recent.sort(key=lambda e: e.at)
    last = metrics.last_round
    return MasterStatus(
        id=metrics.process_id,
        address=address,
        metrics_url=metrics_url,
        leading=metrics.leading,
        lease_remaining_seconds=metrics.lease_remaining(),
        live_workers=await master.live_workers(),
        last_assignment=(
            AssignmentInfo(at=last.at, assigned=last.assigned, error=last.error)
            if last is not None
            else None
        ),
        recent_events=recent[-events:] if events > 0 else [],
    )


# ---------------------------------------------------------------------------- the server


class StatusServer:
    """Serves ``/metrics`` from ``metrics`` and ``/status`` from ``status(url)`` on
    ``host:port`` (0: a free port). ``url`` is ``http://HOST:PORT`` once started. Use
    ``async with`` or :meth:`start` / :meth:`close`; close ends in-flight requests too."""

    def __init__(
        self,
        metrics: ProcessMetrics,
        status: Callable[[str], Awaitable[BaseModel]],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        if not 0 <= port <= 65535:
            raise InvalidArgument(f"metrics port must be 0..65535, got {port}")
        self._metrics = metrics
        self._status = status
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[object]] = set()
        self.url = ""

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(
                self._handle, self._host, self._port, limit=_MAX_LINE
            )
        except OSError as exc:
            raise InvalidArgument(
                f"cannot serve metrics on {self._host}:{self._port}: {exc.strerror or exc}"
            ) from exc
        port = self._server.sockets[0].getsockname()[1]
        host = f"[{self._host}]" if ":" in self._host else self._host
        self.url = f"http://{host}:{port}"

    async def close(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        # Handlers end on cancellation (they only await the client or the status builder).
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()
        self._server = None

    async def __aenter__(self) -> StatusServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        try:
            async with asyncio.timeout(_REQUEST_TIMEOUT):
                method, code, content_type, body = await self._respond(reader)
                head = (
                    f"HTTP/1.1 {code} {_REASONS[code]}\r\n"
                    f"Content-Type: {content_type}\r\n"
                    f"Content-Length: {len(body)}\r\n"
                    "Connection: close\r\n\r\n"
                )
                writer.write(head.encode("latin-1") + (b"" if method == "HEAD" else body))
                await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            # A client that is too slow, sends lines over the limit (ValueError from the
            # stream) or goes away gets no answer: there is no one to tell.
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                await writer.wait_closed()
            if task is not None:
                self._tasks.discard(task)

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[str, int, str, bytes]:
        """(method, status code, content type, body) for one request."""
        parts = (await reader.readline()).decode("latin-1").split()
        for _ in range(_MAX_HEADERS):
            if (await reader.readline()).strip() == b"":
                break
        else:
            return "GET", 431, _TEXT, b"too many header lines\n"
        if len(parts) != 3 or not parts[2].startswith("HTTP/"):
            return "GET", 400, _TEXT, b"malformed request line\n"
        method, target = parts[0], urlsplit(parts[1]).path
        if method not in ("GET", "HEAD"):
            return method, 405, _TEXT, b"only GET and HEAD are served\n"
        if target == "/metrics":
            return method, 200, CONTENT_TYPE_LATEST, self._metrics.exposition()
        if target == "/status":
            return (method, *await self._status_body())
        if target == "/":
            return method, 200, _TEXT, b"tabletstore: GET /metrics (Prometheus), /status (JSON)\n"
        return method, 404, _TEXT, f"no such path {target!r}\n".encode()

    async def _status_body(self) -> tuple[int, str, bytes]:
        try:
            model = await self._status(self.url)
        except TabletStoreError as exc:
            # E.g. the coordinator is unreachable: the process is up, its view is not.
            error = {"error": f"{type(exc).__name__}: {exc}"}
            return 503, _JSON, json.dumps(error).encode()
        except Exception as exc:  # a bug in a status builder: answer 500 and log it, not hang
            log.exception("building /status failed")
            return 500, _JSON, json.dumps({"error": f"internal: {type(exc).__name__}"}).encode()
        return 200, _JSON, model.model_dump_json().encode()


_TEXT = "text/plain; charset=utf-8"
_JSON = "application/json"
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


# ---------------------------------------------------------------------------- process hooks


async def serve_worker(
    server: WorkerLike, metrics: WorkerMetrics, *, host: str, port: int
) -> StatusServer:
    """Start a worker's endpoint (``run_worker`` calls this for ``--metrics-port``)."""
    http = StatusServer(
        metrics, lambda url: worker_status(server, metrics, metrics_url=url), host=host, port=port
    )
    await http.start()
    return http


async def serve_master(
    master: MasterLike, metrics: MasterMetrics, *, address: str, host: str, port: int
) -> StatusServer:
    """Start a master's endpoint (``run_master`` calls this for ``--metrics-port``)."""

    def status(url: str) -> Awaitable[MasterStatus]:
        return master_status(master, metrics, address=address, metrics_url=url)

    http = StatusServer(metrics, status, host=host, port=port)
    await http.start()
    return http
