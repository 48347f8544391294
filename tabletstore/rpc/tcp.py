"""The RPC transport over asyncio TCP: RpcServer, RpcClient, RpcClientPool, TcpTransport.

Clients talk to tablet servers and the master talks to workers (paper §5, §5.2) through this
module; DESIGN.md §8 asks for length-prefixed frames with many requests in flight on one
connection. The bytes are specified in frames.py, the payloads in codec.py and the framed
connection (parsing, coalesced writes, flow control) in connection.py; this module owns
request multiplexing, streams, cancellation, timeouts, reconnection and shutdown. It knows no
message types: a server is a mapping from method name to handler.

Handlers are ``async def f(request) -> response`` (unary) or ``async def f(request)`` that
``yield``\\ s items (streaming). Each request runs in its own task inside the connection's
TaskGroup; responses are written as they complete, so they may overtake one another. A handler
error from tabletstore.errors reaches the caller as the same class; any other exception reaches
it as Unavailable naming the method (and is logged on the server with its traceback).

Contracts:

- Every frame is queued whole (connection.py), so frames written by concurrent tasks never
  interleave; ``drain()`` after a write is the socket-level backpressure.
- Streams are flow-controlled by credit (frames.py): the server sends at most ``window`` items
  the client has not consumed yet, so a producer never runs ahead of a slow consumer by more
  than that, and one slow stream never blocks other requests on the connection.
- A request is cancelled on the server when the client sends CANCEL (a timeout, a cancelled
  caller, a stream closed early) or the connection drops. Handlers must honour cancellation.
- A dropped connection fails every call in flight on it with Unavailable naming the address;
  the next call reconnects.
- ``RpcServer.close(grace=...)`` stops accepting, refuses new requests with Unavailable, waits up
  to ``grace`` seconds for requests in flight, then cancels the rest (their callers get
  Unavailable) and closes every connection.

uvloop is not chosen here: process entry points may install it; the library works on any loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self, cast

from tabletstore.errors import (
    Closed,
    InvalidArgument,
    TabletStoreError,
    Unavailable,
    Unimplemented,
)
from tabletstore.rpc import frames
from tabletstore.rpc.codec import DEFAULT_CODEC, Codec, decode_error, encode_error
from tabletstore.rpc.connection import LINGER, FrameConnection
from tabletstore.rpc.frames import DEFAULT_MAX_FRAME, Frame, Kind

__all__ = [
    "Handler",
    "RpcClient",
    "RpcClientPool",
    "RpcServer",
    "RpcStream",
    "TcpTransport",
    "parse_address",
]

logger = logging.getLogger(__name__)

#: A unary handler (coroutine function) or a streaming handler (async generator function).
Handler = Callable[[Any], Awaitable[Any]] | Callable[[Any], AsyncIterator[Any]]

_MAX_REQUEST_ID = 0xFFFF_FFFF
_HANDSHAKE_TIMEOUT = 10.0
# How long close() waits for cancelled handlers after the grace period before giving up.
_ABORT_WAIT = 2.0


def parse_address(address: str) -> tuple[str, int]:
    """``"127.0.0.1:7000"`` or ``"[::1]:7000"`` → (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"RPC address must be HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def _format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _wire_error(exc: BaseException, method: str, where: str) -> TabletStoreError:
    """What a handler's exception becomes on the wire (module docstring)."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _wire_error(exc.exceptions[0], method, where)
    if isinstance(exc, TabletStoreError):
        return exc
    logger.error("RPC handler %r on %s raised", method, where, exc_info=exc)
    return Unavailable(f"internal error in {method!r} on {where}: {type(exc).__name__}: {exc}")


class _Credit:
    """Stream items the client is ready to receive (frames.py CREDIT)."""

    __slots__ = ("_available", "_event")

    def __init__(self, window: int) -> None:
        self._available = window
        self._event = asyncio.Event()

    async def acquire(self) -> None:
        while self._available <= 0:
            self._event.clear()
            await self._event.wait()
        self._available -= 1

    def grant(self, n: int) -> None:
        self._available += n
        self._event.set()


# -- server -----------------------------------------------------------------------------------


class RpcServer:
    """Serves ``handlers`` (method name → handler) on a TCP port.

    Use ``async with RpcServer(...) as server`` or ``await server.start()`` / ``await
    server.close()``; ``server.address`` is "HOST:PORT" once started (port 0 picks a free one).
    Each accepted connection runs as one task owned by the server (``close`` awaits them all),
    and each request as a task in its connection's TaskGroup.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame: int = DEFAULT_MAX_FRAME,
        codec: Codec = DEFAULT_CODEC,
        max_in_flight: int = 4096,
        handshake_timeout: float = _HANDSHAKE_TIMEOUT,
    ) -> None:
        self._unary: dict[str, Callable[[Any], Awaitable[Any]]] = {}
        self._streaming: dict[str, Callable[[Any], AsyncIterator[Any]]] = {}
        for name, fn in handlers.items():
            if inspect.isasyncgenfunction(fn):
                self._streaming[name] = fn
            elif inspect.iscoroutinefunction(fn):
                self._unary[name] = fn
            else:
                raise InvalidArgument(
                    f"handler for {name!r} must be an async function or async generator, got {fn!r}"
                )
        if max_frame < 1024:
            raise InvalidArgument(f"max_frame must be at least 1024 bytes, got {max_frame}")
        self._host = host
        self._port = port
        self.max_frame = max_frame
        self.codec = codec
        self.max_in_flight = max_in_flight
        self.handshake_timeout = handshake_timeout
        self._server: asyncio.Server | None = None
        self._connections: dict[_ServerConnection, asyncio.Task[None]] = {}
        self._closing = False
        self.address = ""

    @property
    def methods(self) -> list[str]:
        return sorted([*self._unary, *self._streaming])

    @property
    def port(self) -> int:
        return self._port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def start(self) -> None:
        if self._server is not None:
            raise InvalidArgument("RpcServer.start() called twice")
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _ServerConnection(self), self._host, self._port
        )
        self._port = self._server.sockets[0].getsockname()[1]
        self.address = _format_address(self._host, self._port)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self, *, grace: float = 5.0) -> None:
        """Stop accepting, finish requests in flight for up to ``grace`` seconds, then cancel
        the rest and close every connection. Idempotent."""
        self._closing = True
        if self._server is not None:
            self._server.close()
        connections = dict(self._connections)
        for conn in connections:
            conn.begin_drain()
        if connections:
            _, late = await asyncio.wait(connections.values(), timeout=grace)
            for conn, task in connections.items():
                if task in late:
                    conn.abort()
            if late:
                # A handler that ignores cancellation is a bug; do not hang close() on it.
                await asyncio.wait(late, timeout=_ABORT_WAIT)
        if self._server is not None:
            await self._server.wait_closed()

    def accepted(self, conn: _ServerConnection) -> asyncio.Task[None] | None:
        """Called by a new connection: its task, or None if the server is closing."""
        if self._closing:
            return None
        task = asyncio.get_running_loop().create_task(conn.run())
        self._connections[conn] = task
        task.add_done_callback(lambda _: self._connections.pop(conn, None))
        return task

    def lookup(self, method: str, streaming: bool) -> Callable[[Any], Any]:
        """The handler for ``method`` called as ``streaming`` or not; a clear error otherwise."""
        table: Mapping[str, Callable[[Any], Any]] = self._streaming if streaming else self._unary
        fn = table.get(method)
        if fn is not None:
            return fn
        if method in self._streaming:
            raise InvalidArgument(f"method {method!r} streams its results: call it with stream()")
        if method in self._unary:
            raise InvalidArgument(f"method {method!r} is unary: call it with call()")
        raise Unimplemented(
            f"no RPC method {method!r} on {self.address} (it has: {', '.join(self.methods)})"
        )


