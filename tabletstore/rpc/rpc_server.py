"""The RPC server: RpcServer and its per-connection request dispatch (docs/architecture/design.md
§8).

Size: over 800 lines because one connection's life (admission, TLS handshake, hello,
authentication, frames, the byte budget, timeouts, dispatch) is one state machine whose
invariant -- nothing unauthenticated holds a shared resource -- must be readable in one place;
the bookkeeping it calls is ``admission.py``, the bytes ``frames.py`` and ``connection.py``.

Tablet-server workers and the master serve their methods through this module (paper §5, §5.2);
the behaviour both sides of a connection promise is written in tcp.py's docstring. A server is
a mapping from method name to handler (for a service, ``services.Service.handlers``): ``async
def f(request) -> response`` (unary) or an async generator yielding items (streaming). Each accepted connection is one task owned by the
server; each request is one task in that connection's TaskGroup, so replies leave in the order
they complete. Stream producers wait for the client's credit (frames.py) before each item.

What a client may take (connections, buffered bytes, silence) is capped by
``options.RpcServerOptions``; the bookkeeping is ``rpc/admission.py``, called from this module's
connection hooks (admission in ``connection_made``, the byte budget around reads and requests,
the watchdog after the handshake).

With ``auth`` the server listens on plain TCP and runs each TLS handshake itself, after the
connection is admitted: a new connection counts in the handshake gate (``handshaking``: the
``max_unauthenticated`` caps, by its peer's IP address) before a byte of TLS is exchanged, and
one over its caps is closed unread, so a flood of connections costs neither handshakes nor
their memory. The handshake is bounded by ``handshake_timeout``; then the connection leaves
the handshake gate for the main gate (a client certificate) or the unauthenticated gate (none:
until its token is accepted).

With ``auth`` (rpc/auth.py) the server speaks TLS only and each connection has a proven
principal (its certificate's, or its AUTH frame's token's); every request's handler runs with it
as ``auth.current_principal()``. Requests that arrive while a token is being checked wait for
it; a connection that proves nothing is refused at its first request. A token connection's
token is checked again every ``ServerAuth.token_recheck`` seconds (at the next request), and
the connection is refused once the token is revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from types import TracebackType
from typing import Any, Self

from tabletstore.clock import monotonic
from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    PermissionDenied,
    TabletStoreError,
    Unavailable,
    Unimplemented,
)
from tabletstore.options import RpcServerOptions
from tabletstore.rpc import frames
from tabletstore.rpc.admission import (
    MAX_AUTH_FRAME,
    ByteBudget,
    ConnectionGate,
    ReadGuard,
    Watchdog,
    check_options,
)
from tabletstore.rpc.auth import (
    Principal,
    ServerAuth,
    TokenVerifier,
    delegated,
    peer_principal,
    set_principal,
)
from tabletstore.rpc.codec import DEFAULT_CODEC, Codec, encode_error
from tabletstore.rpc.connection import LINGER, FrameConnection, format_address
from tabletstore.rpc.frames import Frame, Kind
from tabletstore.rpc.transport import Handler
from tabletstore.rpc.versions import REQUEST_AS_VERSION, SPOKEN, Versions, require

__all__ = ["Handler", "RpcServer"]

logger = logging.getLogger(__name__)

# How long close() waits for cancelled handlers after the grace period before giving up.
_ABORT_WAIT = 2.0
# Requests larger than this are decoded on a thread: decoding builds one Python object per
# value, a few microseconds each, so a frame packed with tiny values (millions of filter nodes
# or row ranges) would hold the event loop, and the lease keep-alive on it, for seconds. On a
# thread the loop still gets the GIL every switch interval.
_INLINE_DECODE_BYTES = 64 * 1024


def _wire_error(exc: BaseException, method: str, where: str) -> TabletStoreError:
    """What a handler's exception becomes on the wire: a TabletStoreError as it is; anything
    else is a bug that struck with the handler part way, so what it did is unknown:
    Indeterminate (the errors module's contract), logged here with its traceback."""
    if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        return _wire_error(exc.exceptions[0], method, where)
    if isinstance(exc, TabletStoreError):
        return exc
    logger.error("RPC handler %r on %s raised", method, where, exc_info=exc)
    return Indeterminate(f"internal error in {method!r} on {where}: {type(exc).__name__}: {exc}")


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


class RpcServer:
    """Serves ``handlers`` (method name → handler) on a TCP port.

    Use ``async with RpcServer(...) as server`` or ``await server.start()`` / ``await
    server.close()``; ``server.address`` is "HOST:PORT" once started (port 0 picks a free one).
    Each accepted connection runs as one task owned by the server (``close`` awaits them all),
    and each request as a task in its connection's TaskGroup. ``options`` caps what clients may
    take (default :class:`RpcServerOptions`); ``max_frame``, ``max_in_flight`` and
    ``handshake_timeout``, when given, override its fields of those names. ``versions``: the
    protocol versions it speaks (rpc/versions.py; default this build's, N and N−1).
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_frame: int | None = None,
        codec: Codec = DEFAULT_CODEC,
        max_in_flight: int | None = None,
        handshake_timeout: float | None = None,
        options: RpcServerOptions | None = None,
        auth: ServerAuth | None = None,
        versions: Versions = SPOKEN,
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
        options = options or RpcServerOptions()
        if max_frame is not None:
            options = dataclasses.replace(options, max_frame=max_frame)
        if max_in_flight is not None:
            options = dataclasses.replace(options, max_in_flight=max_in_flight)
        if handshake_timeout is not None:
            options = dataclasses.replace(options, handshake_timeout=handshake_timeout)
        check_options(options)
        self.options = options
        self._host = host
        self._port = port
        self.max_frame = options.max_frame
        self.codec = codec
        self.max_in_flight = options.max_in_flight
        self.handshake_timeout = options.handshake_timeout
        #: Open connections and refusals (rpc/admission.py), read by the metrics.
        self.gate = ConnectionGate(options.max_connections, options.max_connections_per_peer)
        #: Connections that have not proven who they are yet (with auth): a gate of their own.
        self.unauthenticated = ConnectionGate(
            options.max_unauthenticated,
            options.max_unauthenticated_per_peer,
            ("max_unauthenticated", "max_unauthenticated_per_peer"),
        )
        #: With auth: connections in their TLS handshake (admitted before it starts).
        self.handshaking = ConnectionGate(
            options.max_unauthenticated,
            options.max_unauthenticated_per_peer,
            ("max_unauthenticated", "max_unauthenticated_per_peer"),
        )
        #: Bytes held by connections: frames being received, requests being handled.
        self.budget = ByteBudget(options.max_buffered_bytes)
        self.auth = auth
        self.versions = versions
        self._server: asyncio.Server | None = None
        # With auth: the listening sockets, their accept loops and the handshakes under way.
        self._listeners: list[socket.socket] = []
        self._accepting: set[asyncio.Task[None]] = set()
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
        if self.auth is not None:
            await self._listen_tls(loop)
            return
        self._server = await loop.create_server(
            lambda: _ServerConnection(self), self._host, self._port
        )
        self._port = self._server.sockets[0].getsockname()[1]
        self.address = format_address(self._host, self._port)

    async def _listen_tls(self, loop: asyncio.AbstractEventLoop) -> None:
        """Listen on every address of the host (one port), accepting in tasks of our own."""
        infos = await loop.getaddrinfo(
            self._host, self._port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
        seen = set()
        try:
            for family, kind, proto, _, sockaddr in infos:
                if (family, sockaddr[0]) in seen:
                    continue
                seen.add((family, sockaddr[0]))
                sock = socket.socket(family, kind, proto)
                self._listeners.append(sock)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                sock.bind((sockaddr[0], self._port, *sockaddr[2:]))
                sock.listen(_BACKLOG)
                sock.setblocking(False)
                self._port = sock.getsockname()[1]  # the others take the first one's port
        except OSError:
            for sock in self._listeners:
                sock.close()
            self._listeners.clear()
            raise
        self.address = format_address(self._host, self._port)
        for sock in self._listeners:
            self._track(loop.create_task(self._accept(loop, sock)))

    def _track(self, task: asyncio.Task[None]) -> None:
        self._accepting.add(task)
        task.add_done_callback(self._accepting.discard)

    async def _accept(self, loop: asyncio.AbstractEventLoop, listener: socket.socket) -> None:
        """Accept connections; admit each to the handshake gate before its handshake."""
        assert self.auth is not None
        context = self.auth.ssl_context()
        while not self._closing:
            try:
                sock, peer = await loop.sock_accept(listener)
            except OSError as exc:  # out of descriptors, say: the backlog waits meanwhile
                logger.warning("accepting on %s failed: %s", self.address, exc)
                await asyncio.sleep(0.1)
                continue
            host = str(peer[0])
            refusal = self.handshaking.admit(host, self.address)
            if refusal is not None or self._closing:
                logger.info("%s", refusal or f"server {self.address} is shutting down")
                if refusal is None:
                    self.handshaking.release(host)
                sock.close()
                continue
            self._track(loop.create_task(self._handshake(loop, sock, host, context)))

    async def _handshake(
        self, loop: asyncio.AbstractEventLoop, sock: socket.socket, host: str, context: Any
    ) -> None:
        """The TLS handshake of an admitted connection, within ``handshake_timeout``; its slot
        in the handshake gate is given back when the connection is made (``connection_made``)
        or the handshake fails."""
        conn = _ServerConnection(self, admitted=True)
        try:
            sock.setblocking(False)
            await loop.connect_accepted_socket(
                lambda: conn, sock, ssl=context, ssl_handshake_timeout=self.handshake_timeout
            )
        except BaseException as exc:  # no handshake (timed out, not TLS, refused certificate)
            if not conn.made:
                self.handshaking.release(host)
                self.handshaking.closed_by_watchdog("handshake")
                sock.close()
            if not isinstance(exc, Exception):
                raise

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
        for task in list(self._accepting):
            task.cancel()
        if self._accepting:
            await asyncio.wait(list(self._accepting), timeout=_ABORT_WAIT)
        for sock in self._listeners:
            sock.close()
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
                _, stuck = await asyncio.wait(late, timeout=_ABORT_WAIT)
                for conn, task in connections.items():
                    if task in stuck and conn.transport is not None:
                        # Nor leave its connection open: it would answer every later request
                        # "shutting down" for as long as the handler runs, and its clients
                        # never reach a new server on this address (a worker that rejoins in
                        # its process listens there again at once).
                        conn.transport.abort()
        if self._server is not None:
            await self._server.wait_closed()

    def accepted(self, conn: _ServerConnection) -> asyncio.Task[None] | None:
        """Called by a new connection (admitted by the gate): its task, or None if the server
        is closing."""
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


#: Bytes a connection may send after its AUTH frame that are held, unread, until its token is
#: accepted (what one socket read brings, at most; more is refused).
_AFTER_AUTH = 512 * 1024
#: Connections the kernel queues for a listening socket that is not accepting fast enough.
_BACKLOG = 128
_NO_IDENTITY = "presented no client certificate and no token"


def _retrieve(task: asyncio.Task[None]) -> None:
    """A token check's failure is read by the requests awaiting it; none may be left."""
    if not task.cancelled():
        task.exception()


class _ServerConnection(FrameConnection):
    """One accepted connection: dispatches frames, runs each request as a task, replies."""

    def __init__(self, server: RpcServer, *, admitted: bool = False) -> None:
        super().__init__(
            server.max_frame, frames.encode_hello(server.max_frame, server.versions.highest)
        )
        self._server = server
        #: The protocol version of this connection, once the client's hello is in.
        self.version = 0
        # Admitted to the handshake gate before its TLS handshake (RpcServer._accept).
        self._admitted = admitted
        #: Whether connection_made ran (the slot is then this connection's to give back).
        self.made = False
        self._codec = server.codec
        self._peer = "unknown peer"
        self._peer_host = "unknown"
        self._peer_max_frame = server.max_frame
        self._gate: ConnectionGate | None = None  # the gate counting it, once admitted
        # Without a certificate on a server with auth: only the hello and the AUTH frame are
        # read until the token is accepted (``_gatekeep``); what follows waits here.
        self._gatekept = False
        self._pending_in = bytearray()
        self._received = 0  # bytes read (the watchdog's receive rate)
        self._guard = ReadGuard(
            server.budget, server.options.connection_bytes, self._pause_reading, self._resume
        )
        self._held: dict[int, int] = {}  # request id → bytes of its body still held
        self._watchdog = Watchdog(
            self._loop,
            stall_timeout=server.options.stall_timeout,
            idle_timeout=server.options.idle_timeout,
            min_receive_rate=server.options.min_receive_rate,
            midframe=lambda: self._parser.partial[1] > 0,
            busy=lambda: bool(self._tasks),
            paused=lambda: self._guard.paused,
            received=lambda: self._received,
            expire=self._expire,
        )
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
        # The connection's proven principal (rpc/auth.py); None without auth.
        self._principal: asyncio.Future[Principal | None] = self._loop.create_future()
        self._auth_sent = False
        # A token connection's token and when it was last found valid (monotonic seconds).
        self._token: str | None = None
        self._token_checked = 0.0
        self._recheck: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made = True
        super().connection_made(transport)
        peer = transport.get_extra_info("peername")
        if self._admitted and peer:
            self._server.handshaking.release(str(peer[0]))
        if peer:
            self._peer = format_address(peer[0], peer[1])
            self._peer_host = str(peer[0])
        principal: Principal | None = None
        refused: PermissionDenied | None = None
        if self._server.auth is not None:
            try:
                principal = peer_principal(transport.get_extra_info("peercert"), self._peer)
            except PermissionDenied as exc:
                refused = exc
            self._gatekept = principal is None and refused is None
        gate = self._server.unauthenticated if self._gatekept else self._server.gate
        refusal = gate.admit(self._peer_host, self._server.address)
        if refusal is not None:
            # The hello, then why: the client's next call fails Unreachable with this reason.
            # (Unauthenticated floods are counted, not logged one line each.)
            logger.log(logging.INFO if self._gatekept else logging.WARNING, "%s", refusal)
            self.fail(Unavailable(refusal))
            return
        self._gate = gate
        if self._server.accepted(self) is None:
            # Say why before closing: a client must not take a clean close for a refusal of
            # its certificate (rpc/rpc_client.py), and may retry elsewhere.
            self._dead = True
            self.write(
                frames.encode_frame(
                    Kind.ERROR,
                    0,
                    encode_error(Unavailable(f"server {self._server.address} is shutting down")),
                )
            )
            self.close()
            return
        if refused is not None:
            self._refuse(refused)
        elif not self._gatekept:
            self._principal.set_result(principal)  # None without auth
        # else: the client must send a token (AUTH) first (``_gatekeep``)

    def _refuse(self, exc: PermissionDenied) -> None:
        logger.info("refusing RPC connection from %s: %s", self._peer, exc)
        if not self._principal.done():
            self._principal.set_exception(exc)
            self._principal.exception()  # retrieved: requests waiting on it get it too
        self.fail(exc)

    async def _authenticate(self, token: str) -> None:
        auth = self._server.auth
        try:
            if auth is None or auth.tokens is None:
                raise PermissionDenied(
                    f"server {self._server.address} does not accept bearer tokens: "
                    "connect with a client certificate"
                )
            principal = await auth.tokens.verify(token)
        except PermissionDenied as exc:
            self._refuse(PermissionDenied(f"connection from {self._peer}: {exc}"))
            return
        except TabletStoreError as exc:  # the coordinator is unreachable: retry later
            self._refuse(PermissionDenied(f"cannot check the token of {self._peer} now: {exc}"))
            return
        self._token, self._token_checked = token, monotonic()
        if not self._principal.done():
            self._principal.set_result(principal)
        self._ungate()

    def _ungate(self) -> None:
        """The token is accepted: move to the authenticated gate and read on."""
        if not self._gatekept or self._dead:
            return
        self._gatekept = False
        server = self._server
        server.unauthenticated.release(self._peer_host)
        self._gate = None
        refusal = server.gate.admit(self._peer_host, server.address)
        if refusal is not None:
            logger.warning("%s", refusal)
            self.fail(Unavailable(refusal))
            return
        self._gate = server.gate
        pending, self._pending_in = bytes(self._pending_in), bytearray()
        self._resume()
        if pending:
            self._read(pending)

    async def _token_still_valid(self) -> None:
        """Check the connection's token again once its last check is older than
        ``token_recheck``: in the background while the last good check is younger than
        ``token_stale_limit`` (a request does not wait on etcd; a revocation found refuses the
        connection, so the requests after it fail PermissionDenied), else waited for
        (Unavailable if the coordinator still cannot answer). One check at a time."""
        auth = self._server.auth
        if self._token is None or auth is None or auth.tokens is None:
            return
        age = monotonic() - self._token_checked
        if age < auth.token_recheck:
            return
        if self._recheck is None:
            self._recheck = self._loop.create_task(self._check_token(auth.tokens, self._token))
            self._recheck.add_done_callback(_retrieve)
        if age < auth.token_stale_limit:
            return
        try:
            await asyncio.shield(self._recheck)
        except PermissionDenied:
            raise
        except TabletStoreError as exc:  # the coordinator cannot answer
            raise Unavailable(
                f"cannot check the token of {self._peer} for {age:.0f} s: {exc}"
            ) from exc

    async def _check_token(self, tokens: TokenVerifier, token: str) -> None:
        try:
            await tokens.verify(token)
        except PermissionDenied as exc:
            refusal = PermissionDenied(f"connection from {self._peer}: {exc}")
            self._refuse(refusal)
            raise refusal from exc
        else:
            self._token_checked = monotonic()
        finally:
            self._recheck = None

    # -- resource caps (rpc/admission.py) --

    def data_received(self, data: bytes) -> None:
        if self._gatekept:
            self._gatekeep(data)
        else:
            self._read(data)

    def _read(self, data: bytes) -> None:
        super().data_received(data)
        if not self._dead:
            self._received += len(data)
            self._guard.after_read(*self._parser.partial)
            self._watchdog.touch()

    def _gatekeep(self, data: bytes) -> None:
        """Before a certificate-less connection's token is accepted, read nothing but its hello
        and one AUTH frame of at most MAX_AUTH_FRAME bytes: anything else is refused before it
        is buffered, and what follows the AUTH frame (at most _AFTER_AUTH bytes) waits, unread
        by the parser, with reading paused."""
        if self._dead:
            return
        buf = self._pending_in
        buf += data
        if self._auth_sent:
            if len(buf) > _AFTER_AUTH:
                self._refuse(
                    PermissionDenied(
                        f"connection from {self._peer} sent more than {_AFTER_AUTH} bytes "
                        "before its token was accepted"
                    )
                )
            return
        if len(buf) < frames.HELLO_SIZE:
            if len(buf) >= len(frames.MAGIC) and buf[: len(frames.MAGIC)] != frames.MAGIC:
                self._pending_in = bytearray()
                self._read(bytes(buf))  # the parser names the bad hello
            return
        hello = frames.decode_hello(bytes(buf[: frames.HELLO_SIZE]))
        if hello.magic != frames.MAGIC or hello.version < self._server.versions.lowest:
            # Not a hello this server takes: hello_received says why.
            self._pending_in = bytearray()
            self._read(bytes(buf[: frames.HELLO_SIZE]))
            return
        if len(buf) < frames.HELLO_SIZE + frames.HEADER.size:
            return
        length, kind, _ = frames.HEADER.unpack_from(buf, frames.HELLO_SIZE)
        if kind != Kind.AUTH or length > MAX_AUTH_FRAME:
            what = "no client certificate, and its first frame is not a token (AUTH)"
            if kind == Kind.REQUEST:
                what = _NO_IDENTITY
            self._refuse(
                PermissionDenied(
                    f"connection from {self._peer} {what}; server {self._server.address} "
                    "requires one"
                )
            )
            return
        end = frames.HELLO_SIZE + 4 + length
        if len(buf) < end:
            return
        self._pending_in = bytearray(buf[end:])
        self._pause_reading()
        self._read(bytes(buf[:end]))  # the hello, then the AUTH frame: _on_auth checks it

    def _pause_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.pause_reading()

    def _resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def _expire(self, reason: str, why: str) -> None:
        """The watchdog's verdict: tell the client why, and close."""
        self._server.gate.closed_by_watchdog(reason)
        logger.info("closing RPC connection from %s: %s", self._peer, why)
        self.fail(Unavailable(f"server {self._server.address} closed the connection: {why}"))

    def _release(self, rid: int) -> None:
        n = self._held.pop(rid, 0)
        if n:
            self._guard.release(n)

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                backlog, self._backlog = self._backlog, []
                for frame in backlog:
                    self._dispatch(frame)
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
                # The hello and, without a certificate, the token's acceptance.
                if await self._handshaken and not self._principal.done():
                    await asyncio.wait([self._principal])
        except TimeoutError:
            gate = self._server.unauthenticated if self._gatekept else self._server.gate
            gate.closed_by_watchdog("handshake")
            return  # a peer that never says hello, or proves nothing, gets nothing more
        principal = self._principal
        if self._handshaken.result() and not principal.cancelled() and not principal.exception():
            self._watchdog.start()
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
            self.version = frames.check_hello(
                hello, peer=self._peer, peer_role="client", versions=self._server.versions
            )
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
        if self._recheck is not None:
            self._recheck.cancel()
        self._watchdog.stop()
        self._guard.close()
        self._parser.discard()  # a half-received frame's bytes go now, not at the next GC
        if self._gate is not None:
            self._gate.release(self._peer_host)
            self._gate = None
        self._pending_in = bytearray()
        if not self._handshaken.done():
            self._handshaken.set_result(False)

    def frame_received(self, frame: Frame) -> None:
        self._guard.frame_done()
        if self._tg is None:
            self._backlog.append(frame)
            return
        self._dispatch(frame)

    def _dispatch(self, frame: Frame) -> None:
        kind = frame.kind
        if kind in (Kind.REQUEST, Kind.REQUEST_AS):
            self._on_request(frame)
        elif kind == Kind.CANCEL:
            task = self._tasks.get(frame.request_id)
            if task is not None:  # else it already finished: the reply crossed the CANCEL
                task.cancel()
        elif kind == Kind.CREDIT:
            self._on_credit(frame)
        elif kind == Kind.AUTH:
            self._on_auth(frame)
        elif kind == Kind.PING:
            self.write(
                frames.encode_frame(Kind.PONG, frame.request_id, frame.body), more_coming=True
            )
        else:
            self._reply_error(
                frame.request_id, InvalidArgument(f"unexpected frame kind {kind} from a client")
            )

    def _on_auth(self, frame: Frame) -> None:
        if self._auth_sent or self._principal.done():
            self._refuse(PermissionDenied("AUTH must be the first frame, sent once"))
            return
        self._auth_sent = True
        assert self._tg is not None  # frame_received keeps a backlog until it exists
        self._tg.create_task(self._authenticate(bytes(frame.body).decode("utf-8", "replace")))

    def _on_request(self, frame: Frame) -> None:
        rid = frame.request_id
        if not self._principal.done() and not self._auth_sent:
            self._refuse(
                PermissionDenied(
                    f"connection from {self._peer} {_NO_IDENTITY}; server "
                    f"{self._server.address} requires one"
                )
            )
            return
        try:
            if frame.kind == Kind.REQUEST_AS:
                require(
                    self.version,
                    REQUEST_AS_VERSION,
                    "a request on behalf of another principal (REQUEST_AS)",
                    connection=f"from client {self._peer}",
                )
                request = frames.parse_request_as(frame.body)
            else:
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
            coro = self._serve_stream(rid, request, fn, credit)
        else:
            coro = self._serve_unary(rid, request, fn)
        assert self._tg is not None  # frame_received keeps a backlog until it exists
        self._held[rid] = len(frame.body)
        self._guard.hold(len(frame.body))
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

    async def _authenticated(self, on_behalf: str | None) -> None:
        """Run the rest of this request's task as the connection's principal, or as the
        principal it acts for (REQUEST_AS; PermissionDenied unless it may: rpc/auth.py)."""
        principal = self._principal
        proven = principal.result() if principal.done() else await principal
        set_principal(delegated(proven, on_behalf))
        await self._token_still_valid()

    async def _serve_unary(
        self, rid: int, request: frames.Request, fn: Callable[[Any], Any]
    ) -> None:
        method = request.method
        try:
            try:
                await self._authenticated(request.on_behalf)
                response = await fn(await self._decode(request.payload))
            except asyncio.CancelledError:
                self._on_cancelled(rid)
                raise
            except Exception as exc:  # every handler failure becomes an ERROR reply, never a hang
                frame = self._error_frame(rid, exc, method)
            else:
                frame = self._response_frame(rid, response, method)
            # Other replies finishing in this loop iteration share the system call.
            self.write(frame, more_coming=len(self._tasks) > 1)
            await self.drain()
        finally:
            self._finished(rid)

    async def _serve_stream(
        self, rid: int, req: frames.Request, fn: Callable[[Any], Any], credit: _Credit
    ) -> None:
        method = req.method
        try:
            try:
                await self._authenticated(req.on_behalf)
                request = await self._decode(req.payload)
                self._release(rid)  # a stream may last long; its request is decoded
                async with contextlib.aclosing(fn(request)) as items:
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

    async def _decode(self, payload: memoryview) -> Any:
        if len(payload) <= _INLINE_DECODE_BYTES:
            return self._codec.decode(payload)
        return await asyncio.to_thread(self._codec.decode, payload)

    def _response_frame(self, rid: int, response: Any, method: str) -> bytes:
        """The RESPONSE frame; if the answer cannot be sent (too large for the peer, not
        encodable), the handler has run all the same: Indeterminate, never a refusal."""
        try:
            body = self._codec.encode(response)
            frames.check_outgoing(len(body), self._peer_max_frame, f"response to {method!r}")
        except TabletStoreError as exc:
            error = Indeterminate(f"{method!r} ran but its answer cannot be sent: {exc}")
            return frames.encode_frame(Kind.ERROR, rid, encode_error(error))
        return frames.encode_frame(Kind.RESPONSE, rid, body)

    def _on_cancelled(self, rid: int) -> None:
        # Cancelled by the client (CANCEL) or its disconnect: no reply. By close(): tell it why
        # (the handler was part way: its effect is unknown).
        if self._aborting:
            self._reply_error(
                rid,
                Indeterminate(
                    f"server {self._server.address} shut down while handling the request"
                ),
            )

    def _finished(self, rid: int) -> None:
        self._tasks.pop(rid, None)
        self._credits.pop(rid, None)
        self._release(rid)
        self._watchdog.touch()
        if self._draining and not self._tasks:
            self.close()

    def _error_frame(self, rid: int, exc: BaseException, method: str) -> bytes:
        error = _wire_error(exc, method, self._server.address)
        return frames.encode_frame(Kind.ERROR, rid, encode_error(error))

    def _reply_error(self, rid: int, exc: TabletStoreError) -> None:
        self.write(frames.encode_frame(Kind.ERROR, rid, encode_error(exc)), more_coming=True)
