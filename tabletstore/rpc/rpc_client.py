"""The RPC client: RpcClient, RpcStream, RpcClientPool and TcpTransport (docs/architecture/design.md
§8).

The client library reaches workers, and the master reaches workers, through this module (paper
§5: clients talk to tablet servers directly); the behaviour both sides of a connection promise
is written in tcp.py's docstring. An RpcClient holds one connection to one address, opened on
first use and reopened after it drops, and multiplexes any number of calls and streams on it by
request id. A stream grants the server credit as its items are consumed (frames.py).

Errors say whether the request was sent (the Transport contract, ``rpc/transport.py``):
``Unreachable`` if it never left (the connection could not be opened, or had already failed),
so it is safe to send again even when not idempotent; ``Indeterminate`` once it was sent and no
answer came — the timeout passed, the connection went (even closed by its owner), or the reply
broke the protocol — since it may have been applied. ``Closed`` only for a call made after the
RpcClient itself was closed by its owner (nothing is sent).

With ``auth`` (rpc/auth.py ``ClientAuth``) the connection is TLS, verified against the cluster
CA; the server must hold a certificate of the role the caller dials (``server_role``: a worker
for the tablet service, the master for the master's; worker or master when not said), bound to
the dialled host where the certificate names hosts (``security/tls.py`` ``check_server``). A
certificate of a client or a function is never taken for a server. A token, if given,
is sent in an AUTH frame right after the handshake.

A connection speaks the highest protocol version both sides speak (``versions``, default this
build's: rpc/versions.py): a server of the previous release is talked to at its version, and
a call needing a newer one fails Unimplemented before it is sent. A server that refuses our
version fails the calls with Unimplemented naming both sides' versions, and one that refuses
who we are (no or a bad certificate, a revoked token) with PermissionDenied; neither is
retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any, Self

from tabletstore.clock import stopwatch
from tabletstore.errors import (
    Closed,
    Indeterminate,
    InvalidArgument,
    PermissionDenied,
    TabletStoreError,
    Unavailable,
    Unimplemented,
    Unreachable,
)
from tabletstore.rpc import frames
from tabletstore.rpc.auth import ACTING_FOR, ClientAuth
from tabletstore.rpc.codec import DEFAULT_CODEC, Codec, decode_error
from tabletstore.rpc.connection import FrameConnection, format_address, parse_address
from tabletstore.rpc.frames import DEFAULT_MAX_FRAME, Frame, Kind
from tabletstore.rpc.transport import Method
from tabletstore.rpc.versions import REQUEST_AS_VERSION, SPOKEN, Versions, require
from tabletstore.security.tls import check_server

__all__ = ["RpcClient", "RpcClientPool", "RpcStream", "TcpTransport"]

_MAX_REQUEST_ID = 0xFFFF_FFFF
#: Seconds after which a connection with nothing in flight and nothing sent or received is not
#: reused: the next call opens a new one. Servers close connections idle for
#: ``RpcServerOptions.idle_timeout`` (at least twice this), so a request never crosses that close.
IDLE_REUSE = 60.0


class _ClientConnection(FrameConnection):
    """One connected, handshaken socket and the requests in flight on it."""

    def __init__(
        self,
        address: str,
        max_frame: int,
        token: str | None = None,
        host: str = "",
        server_role: str | None = None,
        versions: Versions = SPOKEN,
    ) -> None:
        super().__init__(max_frame, frames.encode_hello(max_frame, versions.highest))
        self.address = address
        self._versions = versions
        #: The protocol version of this connection (rpc/versions.py), once handshaken.
        self.version = 0
        self._token = token
        self._host = host
        self._server_role = server_role
        self.peer_max_frame = DEFAULT_MAX_FRAME
        self._handshake: asyncio.Future[None] = self._loop.create_future()
        self._next_id = 0
        # Unary calls and pings wait on a future; streams read a queue. Frames for ids in
        # neither (a reply that crossed our CANCEL) are dropped.
        self.pending: dict[int, asyncio.Future[Frame]] = {}
        self.streams: dict[int, asyncio.Queue[Frame | TabletStoreError]] = {}
        self.failure: TabletStoreError | None = None
        self.last_used = self._loop.time()

    @classmethod
    async def open(
        cls,
        host: str,
        port: int,
        *,
        max_frame: int,
        connect_timeout: float,
        auth: ClientAuth | None = None,
        server_role: str | None = None,
        versions: Versions = SPOKEN,
    ) -> _ClientConnection:
        address = format_address(host, port)
        loop = asyncio.get_running_loop()
        conn: _ClientConnection | None = None
        connected = False
        try:
            async with asyncio.timeout(connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: cls(
                        address,
                        max_frame,
                        auth.token if auth else None,
                        host,
                        server_role,
                        versions,
                    ),
                    host,
                    port,
                    ssl=auth.ssl_context() if auth is not None else None,
                )
                await conn._handshake
            if isinstance(conn.failure, Unimplemented):  # it refused our protocol version
                raise Unimplemented(str(conn.failure))
            if conn.failure is not None:  # the server refused it (say, a connection cap)
                raise Unreachable(f"cannot connect to {address}: {conn.failure}")
            connected = True
        except TimeoutError:
            raise Unreachable(
                f"cannot connect to {address}: no handshake within {connect_timeout} s"
            ) from None
        except ssl.SSLError as exc:
            raise PermissionDenied(f"TLS with {address} failed: {exc}") from exc
        except OSError as exc:
            raise Unreachable(f"cannot connect to {address}: {exc}") from exc
        finally:
            if conn is not None and not connected:  # failed, timed out or cancelled
                conn._abort(Unavailable(f"cannot connect to {address}"))
        return conn

    @property
    def alive(self) -> bool:
        """Usable for a new request: open, not failed, and not idle past IDLE_REUSE."""
        if self.failure is not None or not self.is_open:
            return False
        return bool(self.pending or self.streams) or (
            self._loop.time() - self.last_used < IDLE_REUSE
        )

    def new_id(self) -> int:
        """The next free request id (1..2**32-1, wrapping, skipping ids still in flight)."""
        while True:
            self._next_id = self._next_id % _MAX_REQUEST_ID + 1
            rid = self._next_id
            if rid not in self.pending and rid not in self.streams:
                return rid

    def send(self, frame: bytes) -> None:
        """Queue ``frame`` for sending (then ``await drain()``). From here on the request may
        reach the server; Unreachable, with nothing sent, if the connection already failed."""
        if isinstance(self.failure, (PermissionDenied, Unimplemented)):
            raise type(self.failure)(str(self.failure))
        if self.failure is not None:
            # Nothing of this request left: the caller may send it again anywhere.
            raise Unreachable(f"request not sent: {self.failure}")
        self.last_used = self._loop.time()
        # With other requests in flight, calls made in this loop iteration share a system call.
        self.write(frame, more_coming=len(self.pending) + len(self.streams) > 1)

    def cancel(self, rid: int) -> None:
        """Forget ``rid`` and tell the server to stop working on it (CANCEL needs no reply)."""
        self.pending.pop(rid, None)
        self.streams.pop(rid, None)
        if self.failure is None and self.is_open:
            self.write(frames.encode_frame(Kind.CANCEL, rid), more_coming=True)

    # -- FrameConnection hooks --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if transport.get_extra_info("sslcontext") is None:
            return
        try:
            peercert = transport.get_extra_info("peercert")
            try:
                check_server(peercert, self._host, self._server_role, self.address)
            except InvalidArgument as exc:
                raise PermissionDenied(str(exc)) from exc
        except PermissionDenied as exc:
            self._dead = True
            if not self._handshake.done():
                self._handshake.set_exception(exc)
            transport.abort()  # type: ignore[attr-defined]

    def hello_received(self, hello: frames.Hello) -> None:
        try:
            self.version = frames.check_hello(
                hello, peer=self.address, peer_role="server", versions=self._versions
            )
        except TabletStoreError as exc:
            self._dead = True
            if not self._handshake.done():
                self._handshake.set_exception(exc)
            return
        self.peer_max_frame = hello.max_frame
        if self._token is not None:  # before any request (rpc/auth.py)
            self.write(frames.encode_frame(Kind.AUTH, 0, self._token.encode()))
        if not self._handshake.done():
            self._handshake.set_result(None)

    def frame_received(self, frame: Frame) -> None:
        self.last_used = self._loop.time()
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
            if isinstance(reason, PermissionDenied):
                # Refused before any request ran: not retried, not Indeterminate.
                self._refused(PermissionDenied(f"{self.address} refused us: {reason}"))
                return
            if isinstance(reason, Unimplemented):
                # It refused our hello (a protocol version it does not speak), before reading
                # any request: nothing ran, and trying again cannot help.
                self._refused(Unimplemented(f"{self.address} refused us: {reason}"))
                return
            self._abort(
                Unavailable(
                    f"connection to {self.address} closed by the server: "
                    f"{type(reason).__name__}: {reason}"
                )
            )

    def fail(self, exc: TabletStoreError) -> None:
        # A server that breaks the frame format: nothing more it sends can be trusted.
        self._abort(Unavailable(f"connection to {self.address} broken: {exc}"))

    def _refused(self, failure: PermissionDenied | Unimplemented) -> None:
        self._dead = True
        self.failure = failure
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(failure)
        streams, self.streams = self.streams, {}
        for queue in streams.values():
            queue.put_nowait(failure)
        if self.transport is not None:
            self.transport.abort()

    def closed(self, exc: Exception | None) -> None:
        failure = Unavailable(f"connection to {self.address} lost")
        if not self._handshake.done():
            # No request is sent before the handshake completes.
            tls = self.transport is not None and self.transport.get_extra_info("sslcontext")
            if (tls and exc is None) or isinstance(exc, ssl.SSLError):
                # Our side of TLS was done; the server closed cleanly before its hello: its TLS
                # refused our certificate (none, another CA's, expired). Retrying cannot help.
                # (A server going away resets the connection, or says Unavailable first.)
                self._refused(
                    PermissionDenied(
                        f"{self.address} closed the TLS connection before its handshake: it "
                        "refused our certificate (missing, expired or from another CA)"
                    )
                )
                self._handshake.set_exception(self.failure or failure)
                return
            self._handshake.set_exception(
                Unreachable(
                    f"cannot connect to {self.address}: closed during the handshake (if the "
                    "server requires TLS, pass --tls-ca and a certificate or token)"
                )
            )
        self._fail_all(failure)

    def _abort(self, failure: TabletStoreError) -> None:
        self._dead = True
        self._fail_all(failure)
        if self.transport is not None:
            self.transport.abort()

    def _fail_all(self, failure: TabletStoreError) -> None:
        """The connection is gone: later sends raise Unreachable naming ``failure``; the
        requests in flight were sent and get no answer, so each fails Indeterminate."""
        if self.failure is None:
            self.failure = failure
        failure = self.failure
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(_no_answer(failure))
        streams, self.streams = self.streams, {}
        for queue in streams.values():
            queue.put_nowait(_no_answer(failure))

    async def aclose(self) -> None:
        """The RpcClient was closed by its owner: requests in flight fail Indeterminate."""
        self._fail_all(Closed(f"connection to {self.address} was closed by this client"))
        if self.transport is not None:
            await self.close_and_wait()

    async def discard(self) -> None:
        """Drop a connection found dead (its transport closing, say on the peer's EOF, before
        ``connection_lost`` has run) to open a new one: its requests in flight were sent and
        will get no answer, exactly as if the connection had been lost."""
        self._fail_all(Unavailable(f"connection to {self.address} lost"))
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
        auth: ClientAuth | None = None,
        server_role: str | None = None,
        versions: Versions = SPOKEN,
    ) -> None:
        if stream_window < 1:
            raise InvalidArgument(f"stream_window must be at least 1, got {stream_window}")
        self.host = host
        self.port = port
        self.address = format_address(host, port)
        self.codec = codec
        self.max_frame = max_frame
        self.connect_timeout = connect_timeout
        self.stream_window = stream_window
        self.auth = auth
        #: The role the server's certificate must name (None: worker or master).
        self.server_role = server_role
        #: The protocol versions it speaks (rpc/versions.py; default this build's).
        self.versions = versions
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
                await conn.discard()
            self._connect_attempts += 1
            try:
                self._conn = await _ClientConnection.open(
                    self.host,
                    self.port,
                    max_frame=self.max_frame,
                    connect_timeout=self.connect_timeout,
                    auth=self.auth,
                    server_role=self.server_role,
                    versions=self.versions,
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
        on_behalf: str | None = None,
        since: int = 0,
    ) -> Any:
        """Send ``request`` to unary ``method`` (the wire's routing key) and return its decoded
        response; with ``on_behalf``, as a request made on behalf of that principal (the
        server accepts it only from a delegating principal: rpc/auth.py). ``since``: the
        protocol version that added ``method`` (``transport.Method.since``; 0: every one).

        Raises the handler's error; Unreachable if the request could not be sent;
        Indeterminate if it was sent and no answer came: the connection dropped, or the call
        (connecting included) took longer than ``timeout`` seconds, in which case the server
        is told to cancel it (Unreachable if it timed out before it was sent). Unimplemented,
        with nothing sent, if the server's protocol version cannot carry the call
        (``on_behalf`` to a server of version 6, a method added ``since`` a version the server
        does not speak) or the server refuses ours.
        """
        sent = [False]
        if timeout is None:
            return await self._call(method, request, sent, on_behalf, since)
        try:
            async with asyncio.timeout(timeout):
                return await self._call(method, request, sent, on_behalf, since)
        except TimeoutError:
            if not sent[0]:
                raise Unreachable(
                    f"call {method!r} to {self.address} not sent within {timeout} s"
                ) from None
            raise Indeterminate(
                f"call {method!r} to {self.address} timed out after {timeout} s; it may have "
                "been applied"
            ) from None

    async def _call(
        self,
        method: str,
        request: object,
        sent: list[bool],
        on_behalf: str | None,
        since: int = 0,
    ) -> Any:
        """One call; ``sent[0]`` becomes True once the request may reach the server."""
        payload = self.codec.encode(request)
        conn = self._conn
        if conn is None or not conn.alive:
            conn = await self.connection()
        if on_behalf is not None:
            require(
                conn.version,
                REQUEST_AS_VERSION,
                "a request on behalf of another principal (REQUEST_AS)",
                connection=f"to server {self.address}",
            )
        if since:
            require(
                conn.version, since, f"method {method!r}", connection=f"to server {self.address}"
            )
        request_frame = frames.encode_request(
            rid := conn.new_id(), method, payload, on_behalf=on_behalf
        )
        frames.check_outgoing(
            len(request_frame) - frames.HEADER.size, conn.peer_max_frame, "request"
        )
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        conn.pending[rid] = future
        try:
            conn.send(request_frame)
            sent[0] = True
            await conn.drain()
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
        start = stopwatch()
        try:
            conn.send(frames.encode_frame(Kind.PING, rid))
            async with asyncio.timeout(timeout):
                await conn.drain()
                await future
        except TimeoutError:
            conn.pending.pop(rid, None)
            raise Unavailable(f"ping to {self.address} timed out after {timeout} s") from None
        except BaseException:
            conn.pending.pop(rid, None)
            raise
        return stopwatch() - start


def _reply_error(frame: Frame, method: str, address: str) -> TabletStoreError:
    """The error a non-success reply frame stands for (a reply of the wrong kind: the request
    was sent and no usable answer came)."""
    if frame.kind == Kind.ERROR:
        return decode_error(frame.body)
    return Indeterminate(
        f"protocol error from {address}: frame kind {frame.kind} in reply to {method!r}"
    )


def _no_answer(failure: TabletStoreError) -> Indeterminate:
    """What a request in flight on a connection that failed with ``failure`` gets."""
    return Indeterminate(f"{failure} with the request in flight; it may have been applied")


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
        conn.send(request_frame)
        await conn.drain()

    async def __anext__(self) -> Any:
        if self._conn is None:
            await self._start()
        if self._finished:
            raise StopAsyncIteration
        assert self._queue is not None and self._conn is not None
        try:
            if not self._queue.empty():  # arrived already (most items): no timer to arm
                got = self._queue.get_nowait()
            elif self._timeout is None:
                got = await self._queue.get()
            else:
                async with asyncio.timeout(self._timeout):
                    got = await self._queue.get()
        except TimeoutError:
            await self.aclose()
            raise Indeterminate(
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
    """One RpcClient per address ("HOST:PORT") and server role, created on first ``get``."""

    def __init__(self, **client_options: Any) -> None:
        self._options = client_options
        self._clients: dict[tuple[str, str | None], RpcClient] = {}
        self._closed = False

    def get(self, address: str, server_role: str | None = None) -> RpcClient:
        if self._closed:
            raise Closed("RpcClientPool is closed")
        key = (address, server_role)
        client = self._clients.get(key)
        if client is None:
            host, port = parse_address(address)
            client = self._clients[key] = RpcClient(
                host, port, server_role=server_role, **self._options
            )
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


#: The role whose certificate a server of each service must present (``check_server``).
_SERVER_ROLE = {"TabletService": "worker", "MasterService": "master"}


class TcpTransport:
    """The Transport (``rpc/transport.py``) over TCP: ``address`` is the peer's "HOST:PORT".

    ``timeout`` bounds each call (and each streamed item) unless the call gives its own. A
    unary response is checked to be of the method's declared type: anything else means the
    peer runs another version (the request ran: Indeterminate).

    A call to the master made while ``auth.ACTING_FOR`` names a principal goes on behalf of
    it (REQUEST_AS). Master calls are made in their caller's task, so the variable is the
    caller's; data calls instead carry the caller in their ``identity`` field, which stays
    right when the client coalesces many callers' requests in a task of its own."""

    def __init__(self, *, timeout: float | None = None, **client_options: Any) -> None:
        self._pool = RpcClientPool(**client_options)
        self._timeout = timeout

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport contract's bound)
    ) -> Any:
        on_behalf = ACTING_FOR.get() if method.service == "MasterService" else None
        response = await self._pool.get(address, _SERVER_ROLE.get(method.service)).call(
            method.name,
            request,
            timeout=self._timeout if timeout is None else timeout,
            on_behalf=on_behalf,
            since=method.since,
        )
        if not isinstance(response, method.response_types):
            raise Indeterminate(
                f"{method!r} at {address} answered a {type(response).__name__}, not "
                f"{method.response}; do both sides run the same version?"
            )
        return response

    async def stream(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport contract's per-item bound)
    ) -> AsyncIterator[Any]:
        # Closing this generator early (aclose, or a break in an ``async with aclosing``)
        # leaves the block below, which CANCELs the stream on the server.
        items = self._pool.get(address, _SERVER_ROLE.get(method.service)).stream(
            method.name, request, timeout=self._timeout if timeout is None else timeout
        )
        async with items:
            async for item in items:
                yield item

    async def close(self) -> None:
        await self._pool.close()