class _ServerConnection(FrameConnection):
    """One accepted connection: dispatches frames, runs each request as a task, replies."""

    def __init__(self, server: RpcServer) -> None:
        super().__init__(server.max_frame, frames.encode_hello(server.max_frame))
        self._server = server
        self._codec = server.codec
        self._peer = "unknown peer"
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._handshaken: asyncio.Future[bool] = self._loop.create_future()
        self._tg: asyncio.TaskGroup | None = None
        # Frames that arrived before run() opened its TaskGroup (pause_reading() is not
        # honoured inside connection_made on every loop, e.g. uvloop).
        self._backlog: list[Frame] = []
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._credits: dict[int, _Credit] = {}
        self._draining = False  # new requests are refused with Unavailable
        self._aborting = False  # cancelled handlers tell their callers the server is closing
        self._linger: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        if peer:
            self._peer = _format_address(peer[0], peer[1])
        if self._server.accepted(self) is None:
            cast(asyncio.Transport, transport).abort()

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                backlog, self._backlog = self._backlog, []
                for frame in backlog:
                    self.frame_received(frame)
                try:
                    await self._serve()
                finally:
                    # The peer is gone or broke the protocol: nobody awaits these replies.
                    for task in self._tasks.values():
                        task.cancel()
        finally:
            self._dead = True  # the TaskGroup is gone: ignore whatever still arrives
            await self.close_and_wait()

    async def _serve(self) -> None:
        try:
            async with asyncio.timeout(self._server.handshake_timeout):
                await self._handshaken
        except TimeoutError:
            return  # a peer that never says hello gets nothing more
        # Until the peer closes, or fail() aborts after its linger.
        await self.lost

    # -- lifecycle (called by RpcServer.close) --

    def begin_drain(self) -> None:
        self._draining = True
        if not self._tasks:
            self.close()

    def abort(self) -> None:
        self._draining = self._aborting = True
        for task in self._tasks.values():
            task.cancel()
        if not self._tasks:
            self.close()

    # -- reading (FrameConnection hooks) --

    def hello_received(self, hello: frames.Hello) -> None:
        try:
            frames.check_hello(hello, peer=self._peer, peer_role="client")
        except TabletStoreError as exc:
            logger.info("refusing RPC connection from %s: %s", self._peer, exc)
            self.fail(exc)
            self._handshaken.set_result(False)
            return
        self._peer_max_frame = hello.max_frame
        self._handshaken.set_result(True)

    def fail(self, exc: TabletStoreError) -> None:
        super().fail(exc)
        # Linger so the peer reads the ERROR, then abort (run() ends with the connection).
        if self._linger is None:
            self._linger = self._loop.call_later(LINGER, self._abort_transport)

    def _abort_transport(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def closed(self, exc: Exception | None) -> None:
        if self._linger is not None:
            self._linger.cancel()
        if not self._handshaken.done():
            self._handshaken.set_result(False)

    def frame_received(self, frame: Frame) -> None:
        if self._tg is None:
            self._backlog.append(frame)
            return
        kind = frame.kind
        if kind == Kind.REQUEST:
            self._on_request(frame)
        elif kind == Kind.CANCEL:
            task = self._tasks.get(frame.request_id)
            if task is not None:  # else it already finished: the reply crossed the CANCEL
                task.cancel()
        elif kind == Kind.CREDIT:
            self._on_credit(frame)
        elif kind == Kind.PING:
            self.write(
                frames.encode_frame(Kind.PONG, frame.request_id, frame.body), more_coming=True
            )
        else:
            self._reply_error(
                frame.request_id, InvalidArgument(f"unexpected frame kind {kind} from a client")
            )

    def _on_request(self, frame: Frame) -> None:
        rid = frame.request_id
        try:
            request = frames.parse_request(frame.body)
            if rid == 0 or rid in self._tasks:
                raise InvalidArgument(f"request id {rid} is reserved or already in flight")
            if self._draining:
                raise Unavailable(f"server {self._server.address} is shutting down")
            if len(self._tasks) >= self._server.max_in_flight:
                raise Unavailable(
                    f"too many requests in flight on one connection to {self._server.address} "
                    f"(limit {self._server.max_in_flight})"
                )
            fn = self._server.lookup(request.method, streaming=request.window > 0)
        except TabletStoreError as exc:
            self._reply_error(rid, exc)
            return
        if request.window > 0:
            credit = self._credits[rid] = _Credit(request.window)
            coro = self._serve_stream(rid, request.method, fn, request.payload, credit)
        else:
            coro = self._serve_unary(rid, request.method, fn, request.payload)
        assert self._tg is not None  # frame_received keeps a backlog until it exists
        self._tasks[rid] = self._tg.create_task(coro)

    def _on_credit(self, frame: Frame) -> None:
        credit = self._credits.get(frame.request_id)
        if credit is None:
            return  # the stream already ended; credit for it is moot
        try:
            credit.grant(frames.decode_credit(frame.body))
        except InvalidArgument as exc:
            self._reply_error(frame.request_id, exc)

    # -- serving one request --

    async def _serve_unary(
        self, rid: int, method: str, fn: Callable[[Any], Any], payload: memoryview
    ) -> None:
        try:
            try:
                response = await fn(self._codec.decode(payload))
                body = self._codec.encode(response)
                frames.check_outgoing(len(body), self._peer_max_frame, f"response to {method!r}")
                frame = frames.encode_frame(Kind.RESPONSE, rid, body)
            except asyncio.CancelledError:
                self._on_cancelled(rid)
                raise
            except Exception as exc:  # every handler failure becomes an ERROR reply, never a hang
                frame = self._error_frame(rid, exc, method)
            # Other replies finishing in this loop iteration share the system call.
            self.write(frame, more_coming=len(self._tasks) > 1)
            await self.drain()
        finally:
            self._finished(rid)

    async def _serve_stream(
        self,
        rid: int,
        method: str,
        fn: Callable[[Any], Any],
        payload: memoryview,
        credit: _Credit,
    ) -> None:
        try:
            try:
                async with contextlib.aclosing(fn(self._codec.decode(payload))) as items:
                    async for item in items:
                        body = self._codec.encode(item)
                        frames.check_outgoing(
                            len(body), self._peer_max_frame, f"stream item of {method!r}"
                        )
                        await credit.acquire()
                        self.write(
                            frames.encode_frame(Kind.STREAM_ITEM, rid, body), more_coming=True
                        )
                        await self.drain()
                frame = frames.encode_frame(Kind.STREAM_END, rid)
            except asyncio.CancelledError:
                self._on_cancelled(rid)
                raise
            except Exception as exc:  # every handler failure becomes an ERROR reply, never a hang
                frame = self._error_frame(rid, exc, method)
            # The last frame of the stream: no need to wait for drain.
            self.write(frame, more_coming=len(self._tasks) > 1)
        finally:
            self._finished(rid)

    def _on_cancelled(self, rid: int) -> None:
        # Cancelled by the client (CANCEL) or its disconnect: no reply. By close(): tell it why.
        if self._aborting:
            self._reply_error(rid, Unavailable(f"server {self._server.address} is shutting down"))

    def _finished(self, rid: int) -> None:
        self._tasks.pop(rid, None)
        self._credits.pop(rid, None)
        if self._draining and not self._tasks:
            self.close()

    def _error_frame(self, rid: int, exc: BaseException, method: str) -> bytes:
        error = _wire_error(exc, method, self._server.address)
        return frames.encode_frame(Kind.ERROR, rid, encode_error(error))

    def _reply_error(self, rid: int, exc: TabletStoreError) -> None:
        self.write(frames.encode_frame(Kind.ERROR, rid, encode_error(exc)), more_coming=True)


# -- client -----------------------------------------------------------------------------------


class _ClientConnection(FrameConnection):
    """One connected, handshaken socket and the requests in flight on it."""

    def __init__(self, address: str, max_frame: int) -> None:
        super().__init__(max_frame, frames.encode_hello(max_frame))
        self.address = address
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self._handshake: asyncio.Future[None] = self._loop.create_future()
        self._next_id = 0
        # Unary calls and pings wait on a future; streams read a queue. Frames for ids in
        # neither (a reply that crossed our CANCEL) are dropped.
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self.streams: dict[int, asyncio.Queue[Frame | TabletStoreError]] = {}
        self.failure: TabletStoreError | None = None

    @classmethod
    async def open(
        cls, host: str, port: int, *, max_frame: int, connect_timeout: float
    ) -> _ClientConnection:
        address = _format_address(host, port)
        loop = asyncio.get_running_loop()
        conn: _ClientConnection | None = None
        connected = False
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(lambda: cls(address, max_frame), host, port)
                await conn._handshake
            connected = True
        except TimeoutError:
            raise Unavailable(
                f"cannot connect to {address}: no handshake within {connect_timeout} s"
            ) from None
        except OSError as exc:
            raise Unavailable(f"cannot connect to {address}: {exc}") from exc
        finally:
            if conn is not None and not connected:  # failed, timed out or cancelled
                conn._abort(Unavailable(f"cannot connect to {address}"))
        return conn

    @property
    def alive(self) -> bool:
        return self.failure is None and self.is_open

    def new_id(self) -> int:
        """The next free request id (1..2**32-1, wrapping, skipping ids still in flight)."""
        while True:
            self._next_id = self._next_id % _MAX_REQUEST_ID + 1
            rid = self._next_id
            if rid not in self.pending and rid not in self.streams:
                return rid

    async def send(self, frame: bytes) -> None:
        if self.failure is not None:
            raise type(self.failure)(str(self.failure))
        # With other requests in flight, calls made in this loop iteration share a system call.
        self.write(frame, more_coming=len(self.pending) + len(self.streams) > 1)
        await self.drain()

    def cancel(self, rid: int) -> None:
        """Forget ``rid`` and tell the server to stop working on it (CANCEL needs no reply)."""
        self.pending.pop(rid, None)
        self.streams.pop(rid, None)
        if self.alive:
            self.write(frames.encode_frame(Kind.CANCEL, rid), more_coming=True)

    # -- FrameConnection hooks --

    def hello_received(self, hello: frames.Hello) -> None:
        try:
            frames.check_hello(hello, peer=self.address, peer_role="server")
        except TabletStoreError as exc:
            self._dead = True
            if not self._handshake.done():
                self._handshake.set_exception(exc)
            return
        self.peer_max_frame = hello.max_frame
        if not self._handshake.done():
            self._handshake.set_result(None)

    def frame_received(self, frame: Frame) -> None:
        rid = frame.request_id
        future = self.pending.pop(rid, None)
        if future is not None:
            if not future.done():
                future.set_result(frame)
            return
        queue = self.streams.get(rid)
        if queue is not None:
            queue.put_nowait(frame)
        elif rid == 0 and frame.kind == Kind.ERROR:
            reason = decode_error(frame.body)
            self._abort(
                Unavailable(
                    f"connection to {self.address} closed by the server: "
                    f"{type(reason).__name__}: {reason}"
                )
            )

    def fail(self, exc: TabletStoreError) -> None:
        # A server that breaks the frame format: nothing more it sends can be trusted.
        self._abort(Unavailable(f"connection to {self.address} broken: {exc}"))

    def closed(self, exc: Exception | None) -> None:
        failure = Unavailable(f"connection to {self.address} lost")
        if not self._handshake.done():
            self._handshake.set_exception(
                Unavailable(f"cannot connect to {self.address}: closed during the handshake")
            )
        self._fail_all(failure)

    def _abort(self, failure: TabletStoreError) -> None:
        self._dead = True
        self._fail_all(failure)
        if self.transport is not None:
            self.transport.abort()

    def _fail_all(self, failure: TabletStoreError) -> None:
        if self.failure is None:
            self.failure = failure
        failure = self.failure
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(type(failure)(str(failure)))
        streams, self.streams = self.streams, {}
        for queue in streams.values():
            queue.put_nowait(type(failure)(str(failure)))

    async def aclose(self) -> None:
        self._fail_all(Closed(f"connection to {self.address} was closed by this client"))
        if self.transport is not None:
            await self.close_and_wait()


class RpcClient:
    """One multiplexed connection to ``host:port``, opened on first use and reopened after it
    drops. Safe for any number of concurrent calls and streams from one event loop."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        codec: Codec = DEFAULT_CODEC,
        max_frame: int = DEFAULT_MAX_FRAME,
        connect_timeout: float = 5.0,
        stream_window: int = 64,
    ) -> None:
        if stream_window < 1:
            raise InvalidArgument(f"stream_window must be at least 1, got {stream_window}")
        self.host = host
        self.port = port
        self.address = _format_address(host, port)
        self.codec = codec
        self.max_frame = max_frame
        self.connect_timeout = connect_timeout
        self.stream_window = stream_window
        self._conn: _ClientConnection | None = None
        self._connect_lock = asyncio.Lock()
        self._connect_attempts = 0
        self._connect_error: TabletStoreError | None = None
        self._closed = False

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection; calls in flight fail with Closed. Idempotent."""
        self._closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.aclose()

    async def connection(self) -> _ClientConnection:
        """The live connection, (re)connecting if needed. Raises Unavailable if it cannot.

        Callers that queued behind a failed attempt get its error at once instead of each
        trying again in turn (a thousand calls to a dead server fail in one connect timeout).
        """
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        attempt = self._connect_attempts
        async with self._connect_lock:
            if self._closed:
                raise Closed(f"RpcClient for {self.address} is closed")
            conn = self._conn
            if conn is not None and conn.alive:
                return conn
            failed = self._connect_error
            if attempt != self._connect_attempts and failed is not None:
                raise type(failed)(str(failed))
            self._conn = None
            if conn is not None:
                await conn.aclose()
            self._connect_attempts += 1
            try:
                self._conn = await _ClientConnection.open(
                    self.host,
                    self.port,
                    max_frame=self.max_frame,
                    connect_timeout=self.connect_timeout,
                )
            except TabletStoreError as exc:
                self._connect_error = exc
                raise
            self._connect_error = None
            return self._conn

    async def call(
        self,
        method: str,
        request: object,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (also CANCELs the request on the server)
    ) -> Any:
        """Send ``request`` to unary ``method`` and return its decoded response.

        Raises the handler's TabletStoreError class, or Unavailable if the server cannot be
        reached, the connection drops, or the call (connecting included) takes longer than
        ``timeout`` seconds; the server is then told to cancel it.
        """
        if timeout is None:
            return await self._call(method, request)
        try:
            async with asyncio.timeout(timeout):
                return await self._call(method, request)
        except TimeoutError:
            raise Unavailable(
                f"call {method!r} to {self.address} timed out after {timeout} s"
            ) from None

    async def _call(self, method: str, request: object) -> Any:
        payload = self.codec.encode(request)
        conn = self._conn
        if conn is None or not conn.alive:
            conn = await self.connection()
        request_frame = frames.encode_request(rid := conn.new_id(), method, payload)
        frames.check_outgoing(
            len(request_frame) - frames.HEADER.size, conn.peer_max_frame, "request"
        )
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = future
        try:
            await conn.send(request_frame)
            frame = await future
        except BaseException:  # cancelled (or timed out) by the caller, or the send failed
            conn.cancel(rid)
            raise
        if frame.kind == Kind.RESPONSE:
            return self.codec.decode(frame.body)
        raise _reply_error(frame, method, self.address)

    def stream(
        self,
        method: str,
        request: object,
        *,
        timeout: float | None = None,
        window: int | None = None,
    ) -> RpcStream:
        """Call streaming ``method``; iterate the result for its items.

        Prefer ``async with client.stream(...) as items: async for item in items: ...``: leaving
        the block early cancels the stream on the server. ``timeout`` bounds the wait for each
        item; ``window`` is how many unconsumed items the server may send ahead.
        """
        return RpcStream(self, method, request, timeout, window or self.stream_window)

    async def ping(self, *, timeout: float = 5.0) -> float:  # noqa: ASYNC109 (wire deadline)
        """Round-trip time to the server in seconds; Unavailable if it does not answer."""
        conn = await self.connection()
        rid = conn.new_id()
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = future
        start = time.perf_counter()
        try:
            await conn.send(frames.encode_frame(Kind.PING, rid))
            async with asyncio.timeout(timeout):
                await future
        except TimeoutError:
            conn.pending.pop(rid, None)
            raise Unavailable(f"ping to {self.address} timed out after {timeout} s") from None
        except BaseException:
            conn.pending.pop(rid, None)
            raise
        return time.perf_counter() - start


def _reply_error(frame: Frame, method: str, address: str) -> TabletStoreError:
    """The error a non-success reply frame stands for."""
    if frame.kind == Kind.ERROR:
        return decode_error(frame.body)
    return Unavailable(
        f"protocol error from {address}: frame kind {frame.kind} in reply to {method!r}"
    )


class RpcStream:
    """The items of one streaming call: an async iterator and an async context manager.

    The request is sent on first use. Leaving early (``aclose()``, the ``async with`` block
    exiting, or the stream being garbage collected unfinished) sends CANCEL to the server.
    """

    def __init__(
        self,
        client: RpcClient,
        method: str,
        request: object,
        timeout: float | None,
        window: int,
    ) -> None:
        self._client = client
        self._method = method
        self._request = request
        self._timeout = timeout
        self._window = window
        self._grant_every = max(1, window // 2)
        self._consumed = 0  # items taken since the last CREDIT
        self._conn: _ClientConnection | None = None
        self._rid = 0
        self._queue: asyncio.Queue[Frame | TabletStoreError] | None = None
        self._finished = False

    async def __aenter__(self) -> Self:
        await self._start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Self:
        return self

    async def _start(self) -> None:
        if self._conn is not None or self._finished:
            return
        client = self._client
        payload = client.codec.encode(self._request)
        conn = await client.connection()
        request_frame = frames.encode_request(
            rid := conn.new_id(), self._method, payload, window=self._window
        )
        frames.check_outgoing(
            len(request_frame) - frames.HEADER.size, conn.peer_max_frame, "request"
        )
        queue: asyncio.Queue[Frame | TabletStoreError] = asyncio.Queue()
        conn.streams[rid] = queue
        self._conn, self._rid, self._queue = conn, rid, queue
        await conn.send(request_frame)

    async def __anext__(self) -> Any:
        if self._conn is None:
            await self._start()
        if self._finished:
            raise StopAsyncIteration
        assert self._queue is not None and self._conn is not None
        try:
            if self._timeout is None:
                got = await self._queue.get()
            else:
                async with asyncio.timeout(self._timeout):
                    got = await self._queue.get()
        except TimeoutError:
            await self.aclose()
            raise Unavailable(
                f"stream {self._method!r} from {self._client.address}: no item within "
                f"{self._timeout} s"
            ) from None
        except BaseException:
            await self.aclose()
            raise
        if isinstance(got, TabletStoreError):
            self._finished = True
            raise got
        if got.kind == Kind.STREAM_ITEM:
            self._consumed += 1
            if self._consumed >= self._grant_every:
                self._conn.write(frames.encode_credit(self._rid, self._consumed), more_coming=True)
                self._consumed = 0
            return self._client.codec.decode(got.body)
        self._finish()
        if got.kind == Kind.STREAM_END:
            raise StopAsyncIteration
        raise _reply_error(got, self._method, self._client.address)

    def _finish(self) -> None:
        self._finished = True
        if self._conn is not None:
            self._conn.streams.pop(self._rid, None)

    async def aclose(self) -> None:
        """Stop the stream; the server cancels its handler. Idempotent."""
        if self._finished:
            return
        self._finished = True
        if self._conn is not None:
            self._conn.cancel(self._rid)

    def __del__(self) -> None:
        # Abandoned mid-stream without aclose(): best-effort CANCEL so the server stops
        # producing. Writing to a transport is synchronous; a closed loop means nothing to do.
        if not self._finished and self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.cancel(self._rid)


class RpcClientPool:
    """One RpcClient per address ("HOST:PORT"), created on first ``get``."""

    def __init__(self, **client_options: Any) -> None:
        self._options = client_options
        self._clients: dict[str, RpcClient] = {}
        self._closed = False

    def get(self, address: str) -> RpcClient:
        if self._closed:
            raise Closed("RpcClientPool is closed")
        client = self._clients.get(address)
        if client is None:
            host, port = parse_address(address)
            client = self._clients[address] = RpcClient(host, port, **self._options)
        return client

    async def close(self) -> None:
        self._closed = True
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            await client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class TcpTransport:
    """rpc.inprocess.Transport over TCP: ``address`` is the worker's "HOST:PORT"."""

    def __init__(self, *, timeout: float | None = None, **client_options: Any) -> None:
        self._pool = RpcClientPool(**client_options)
        self._timeout = timeout

    async def call(self, address: str, method: str, request: Any) -> Any:
        return await self._pool.get(address).call(method, request, timeout=self._timeout)

    async def stream(self, address: str, method: str, request: Any) -> AsyncIterator[Any]:
        # Closing this generator early (aclose, or a break in an ``async with aclosing``)
        # leaves the block below, which CANCELs the stream on the server.
        items = self._pool.get(address).stream(method, request, timeout=self._timeout)
        async with items:
            async for item in items:
                yield item

    async def close(self) -> None:
        await self._pool.close()
