"""The RPC transport over real sockets on 127.0.0.1 (tabletstore.rpc.tcp)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
from collections.abc import AsyncIterator

import pytest

from tabletstore import errors
from tabletstore.errors import (
    Closed,
    Indeterminate,
    InvalidArgument,
    NotFound,
    TabletStoreError,
    Unavailable,
    Unimplemented,
    Unreachable,
)
from tabletstore.rpc import frames
from tabletstore.rpc.codec import Codec, decode_error
from tabletstore.rpc.frames import Kind
from tabletstore.rpc.tcp import RpcClient, RpcClientPool, RpcServer, TcpTransport, parse_address
from tabletstore.rpc.transport import Method

pytestmark = [
    pytest.mark.timeout(60),
    # Overriding event_loop_policy (below) is deprecated in favour of a conftest hook,
    # pytest_asyncio_loop_factories; this module keeps to its own file.
    pytest.mark.filterwarnings('ignore:Overriding the "event_loop_policy" fixture'),
]


@pytest.fixture(scope="module", params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    """Every test runs on both loops: they differ in details the transport must not rely on."""
    if request.param == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        policy: asyncio.AbstractEventLoopPolicy = uvloop.EventLoopPolicy()
        return policy
    return asyncio.DefaultEventLoopPolicy()


@dataclasses.dataclass(frozen=True, slots=True)
class Echo:
    text: str
    blob: bytes = b""


@dataclasses.dataclass(frozen=True, slots=True)
class CountRequest:
    n: int
    fail_after: int | None = None


CODEC = Codec()
CODEC.register(1, Echo)
CODEC.register(2, CountRequest)


class Service:
    """Handlers with hooks the tests use to observe the server side."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.entered = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.produced = 0
        self.produced_8 = asyncio.Event()
        self.stream_closed = asyncio.Event()
        self.slow_entered = asyncio.Event()

    async def echo(self, request: Echo) -> Echo:
        return request

    async def wait(self, request: Echo) -> Echo:
        """Blocks until the test sets ``release``; records its cancellation."""
        self.entered.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        return Echo("released:" + request.text)

    async def slow(self, request: Echo) -> Echo:
        self.slow_entered.set()
        await asyncio.sleep(0.2)
        return request

    async def raise_error(self, request: Echo) -> Echo:
        cls = getattr(errors, request.text)
        raise cls(f"{request.text} raised on purpose")

    async def crash(self, request: Echo) -> Echo:
        return Echo(str(1 // 0))

    async def big(self, request: Echo) -> Echo:
        return Echo("x", b"\0" * 100_000)

    async def count(self, request: CountRequest) -> AsyncIterator[int]:
        try:
            for i in range(request.n):
                if request.fail_after is not None and i == request.fail_after:
                    raise NotFound(f"item {i} is gone")
                self.produced += 1
                if self.produced == 8:
                    self.produced_8.set()
                yield i
        finally:
            self.stream_closed.set()

    def handlers(self) -> dict[str, object]:
        names = ["echo", "wait", "slow", "raise_error", "crash", "big", "count"]
        return {name: getattr(self, name) for name in names}


@pytest.fixture
def service() -> Service:
    return Service()


@pytest.fixture
async def server(service: Service) -> AsyncIterator[RpcServer]:
    srv = RpcServer(service.handlers(), codec=CODEC, max_frame=64 * 1024)  # type: ignore[arg-type]
    await srv.start()
    yield srv
    await srv.close(grace=0.5)


@pytest.fixture
async def client(server: RpcServer) -> AsyncIterator[RpcClient]:
    async with RpcClient("127.0.0.1", server.port, codec=CODEC, stream_window=8) as c:
        yield c


async def test_unary_round_trip(client: RpcClient) -> None:
    assert await client.call("echo", Echo("hi", b"\x00\x01")) == Echo("hi", b"\x00\x01")
    assert await client.ping() >= 0


async def test_thousand_concurrent_calls_on_one_connection(
    server: RpcServer, client: RpcClient
) -> None:
    requests = [Echo(str(i)) for i in range(1000)]
    results = await asyncio.gather(*(client.call("echo", r) for r in requests))
    assert results == requests
    assert server.connection_count == 1


async def test_out_of_order_completion(client: RpcClient, service: Service) -> None:
    slow = asyncio.ensure_future(client.call("wait", Echo("first")))
    await asyncio.wait_for(service.entered.wait(), 5)
    assert await client.call("echo", Echo("second")) == Echo("second")
    assert not slow.done()
    service.release.set()
    assert await asyncio.wait_for(slow, 5) == Echo("released:first")


async def test_stream_many_items(client: RpcClient) -> None:
    async with client.stream("count", CountRequest(5000)) as items:
        got = [item async for item in items]
    assert got == list(range(5000))
    # Plain iteration (no context manager) also works.
    assert [i async for i in client.stream("count", CountRequest(3))] == [0, 1, 2]


async def test_stream_early_exit_cancels_server(client: RpcClient, service: Service) -> None:
    async with client.stream("count", CountRequest(1_000_000), window=8) as items:
        async for item in items:
            if item == 4:
                break
    await asyncio.wait_for(service.stream_closed.wait(), 5)
    assert service.produced <= 5 + 8 + 1
    assert await client.call("echo", Echo("still fine")) == Echo("still fine")


async def test_stream_backpressure(client: RpcClient, service: Service) -> None:
    async with client.stream("count", CountRequest(1_000_000), window=8) as items:
        assert await anext(items) == 0
        # The client consumes nothing more: the producer must stop near the window.
        await asyncio.wait_for(service.produced_8.wait(), 5)
        await asyncio.sleep(0.1)  # bounded: give an unbounded producer the chance to run on
        assert service.produced <= 1 + 8 + 1


async def test_stream_error_mid_stream(client: RpcClient) -> None:
    got = []
    with pytest.raises(NotFound, match="item 3 is gone"):
        async for item in client.stream("count", CountRequest(10, fail_after=3)):
            got.append(item)
    assert got == [0, 1, 2]


@pytest.mark.parametrize("name", [c.__name__ for c in errors.ERROR_CODES])
async def test_handler_error_classes_cross(client: RpcClient, name: str) -> None:
    with pytest.raises(TabletStoreError) as info:
        await client.call("raise_error", Echo(name))
    assert type(info.value) is getattr(errors, name)
    assert str(info.value) == f"{name} raised on purpose"


async def test_handler_crash_is_clear_error(client: RpcClient) -> None:
    # The handler stopped part way: what it did is unknown.
    with pytest.raises(Indeterminate, match=r"internal error in 'crash'.*ZeroDivisionError"):
        await client.call("crash", Echo(""))
    assert await client.call("echo", Echo("ok")) == Echo("ok")


async def test_unknown_method_and_kind_mismatch(client: RpcClient) -> None:
    with pytest.raises(Unimplemented, match=r"no RPC method 'nope'.*echo"):
        await client.call("nope", Echo(""))
    with pytest.raises(InvalidArgument, match="streams its results"):
        await client.call("count", CountRequest(1))
    with pytest.raises(InvalidArgument, match="is unary"):
        await anext(client.stream("echo", Echo("")))


async def test_oversized_request_and_response(client: RpcClient, server: RpcServer) -> None:
    with pytest.raises(InvalidArgument, match="exceeds the peer's 64 KiB frame limit"):
        await client.call("echo", Echo("x", b"\0" * 100_000))
    assert await client.call("echo", Echo("ok")) == Echo("ok")
    assert len((await client.call("big", Echo(""))).blob) == 100_000  # within 16 MiB
    async with RpcClient("127.0.0.1", server.port, codec=CODEC, max_frame=64 * 1024) as small:
        # The handler ran; only its answer could not be sent: never reported as refused.
        with pytest.raises(Indeterminate, match=r"'big' ran but.*response to 'big'.*exceeds"):
            await small.call("big", Echo(""))
        assert await small.call("echo", Echo("ok")) == Echo("ok")


async def test_timeout_cancels_on_server(client: RpcClient, service: Service) -> None:
    # Sent, then no answer in time: it may have been applied.
    with pytest.raises(Indeterminate, match=rf"'wait' to 127\.0\.0\.1:{client.port} timed out"):
        await client.call("wait", Echo(""), timeout=0.2)
    await asyncio.wait_for(service.cancelled.wait(), 5)
    assert await client.call("echo", Echo("ok")) == Echo("ok")


async def test_caller_cancellation_cancels_on_server(client: RpcClient, service: Service) -> None:
    task = asyncio.ensure_future(client.call("wait", Echo("")))
    await asyncio.wait_for(service.entered.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await asyncio.wait_for(service.cancelled.wait(), 5)


async def test_stream_item_timeout(client: RpcClient, service: Service) -> None:
    server_side = {"wait": service.wait}
    async with RpcServer(server_side, codec=CODEC) as srv:  # type: ignore[arg-type]
        srv._streaming["hang"] = _hang
        async with RpcClient("127.0.0.1", srv.port, codec=CODEC) as c:
            with pytest.raises(Indeterminate, match=r"no item within 0.2 s"):
                async for _ in c.stream("hang", Echo(""), timeout=0.2):
                    pass


async def _hang(request: Echo) -> AsyncIterator[int]:
    yield 1
    await asyncio.Event().wait()
    yield 2  # pragma: no cover


async def test_server_closed_mid_call(
    client: RpcClient, server: RpcServer, service: Service
) -> None:
    call = asyncio.ensure_future(client.call("wait", Echo("")))
    await asyncio.wait_for(service.entered.wait(), 5)
    async with asyncio.timeout(5):
        await server.close(grace=0.1)
        with pytest.raises(Indeterminate, match=r"shut down|lost"):
            await call
    with pytest.raises(Unavailable, match="cannot connect"):
        await client.call("echo", Echo(""))


async def test_graceful_close_finishes_in_flight(
    server: RpcServer, client: RpcClient, service: Service
) -> None:
    call = asyncio.ensure_future(client.call("slow", Echo("done")))
    await asyncio.wait_for(service.slow_entered.wait(), 10)  # the request reached the server
    await server.close(grace=5)
    assert await asyncio.wait_for(call, 5) == Echo("done")


async def test_close_drops_a_connection_whose_handler_ignores_cancellation(
    service: Service,
) -> None:
    """close() closes every connection, even one whose handler outlives its cancellation:
    left open, that connection answered each later request "shutting down", so a client
    never reached the server that listens on the address next (a worker that rejoined in its
    own process after losing its lease)."""
    stubborn = asyncio.Event()

    async def stubborn_wait(request: Echo) -> Echo:
        stubborn.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.Event().wait()
        await service.release.wait()  # a bug: it goes on after being cancelled
        return request

    handlers = {**service.handlers(), "stubborn": stubborn_wait}
    srv = RpcServer(handlers, codec=CODEC)  # type: ignore[arg-type]
    await srv.start()
    port = srv.port
    async with RpcClient("127.0.0.1", port, codec=CODEC) as c:
        call = asyncio.ensure_future(c.call("stubborn", Echo("")))
        await asyncio.wait_for(stubborn.wait(), 5)
        async with asyncio.timeout(30):
            await srv.close(grace=0.1)
        srv = RpcServer(service.handlers(), codec=CODEC, port=port)  # type: ignore[arg-type]
        await srv.start()
        try:
            with pytest.raises(Indeterminate):
                await asyncio.wait_for(call, 5)
            assert await c.call("echo", Echo("new"), timeout=5) == Echo("new")
        finally:
            service.release.set()
            await srv.close(grace=0.1)


async def test_dropped_connection_fails_calls_then_reconnects(service: Service) -> None:
    srv = RpcServer(service.handlers(), codec=CODEC)  # type: ignore[arg-type]
    await srv.start()
    port = srv.port
    async with RpcClient("127.0.0.1", port, codec=CODEC) as c:
        assert await c.call("echo", Echo("1")) == Echo("1")
        call = asyncio.ensure_future(c.call("wait", Echo("")))
        await asyncio.wait_for(service.entered.wait(), 5)
        for conn in list(srv._connections):
            conn.transport.abort()  # type: ignore[union-attr]  # a crash, not a graceful close
        with pytest.raises(Indeterminate, match=rf"connection to 127\.0\.0\.1:{port} lost"):
            await asyncio.wait_for(call, 5)
        await srv.close(grace=0.1)
        # Restart on the same port: the next call reconnects.
        srv = RpcServer(service.handlers(), codec=CODEC, port=port)  # type: ignore[arg-type]
        await srv.start()
        try:
            assert await c.call("echo", Echo("2"), timeout=5) == Echo("2")
        finally:
            await srv.close(grace=0.1)


async def test_a_connection_dropped_under_a_call_is_lost_not_closed(service: Service) -> None:
    """During a worker failover mutate_rows leaked ``Closed: connection ... was
    closed by this client``. A connection whose transport is closing (the peer's EOF arrived,
    ``connection_lost`` has not run yet) is replaced by the next call; the calls in flight on
    it were sent and get no answer: Indeterminate (maybe applied), never Closed."""
    async with RpcServer(service.handlers(), codec=CODEC) as srv:  # type: ignore[arg-type]
        async with RpcClient("127.0.0.1", srv.port, codec=CODEC) as c:
            first = asyncio.ensure_future(c.call("wait", Echo("")))
            await asyncio.wait_for(service.entered.wait(), 5)
            conn = await c.connection()
            assert conn.transport is not None
            conn.transport.close()  # closing now; connection_lost comes a loop iteration later
            # Awaited directly (no task), so it runs in this iteration: it finds the connection
            # dead and replaces it.
            assert await c.call("echo", Echo("2"), timeout=5) == Echo("2")
            with pytest.raises(Indeterminate, match="lost"):
                await asyncio.wait_for(first, 5)


async def test_a_request_on_a_failed_connection_is_not_sent(server: RpcServer) -> None:
    async with RpcClient("127.0.0.1", server.port, codec=CODEC) as c:
        conn = await c.connection()
        conn._abort(Unavailable("connection to the server lost"))
        with pytest.raises(Unreachable, match="not sent"):
            conn.send(frames.encode_request(1, "echo", CODEC.encode(Echo(""))))


async def test_a_connection_closed_during_the_handshake_is_unreachable() -> None:
    """A server that accepts and closes before its hello: nothing was sent, so the call is
    Unreachable (safe to send again), not a maybe-applied Unavailable."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    srv = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        async with RpcClient("127.0.0.1", port, codec=CODEC, connect_timeout=5) as c:
            with pytest.raises(Unreachable):
                await c.call("echo", Echo(""))
    finally:
        srv.close()
        await srv.wait_closed()


async def test_closed_client() -> None:
    c = RpcClient("127.0.0.1", 1, codec=CODEC)
    await c.close()
    with pytest.raises(Closed):
        await c.call("echo", Echo(""))


async def test_pool_and_transport(server: RpcServer) -> None:
    async with RpcClientPool(codec=CODEC) as pool:
        assert pool.get(server.address) is pool.get(server.address)
        with pytest.raises(InvalidArgument, match="HOST:PORT"):
            pool.get("no-port")
    assert parse_address("[::1]:7000") == ("::1", 7000)
    transport = TcpTransport(codec=CODEC, timeout=5)
    echo = Method("Test", "echo", Echo, Echo, (Echo,), streaming=False)
    count = Method("Test", "count", CountRequest, int, (int,), streaming=True)
    wrong = Method("Test", "echo", Echo, int, (int,), streaming=False)
    try:
        assert await transport.call(server.address, echo, Echo("t")) == Echo("t")
        items = transport.stream(server.address, count, CountRequest(3))
        assert [i async for i in items] == [0, 1, 2]
        # An answer of another type than the method declares: the peer runs another version.
        with pytest.raises(Indeterminate, match="answered a Echo"):
            await transport.call(server.address, wrong, Echo("t"))
    finally:
        await transport.close()


# -- protocol violations from raw sockets ------------------------------------------------------


async def _raw(
    server: RpcServer, hello: bytes | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frames.encode_hello(1 << 20) if hello is None else hello)
    server_hello = frames.decode_hello(await reader.readexactly(frames.HELLO_SIZE))
    assert server_hello == (frames.MAGIC, frames.PROTOCOL_VERSION, 64 * 1024)
    return reader, writer


async def _read_frame(reader: asyncio.StreamReader) -> frames.Frame:
    length, kind, rid = frames.HEADER.unpack(await reader.readexactly(frames.HEADER.size))
    return frames.Frame(kind, rid, await reader.readexactly(length - 5))


async def _expect_error(reader: asyncio.StreamReader, rid: int) -> TabletStoreError:
    frame = await asyncio.wait_for(_read_frame(reader), 5)
    assert (frame.kind, frame.request_id) == (Kind.ERROR, rid)
    return decode_error(frame.body)


async def _expect_closed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()


async def _still_serves(server: RpcServer) -> None:
    async with RpcClient("127.0.0.1", server.port, codec=CODEC) as c:
        assert await c.call("echo", Echo("alive")) == Echo("alive")


async def test_oversized_frame_gets_error_and_close(server: RpcServer) -> None:
    reader, writer = await _raw(server)
    writer.write(frames.HEADER.pack(2147483647, Kind.REQUEST, 1))
    error = await _expect_error(reader, 0)
    assert "frame of 2147483647 bytes exceeds the 64 KiB limit" in str(error)
    await _expect_closed(reader, writer)
    await _still_serves(server)


async def test_malformed_frame_gets_error_and_close(server: RpcServer) -> None:
    reader, writer = await _raw(server)
    writer.write(frames.HEADER.pack(2, Kind.REQUEST, 1))
    assert "shorter than the 5-byte header" in str(await _expect_error(reader, 0))
    await _expect_closed(reader, writer)
    await _still_serves(server)


async def test_bad_frames_on_an_intact_stream_keep_the_connection(server: RpcServer) -> None:
    reader, writer = await _raw(server)
    writer.write(frames.encode_frame(77, 5, b"junk"))
    assert "unexpected frame kind 77" in str(await _expect_error(reader, 5))
    writer.write(frames.encode_frame(Kind.REQUEST, 6, b"\x00"))
    assert "malformed REQUEST" in str(await _expect_error(reader, 6))
    writer.write(frames.encode_request(7, "echo", b"\xc1"))
    assert isinstance(await _expect_error(reader, 7), InvalidArgument)
    writer.write(frames.encode_request(8, "echo", CODEC.encode(Echo("same socket"))))
    frame = await asyncio.wait_for(_read_frame(reader), 5)
    assert (frame.kind, frame.request_id) == (Kind.RESPONSE, 8)
    assert CODEC.decode(frame.body) == Echo("same socket")
    writer.close()


async def test_wrong_magic(server: RpcServer) -> None:
    reader, writer = await _raw(server, hello=b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    error = await _expect_error(reader, 0)
    assert "expected magic b'TSRP', got b'GET '" in str(error)
    await _expect_closed(reader, writer)
    await _still_serves(server)


async def test_too_old_a_version_from_client(server: RpcServer) -> None:
    older = frames.PROTOCOL_VERSION - 2  # this build speaks N and N-1
    reader, writer = await _raw(server, hello=frames.encode_hello(1 << 20, version=older))
    error = await _expect_error(reader, 0)
    assert isinstance(error, Unimplemented)
    assert f"protocol version {older} at most; this side speaks versions" in str(error)
    await _expect_closed(reader, writer)
    await _still_serves(server)


async def test_too_old_a_version_from_server() -> None:
    finished = asyncio.Event()
    older = frames.PROTOCOL_VERSION - 2

    async def fake_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frames.encode_hello(1 << 20, version=older))
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()
        finished.set()

    srv = await asyncio.start_server(fake_server, "127.0.0.1", 0)
    port = srv.sockets[0].getsockname()[1]
    try:
        async with RpcClient("127.0.0.1", port, codec=CODEC) as c:
            with pytest.raises(
                Unimplemented, match=rf"server 127.0.0.1:.* speaks .* version {older} at most"
            ):
                await c.call("echo", Echo(""))
        await asyncio.wait_for(finished.wait(), 5)
    finally:
        srv.close()
        await srv.wait_closed()


async def test_connect_refused_is_unavailable() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: refuses connections
        async with RpcClient("127.0.0.1", port, codec=CODEC) as c:
            with pytest.raises(Unavailable, match=f"cannot connect to 127.0.0.1:{port}"):
                await c.call("echo", Echo(""))


async def test_calls_queued_behind_a_failed_connect_fail_together() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        async with RpcClient("127.0.0.1", port, codec=CODEC) as c:
            results = await asyncio.gather(
                *(c.call("echo", Echo("")) for _ in range(100)), return_exceptions=True
            )
            assert all(isinstance(r, Unavailable) for r in results)
            assert c._connect_attempts < 100


async def _silent_server(connections: int) -> tuple[asyncio.Server, asyncio.Event]:
    """Accepts connections and never says anything (not even a hello)."""
    finished = asyncio.Event()
    ended = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError):
            await reader.read()
        writer.close()
        ended.append(writer)
        if len(ended) == connections:
            finished.set()

    return await asyncio.start_server(silent, "127.0.0.1", 0), finished


async def test_connect_and_call_timeouts_against_a_silent_server() -> None:
    srv, finished = await _silent_server(connections=2)
    port = srv.sockets[0].getsockname()[1]
    try:
        async with RpcClient("127.0.0.1", port, codec=CODEC, connect_timeout=0.2) as c:
            with pytest.raises(Unavailable, match=r"no handshake within 0\.2 s"):
                await c.call("echo", Echo(""))
        async with RpcClient("127.0.0.1", port, codec=CODEC, connect_timeout=30) as c:
            # The timeout covers connecting; nothing was sent, so it is safe to send again.
            with pytest.raises(Unreachable, match=r"not sent within 0\.2 s"):
                await c.call("echo", Echo(""), timeout=0.2)
        await asyncio.wait_for(finished.wait(), 5)
    finally:
        srv.close()
        await srv.wait_closed()


async def test_server_drops_a_client_that_never_says_hello(service: Service) -> None:
    handlers = service.handlers()
    async with RpcServer(handlers, codec=CODEC, handshake_timeout=0.2) as srv:  # type: ignore[arg-type]
        reader, writer = await asyncio.open_connection("127.0.0.1", srv.port)
        assert len(await reader.readexactly(frames.HELLO_SIZE)) == frames.HELLO_SIZE
        await _expect_closed(reader, writer)
        await _still_serves(srv)


async def test_server_close_ends_open_streams(server: RpcServer, client: RpcClient) -> None:
    async with client.stream("count", CountRequest(1_000_000), window=4) as items:
        assert await anext(items) == 0
        async with asyncio.timeout(5):
            await server.close(grace=0.1)
            with pytest.raises(Indeterminate, match=r"shut down|lost"):
                async for _ in items:
                    pass


async def test_too_many_requests_in_flight(service: Service) -> None:
    handlers = service.handlers()
    async with RpcServer(handlers, codec=CODEC, max_in_flight=2) as srv:  # type: ignore[arg-type]
        async with RpcClient("127.0.0.1", srv.port, codec=CODEC) as c:
            waiting = [asyncio.ensure_future(c.call("wait", Echo(str(i)))) for i in range(2)]
            await asyncio.wait_for(service.entered.wait(), 5)
            with pytest.raises(Unavailable, match=r"too many requests in flight.*limit 2"):
                await c.call("wait", Echo("third"))
            service.release.set()
            assert [r.text for r in await asyncio.gather(*waiting)] == ["released:0", "released:1"]


async def test_client_close_fails_calls_in_flight(client: RpcClient, service: Service) -> None:
    call = asyncio.ensure_future(client.call("wait", Echo("")))
    await asyncio.wait_for(service.entered.wait(), 5)
    await client.close()
    with pytest.raises(Indeterminate, match="closed by this client"):  # it was sent
        await asyncio.wait_for(call, 5)
    await asyncio.wait_for(service.cancelled.wait(), 5)  # the server saw the disconnect


async def test_large_payloads_and_concurrent_streams(service: Service) -> None:
    async with RpcServer(service.handlers(), codec=CODEC) as srv:  # type: ignore[arg-type]
        async with RpcClient("127.0.0.1", srv.port, codec=CODEC) as c:
            blob = bytes(range(256)) * (4 * 4096)  # 4 MiB
            calls = [c.call("echo", Echo(str(i), blob)) for i in range(3)]
            assert [r.blob == blob for r in await asyncio.gather(*calls)] == [True] * 3

            async def drain(n: int) -> list[int]:
                async with c.stream("count", CountRequest(n), window=2) as items:
                    return [item async for item in items]

            got = await asyncio.gather(*(drain(200 + i) for i in range(10)))
            assert got == [list(range(200 + i)) for i in range(10)]
