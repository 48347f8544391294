"""The RPC transport over asyncio TCP streams: RpcServer, RpcClient, RpcClientPool.

Clients talk to tablet servers and the master talks to workers (paper §5, §5.2) through this
module; DESIGN.md §8 asks for length-prefixed frames with many requests in flight on one
connection. The bytes are specified in frames.py and the payloads in codec.py; this module owns
connections, request multiplexing, streams, cancellation, timeouts and shutdown. It knows no
message types: a server is a mapping from method name to handler.

Handlers are ``async def f(request) -> response`` (unary) or ``async def f(request)`` that
``yield``\\ s items (streaming). Each request runs in its own task inside the connection's
TaskGroup; responses are written as they complete, so they may overtake one another. A handler
error from tabletstore.errors reaches the caller as the same class; any other exception reaches
it as Unavailable naming the method (and is logged on the server with its traceback).

Contracts:

- Every frame is handed to the transport in one ``write()`` call, so frames written by
  concurrent tasks never interleave; ``drain()`` after a write is the socket-level backpressure.
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
from typing import Any, Self

from tabletstore.errors import (
    Closed,
    InvalidArgument,
    TabletStoreError,
    Unavailable,
    Unimplemented,
)
from tabletstore.rpc import frames
from tabletstore.rpc.codec import DEFAULT_CODEC, Codec, decode_error, encode_error
from tabletstore.rpc.frames import DEFAULT_MAX_FRAME, Frame, FrameError, Kind

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
# After a protocol error the server half-closes and discards what the peer still sends for at
# most this long, so the peer reads the ERROR frame instead of a connection reset.
_LINGER = 0.5
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


async def _close_writer(writer: asyncio.StreamWriter) -> None:
    """Close, letting buffered replies flush for a moment; a peer that does not read them by
    then gets a reset (so a stalled client cannot hold a closing server)."""
    writer.close()
    try:
        async with asyncio.timeout(_LINGER):
            await writer.wait_closed()
    except TimeoutError:
        writer.transport.abort()
    except ConnectionError:
        pass  # already reset by the peer: closed is what we wanted


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
        self._connections: set[_ServerConnection] = set()
        self._closing = False
        self.address = ""

    @property
    def methods(self) -> list[str]:
        return sorted([*self._unary, *self._streaming])

    @property
    def port(self) -> int:
        return self._port

    async def start(self) -> None:
        if self._server is not None:
            raise InvalidArgument("RpcServer.start() called twice")
        self._server = await asyncio.start_server(self._on_connect, self._host, self._port)
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
        connections = list(self._connections)
        for conn in connections:
            conn.begin_drain()
        with contextlib.suppress(TimeoutError):  # deadline passed: stragglers are cancelled
            async with asyncio.timeout(grace):
                for conn in connections:
                    await conn.done.wait()
        for conn in connections:
            conn.abort()
        with contextlib.suppress(TimeoutError):  # a handler ignoring cancellation: give up
            async with asyncio.timeout(_ABORT_WAIT):
                for conn in connections:
                    await conn.done.wait()
        if self._server is not None:
            await self._server.wait_closed()

    async def _on_connect(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _ServerConnection(self, reader, writer)
        if self._closing:
            writer.close()
            return
        self._connections.add(conn)
        try:
            await conn.run()
        finally:
            self._connections.discard(conn)

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


class _ServerConnection:
    """One accepted connection: reads frames, runs each request as a task, writes replies."""

    def __init__(
        self, server: RpcServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self._server = server
        self._codec = server.codec
        self._reader = reader
        self._writer = writer
        peer = writer.get_extra_info("peername")
        self._peer = _format_address(peer[0], peer[1]) if peer else "unknown peer"
        self._peer_max_frame = DEFAULT_MAX_FRAME
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._credits: dict[int, _Credit] = {}
        self._draining = False  # new requests are refused with Unavailable
        self._aborting = False  # cancelled handlers tell their callers the server is closing
        self.done = asyncio.Event()

    async def run(self) -> None:
        try:
            if await self._handshake():
                async with asyncio.TaskGroup() as tg:
                    try:
                        await self._read_loop(tg)
                    finally:
                        # The peer is gone or broke the protocol: nobody awaits these replies.
                        for task in self._tasks.values():
                            task.cancel()
        finally:
            await _close_writer(self._writer)
            self.done.set()

    # -- lifecycle (called by RpcServer.close) --

    def begin_drain(self) -> None:
        self._draining = True
        if not self._tasks:
            self._writer.close()  # the read loop sees EOF and the connection ends

    def abort(self) -> None:
        self._draining = self._aborting = True
        for task in self._tasks.values():
            task.cancel()
        if not self._tasks:
            self._writer.close()

    # -- reading --

    async def _handshake(self) -> bool:
        self._writer.write(frames.encode_hello(self._server.max_frame))
        try:
            async with asyncio.timeout(self._server.handshake_timeout):
                magic = await self._reader.readexactly(len(frames.MAGIC))
                rest = b""
                if magic == frames.MAGIC:
                    rest = await self._reader.readexactly(frames.HELLO_SIZE - len(frames.MAGIC))
        except (TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return False  # a peer that never says hello gets nothing more
        try:
            hello = frames.decode_hello(magic + rest.ljust(frames.HELLO_SIZE - len(magic), b"\0"))
            frames.check_hello(hello, peer=self._peer, peer_role="client")
        except TabletStoreError as exc:
            await self._fail_connection(exc)
            return False
        self._peer_max_frame = hello.max_frame
        return True

    async def _read_loop(self, tg: asyncio.TaskGroup) -> None:
        max_frame = self._server.max_frame
        while True:
            try:
                frame = await frames.read_frame(self._reader, max_frame)
            except FrameError as exc:
                await self._fail_connection(exc)
                return
            except (asyncio.IncompleteReadError, ConnectionError):
                return  # the peer closed or reset the connection
            kind = frame.kind
            if kind == Kind.REQUEST:
                self._on_request(tg, frame)
            elif kind == Kind.CANCEL:
                task = self._tasks.get(frame.request_id)
                if task is not None:  # else it already finished: the reply crossed the CANCEL
                    task.cancel()
            elif kind == Kind.CREDIT:
                self._on_credit(frame)
            elif kind == Kind.PING:
                self._write_nowait(frames.encode_frame(Kind.PONG, frame.request_id, frame.body))
            else:
                self._reply_error(
                    frame.request_id, InvalidArgument(f"unexpected frame kind {kind} from a client")
                )

    def _on_request(self, tg: asyncio.TaskGroup, frame: Frame) -> None:
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
        self._tasks[rid] = tg.create_task(coro)

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
            await self._send(frame)
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
                        await self._send(frames.encode_frame(Kind.STREAM_ITEM, rid, body))
                frame = frames.encode_frame(Kind.STREAM_END, rid)
            except asyncio.CancelledError:
                self._on_cancelled(rid)
                raise
            except Exception as exc:  # every handler failure becomes an ERROR reply, never a hang
                frame = self._error_frame(rid, exc, method)
            await self._send(frame)
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
            self._writer.close()

    # -- writing --

    def _error_frame(self, rid: int, exc: BaseException, method: str) -> bytes:
        error = _wire_error(exc, method, self._server.address)
        return frames.encode_frame(Kind.ERROR, rid, encode_error(error))

    def _reply_error(self, rid: int, exc: TabletStoreError) -> None:
        self._write_nowait(frames.encode_frame(Kind.ERROR, rid, encode_error(exc)))

    def _write_nowait(self, frame: bytes) -> None:
        """Write a small control frame without waiting for drain (from the read loop)."""
        if not self._writer.is_closing():
            self._writer.write(frame)

    async def _send(self, frame: bytes) -> None:
        if self._writer.is_closing():
            return  # the peer is gone; the read loop cancels what is still running
        self._writer.write(frame)
        with contextlib.suppress(ConnectionError):  # lost mid-write: the read loop sees it too
            await self._writer.drain()

    async def _fail_connection(self, exc: TabletStoreError) -> None:
        """Send a connection-level ERROR (request id 0), then close: the stream is not trusted.

        Half-close and discard what the peer still sends for a moment, so that it reads the
        ERROR instead of a reset caused by unread data.
        """
        logger.info("closing RPC connection from %s: %s", self._peer, exc)
        self._writer.write(frames.encode_frame(Kind.ERROR, 0, encode_error(exc)))
        with contextlib.suppress(TimeoutError, ConnectionError, OSError):
            self._writer.write_eof()
            async with asyncio.timeout(_LINGER):
                while await self._reader.read(1 << 16):
                    pass


# -- client -----------------------------------------------------------------------------------


class _ClientConnection:
    """One connected, handshaken socket and the requests in flight on it."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        address: str,
        max_frame: int,
        peer_max_frame: int,
    ) -> None:
        self._reader = reader
        self._writer = writer
        self.address = address
        self._max_frame = max_frame
        self.peer_max_frame = peer_max_frame
        self._next_id = 0
        # Unary calls and pings wait on a future; streams read a queue. Frames for ids in
        # neither (a reply that crossed our CANCEL) are dropped.
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self.streams: dict[int, asyncio.Queue[Frame | TabletStoreError]] = {}
        self.failure: TabletStoreError | None = None
        self._reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    @classmethod
    async def open(
        cls, host: str, port: int, *, max_frame: int, connect_timeout: float
    ) -> _ClientConnection:
        address = _format_address(host, port)
        try:
            async with asyncio.timeout(connect_timeout):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(frames.encode_hello(max_frame))
                data = await reader.readexactly(frames.HELLO_SIZE)
        except TimeoutError:
            raise Unavailable(
                f"cannot connect to {address}: no handshake within {connect_timeout} s"
            ) from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise Unavailable(f"cannot connect to {address}: {exc}") from exc
        try:
            hello = frames.decode_hello(data)
            frames.check_hello(hello, peer=address, peer_role="server")
        except TabletStoreError:
            writer.close()
            raise
        return cls(reader, writer, address, max_frame, hello.max_frame)

    @property
    def alive(self) -> bool:
        return self.failure is None and not self._writer.is_closing()

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
        self._writer.write(frame)
        try:
            await self._writer.drain()
        except ConnectionError as exc:
            raise Unavailable(f"connection to {self.address} lost") from exc

    def cancel(self, rid: int) -> None:
        """Forget ``rid`` and tell the server to stop working on it (CANCEL needs no reply)."""
        self.pending.pop(rid, None)
        self.streams.pop(rid, None)
        if self.alive:
            self._writer.write(frames.encode_frame(Kind.CANCEL, rid))

    def send_nowait(self, frame: bytes) -> None:
        if self.alive:
            self._writer.write(frame)

    async def _read_loop(self) -> None:
        failure: TabletStoreError = Unavailable(f"connection to {self.address} lost")
        try:
            while True:
                frame = await frames.read_frame(self._reader, self._max_frame)
                rid = frame.request_id
                future = self.pending.pop(rid, None)
                if future is not None:
                    if not future.done():
                        future.set_result(frame)
                    continue
                queue = self.streams.get(rid)
                if queue is not None:
                    queue.put_nowait(frame)
                elif rid == 0 and frame.kind == Kind.ERROR:
                    reason = decode_error(frame.body)
                    failure = Unavailable(
                        f"connection to {self.address} closed by the server: "
                        f"{type(reason).__name__}: {reason}"
                    )
                    return
        except FrameError as exc:
            failure = Unavailable(f"connection to {self.address} broken: {exc}")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the default failure: lost
        except asyncio.CancelledError:
            failure = Closed(f"connection to {self.address} was closed by this client")
            raise
        finally:
            self._fail_all(failure)

    def _fail_all(self, failure: TabletStoreError) -> None:
        self.failure = failure
        self._writer.close()
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(type(failure)(str(failure)))
        streams, self.streams = self.streams, {}
        for queue in streams.values():
            queue.put_nowait(type(failure)(str(failure)))

    async def close(self) -> None:
        self._reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader_task
        with contextlib.suppress(ConnectionError):  # already reset: closed is what we want
            await self._writer.wait_closed()


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
            await conn.close()

    async def connection(self) -> _ClientConnection:
        """The live connection, (re)connecting if needed. Raises Unavailable if it cannot."""
        conn = self._conn
        if conn is not None and conn.alive:
            return conn
        async with self._connect_lock:
            if self._closed:
                raise Closed(f"RpcClient for {self.address} is closed")
            conn = self._conn
            if conn is not None and conn.alive:
                return conn
            if conn is not None:
                await conn.close()
            self._conn = None
            self._conn = await _ClientConnection.open(
                self.host, self.port, max_frame=self.max_frame, connect_timeout=self.connect_timeout
            )
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
        reached, the connection drops, or no response arrives within ``timeout`` seconds.
        """
        payload = self.codec.encode(request)
        conn = await self.connection()
        request_frame = frames.encode_request(rid := conn.new_id(), method, payload)
        frames.check_outgoing(
            len(request_frame) - frames.HEADER.size, conn.peer_max_frame, "request"
        )
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = future
        try:
            await conn.send(request_frame)
            if timeout is None:
                frame = await future
            else:
                async with asyncio.timeout(timeout):
                    frame = await future
        except TimeoutError:
            conn.cancel(rid)
            raise Unavailable(
                f"call {method!r} to {self.address} timed out after {timeout} s"
            ) from None
        except BaseException:
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
                self._conn.send_nowait(frames.encode_credit(self._rid, self._consumed))
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
