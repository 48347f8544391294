"""The RPC server's resource caps (rpc/admission.py), tried the way an attacker
would: floods of half-sent frames, too many connections from one address, silent connections.

Bounded in count and time: at most 40 connections on 127.0.0.1, timeouts of a fraction of a
second, and every wait is on a condition with a deadline (``_until``), never a fixed sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable

import pytest

from tabletstore.errors import InvalidArgument, TabletStoreError, Unreachable
from tabletstore.limits import MiB
from tabletstore.options import RpcServerOptions
from tabletstore.rpc import frames
from tabletstore.rpc import rpc_client as rpc_client
from tabletstore.rpc.admission import ByteBudget, ReadGuard
from tabletstore.rpc.codec import Codec, decode_error
from tabletstore.rpc.frames import Kind
from tabletstore.rpc.tcp import RpcClient, RpcServer

pytestmark = pytest.mark.timeout(120)

#: What one socket read may bring in beyond a reservation (asyncio reads up to 256 KiB).
_READ = 256 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Blob:
    data: bytes = b""


CODEC = Codec()
CODEC.register(1, Blob)


class Service:
    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def echo(self, request: Blob) -> Blob:
        return Blob(request.data[:16])

    async def hold(self, request: Blob) -> Blob:
        await self.release.wait()
        return Blob(request.data[:16])

    def handlers(self) -> dict[str, object]:
        return {"echo": self.echo, "hold": self.hold}


async def _until(condition: Callable[[], bool], what: str, deadline: float = 30.0) -> None:
    """Wait for ``condition`` (polled), failing with ``what`` after ``deadline`` seconds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while True:
        if condition():
            return
        if loop.time() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def _server(service: Service, **options: object) -> AsyncIterator[RpcServer]:
    server = RpcServer(
        service.handlers(),  # type: ignore[arg-type]
        codec=CODEC,
        options=dataclasses.replace(RpcServerOptions(), **options),  # type: ignore[arg-type]
    )
    await server.start()
    try:
        yield server
    finally:
        await server.close(grace=0.5)


async def _raw(server: RpcServer) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(frames.encode_hello(frames.DEFAULT_MAX_FRAME))
    assert len(await reader.readexactly(frames.HELLO_SIZE)) == frames.HELLO_SIZE
    return reader, writer


async def _closing_error(reader: asyncio.StreamReader) -> TabletStoreError | None:
    """The ERROR (request id 0) the server sends before it closes, if it could be read."""
    try:
        async with asyncio.timeout(30):
            head = await reader.readexactly(frames.HEADER.size)
            length, kind, rid = frames.HEADER.unpack(head)
            body = await reader.readexactly(length - 5)
    except (ConnectionError, asyncio.IncompleteReadError):
        return None
    assert (kind, rid) == (Kind.ERROR, 0)
    return decode_error(body)


# --------------------------------------------------------------------- the budget alone


def test_a_frame_is_charged_as_its_bytes_arrive_and_frames_finish_past_a_full_budget() -> None:
    budget = ByteBudget(100)
    events: list[str] = []
    a = ReadGuard(budget, 200, lambda: events.append("a paused"), lambda: events.append("a on"))
    b = ReadGuard(budget, 200, lambda: events.append("b paused"), lambda: events.append("b on"))
    a.after_read(150, 10)  # A announces 150 bytes: only the 10 that came are charged
    assert (a.share, budget.used, a.paused) == (10, 10, False)
    a.after_read(150, 60)
    b.after_read(150, 40)  # the budget is full of half-received frames...
    assert (budget.used, b.paused, b.finishing) == (100, False, True)  # ...B finishes
    a.after_read(150, 70)  # A would need 84 more: past the second capacity, it waits
    assert (a.share, budget.used, a.paused, budget.waiting) == (70, 110, True, 1)
    b.after_read(150, 154)
    b.frame_done()  # B's frame is in: its request body goes to a handler; A may finish now
    b.hold(150)
    assert (a.finishing, a.paused, budget.waiting) == (True, False, 0)
    b.after_read(0, 0)  # B, between frames, waits for room
    assert (b.paused, budget.waiting) == (True, 1)
    a.after_read(150, 154)
    a.frame_done()
    a.hold(150)
    a.after_read(0, 0)
    a.release(150)
    b.release(150)
    assert budget.used == 0 and not a.paused and not b.paused
    assert events[:3] == ["a paused", "a on", "b paused"]
    a.close()
    b.close()
    assert budget.used == 0


def test_a_connection_over_its_own_cap_waits_for_its_own_requests() -> None:
    budget = ByteBudget(1000)
    paused: list[bool] = []
    guard = ReadGuard(budget, 100, lambda: paused.append(True), lambda: paused.append(False))
    guard.hold(70)  # requests still being handled
    guard.after_read(50, 20)  # a frame of 54 more would pass the connection's 100
    assert guard.paused and budget.waiting == 0  # not the budget's queue: its own handlers
    guard.release(70)
    assert not guard.paused and guard.share == 20 and paused == [True, False]


def test_a_maximal_frame_always_fits_a_connection_holding_nothing() -> None:
    """A frame of exactly the connection's cap (max_frame) was paused for ever: its 4-byte
    length field took it past the cap, with no request of its own to wait for."""
    budget = ByteBudget(1000)
    guard = ReadGuard(budget, 100, lambda: None, lambda: None)
    guard.after_read(100, 10)
    assert not guard.paused
    guard.after_read(100, 104)
    assert not guard.paused and guard.share == 104


def test_waiters_are_served_first_come_first_served() -> None:
    budget = ByteBudget(100)
    order: list[str] = []
    first = ReadGuard(budget, 200, lambda: None, lambda: None)
    big = ReadGuard(budget, 200, lambda: None, lambda: order.append("big"))
    small = ReadGuard(budget, 200, lambda: None, lambda: order.append("small"))
    first.after_read(150, 100)  # the budget is full; first may finish its frame
    big.after_read(90, 5)  # waits
    small.after_read(10, 5)  # waits behind big
    assert big.paused and small.paused and budget.waiting == 2
    first.close()
    assert order == ["big", "small"] and budget.waiting == 0


def test_options_that_cannot_work_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="max_buffered_bytes"):
        RpcServer({}, options=RpcServerOptions(max_frame=MiB, max_buffered_bytes=MiB // 2))
    with pytest.raises(InvalidArgument, match="max_connection_bytes"):
        RpcServer({}, options=RpcServerOptions(max_frame=MiB, max_connection_bytes=MiB // 2))
    with pytest.raises(InvalidArgument, match="idle_timeout"):
        RpcServer({}, options=RpcServerOptions(idle_timeout=0))


# --------------------------------------------------------------------- over sockets


async def test_forty_half_sent_frames_stay_within_the_budget_and_are_closed() -> None:
    """40 connections each send half of a large frame and stop. Without caps that held 40 half
    frames (here 80 MiB); now the connections are not read past the budget (and one socket
    read), and the stalled ones are closed by the stall timeout."""
    service = Service()
    frame, budget, n = 4 * MiB, 16 * MiB, 40
    async with _server(
        service, max_frame=frame, max_buffered_bytes=budget, stall_timeout=0.5
    ) as server:
        conns = [await _raw(server) for _ in range(n)]
        header = frames.HEADER.pack(frame - 4, Kind.REQUEST, 1)
        for _, writer in conns:
            writer.write(header + b"\0" * (frame // 2))
        errors = await asyncio.gather(*(_closing_error(reader) for reader, _ in conns))
        await _until(lambda: server.gate.open == 0, "every stalled connection is closed")
        for _, writer in conns:
            writer.close()
        # Never more than the budget, the frames finishing past it (half of it, or one
        # frame), and one socket read of each connection left waiting.
        assert server.budget.peak <= max(budget * 3 // 2, budget + frame) + n * _READ
        assert server.budget.peak < n * frame // 2  # what the flood held before
        assert server.budget.used == 0
        assert server.gate.refused["stalled"] == n
        messages = [str(e) for e in errors if e is not None]
        assert messages and all("stall_timeout" in m for m in messages), messages
        # And the server still serves.
        async with RpcClient("127.0.0.1", server.port, codec=CODEC) as client:
            assert await client.call("echo", Blob(b"alive")) == Blob(b"alive")


async def test_requests_over_the_budget_wait_and_all_succeed() -> None:
    """A normal workload bigger than the budget: readers wait their turn, nothing fails."""
    service = Service()
    async with _server(service, max_frame=MiB, max_buffered_bytes=2 * MiB) as server:
        clients = [RpcClient("127.0.0.1", server.port, codec=CODEC) for _ in range(4)]
        try:
            payload = b"p" * (300 * 1024)
            calls = [
                clients[i % 4].call("hold", Blob(payload + bytes([i])), timeout=60)
                for i in range(24)
            ]
            pending = asyncio.gather(*calls)
            # The handlers hold their bodies: the budget fills, and readers wait.
            await _until(lambda: server.budget.used >= 2 * MiB, "the budget fills")
            # The budget, frames finishing past it, and one socket read per connection.
            assert server.budget.peak <= 2 * MiB + MiB + 4 * _READ
            service.release.set()
            results = await pending
            assert all(r == Blob(payload[:16]) for r in results)
            await _until(lambda: server.budget.used == 0, "every byte is returned")
        finally:
            for c in clients:
                await c.close()


async def test_connections_over_the_per_peer_cap_are_refused_with_the_reason() -> None:
    service = Service()
    async with _server(service, max_connections_per_peer=3) as server:
        conns = [await _raw(server) for _ in range(3)]
        async with RpcClient("127.0.0.1", server.port, codec=CODEC) as client:
            with pytest.raises(Unreachable, match=r"limit per peer address is 3"):
                await client.call("echo", Blob(b"x"))
            assert server.gate.refused["peer"] == 1
            _, writer = conns.pop()
            writer.close()
            await _until(lambda: server.gate.open == 2, "the closed connection is released")
            assert await client.call("echo", Blob(b"x")) == Blob(b"x")  # a new connection
        for _, writer in conns:
            writer.close()


async def test_connections_over_the_total_cap_are_refused_with_the_reason() -> None:
    service = Service()
    async with _server(service, max_connections=2) as server:
        conns = [await _raw(server) for _ in range(2)]
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        await reader.readexactly(frames.HELLO_SIZE)
        error = await _closing_error(reader)
        assert error is not None and "the limit is 2 (max_connections)" in str(error)
        assert server.gate.refused["total"] == 1 and server.gate.open == 2
        writer.close()
        for _, w in conns:
            w.close()


async def test_silent_connections_are_closed_by_the_idle_and_handshake_timeouts() -> None:
    service = Service()
    async with _server(service, idle_timeout=0.3, handshake_timeout=0.3) as server:
        reader, writer = await _raw(server)  # handshaken, then silent
        error = await _closing_error(reader)
        assert error is not None and "idle_timeout" in str(error)
        writer.close()
        _, mute = await asyncio.open_connection("127.0.0.1", server.port)  # no hello
        await _until(lambda: server.gate.refused["handshake"] == 1, "the handshake timeout")
        mute.close()
        await _until(lambda: server.gate.refused["idle"] == 1, "the idle timeout")
        await _until(lambda: server.gate.open == 0, "both are closed")


async def test_a_request_in_flight_is_not_idle_and_an_idle_closed_client_reconnects() -> None:
    service = Service()
    async with _server(service, idle_timeout=0.3) as server:
        async with RpcClient("127.0.0.1", server.port, codec=CODEC) as client:
            call = asyncio.ensure_future(client.call("hold", Blob(b"long"), timeout=30))
            # Longer than the idle timeout with the request in flight: not closed.
            await _until(lambda: server.budget.used > 0, "the request is held")
            loop = asyncio.get_running_loop()
            start = loop.time()
            await _until(lambda: loop.time() - start > 1.0, "a second passes")
            assert server.gate.refused["idle"] == 0
            service.release.set()
            assert await call == Blob(b"long")
            # Now idle: closed, with an ERROR the client reads; its next call opens a new
            # connection by itself. (Real idle timeouts are at least twice IDLE_REUSE, so a
            # client never sends on a connection the server is closing; here it must wait.)
            await _until(lambda: server.gate.refused["idle"] == 1, "the idle timeout")
            conn = client._conn
            await _until(lambda: conn is None or not conn.alive, "the client saw the close")
            assert await client.call("echo", Blob(b"again"), timeout=30) == Blob(b"again")


async def test_clients_do_not_reuse_a_connection_idle_past_idle_reuse(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    service = Service()
    async with _server(service) as server:
        async with RpcClient("127.0.0.1", server.port, codec=CODEC) as client:
            first = await client.connection()
            assert await client.connection() is first
            monkeypatch.setattr(rpc_client, "IDLE_REUSE", 0.0)
            assert await client.connection() is not first
            assert await client.call("echo", Blob(b"x")) == Blob(b"x")


async def test_a_request_larger_than_the_frame_limit_is_refused_on_both_sides() -> None:
    service = Service()
    async with _server(service, max_frame=MiB) as server:
        async with RpcClient("127.0.0.1", server.port, codec=CODEC) as client:
            with pytest.raises(InvalidArgument, match=r"request of \d+ bytes exceeds .* 1 MiB"):
                await client.call("echo", Blob(b"x" * (2 * MiB)))
        reader, writer = await _raw(server)
        writer.write(frames.HEADER.pack(2 * MiB, Kind.REQUEST, 1))
        error = await _closing_error(reader)
        assert error is not None and f"frame of {2 * MiB} bytes exceeds the 1 MiB limit" in str(
            error
        )
        writer.close()
        assert server.budget.peak < MiB  # the declared length was never reserved


def test_a_large_frame_is_reassembled_from_reads_of_any_size() -> None:
    big = bytes(range(256)) * (5 * 4096)  # 5 MiB: received as a list of reads, joined once
    stream = (
        frames.encode_frame(Kind.PING, 1, b"a")
        + frames.encode_frame(Kind.REQUEST, 2, big)
        + frames.encode_frame(Kind.PING, 3, b"b")
    )
    for step in (1 << 16, 250_000, len(stream)):
        parser = frames.FrameParser(8 * MiB)
        parser.hello = frames.Hello(frames.MAGIC, frames.PROTOCOL_VERSION, 8 * MiB)
        got: list[frames.Frame] = []
        partials = []
        for i in range(0, len(stream), step):
            got += parser.feed(stream[i : i + step])
            partials.append(parser.partial)
        assert [(f.kind, f.request_id, bytes(f.body)) for f in got] == [
            (Kind.PING, 1, b"a"),
            (Kind.REQUEST, 2, big),
            (Kind.PING, 3, b"b"),
        ]
        assert parser.partial == (0, 0)
        if step < len(big):  # while the big frame came in, its declared length was known
            assert any(declared == len(big) + 5 for declared, _ in partials)
        parser.discard()


# --------------------------------------------------------------------- the status endpoint


async def test_the_status_endpoint_caps_connections_headers_and_bodies() -> None:
    from tabletstore.ops.metrics import WorkerMetrics
    from tabletstore.ops.status_http import StatusServer

    async def status(url: str) -> object:
        raise AssertionError("not asked for")

    metrics = WorkerMetrics("w")
    async with StatusServer(metrics, status, max_connections=3) as http:  # type: ignore[arg-type]
        host, port = http.url.removeprefix("http://").rsplit(":", 1)

        async def ask(request: bytes, *, whole: bool = True) -> bytes:
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(request)
            try:
                async with asyncio.timeout(30):
                    return await (reader.read() if whole else reader.readline())
            finally:
                writer.close()

        # Three clients that have just been served, on keep-alive, take the three places.
        idle = [await asyncio.open_connection(host, int(port)) for _ in range(3)]
        for reader, writer in idle:
            writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            async with asyncio.timeout(30):
                assert (await reader.readline()).startswith(b"HTTP/1.1 200")
        get = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        busy = await ask(get)
        assert busy.startswith(b"HTTP/1.1 503") and b"limit 3" in busy
        for _, writer in idle:
            writer.close()

        async def served() -> bool:
            return (await ask(get)).startswith(b"HTTP/1.1 200")

        loop = asyncio.get_running_loop()
        end = loop.time() + 30
        while not await served():  # the idle ones are released
            assert loop.time() < end, "the status endpoint serves again"
        huge_header = b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 20_000 + b"\r\n\r\n"
        assert b" 400 " in (await ask(huge_header)).split(b"\r\n", 1)[0] + b" "
        big_body = (
            b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            b"Content-Length: 10000000\r\n\r\n" + b"x" * 1000
        )
        answer = await ask(big_body, whole=False)  # answered without reading ten megabytes
        assert answer.startswith(b"HTTP/1.1 200")


def test_the_worker_and_master_flags_make_the_options_and_refuse_bad_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from click.testing import CliRunner

    from tabletstore.cli import main as cli
    from tabletstore.cli import server_cmds
    from tabletstore.master import master_process as master_process
    from tabletstore.worker import worker_process as worker_process

    seen: list[RpcServerOptions] = []

    async def fake_run(coordinator: object, options: object = None, **kw: object) -> None:
        options = options or kw["options"]
        seen.append(options.rpc)  # type: ignore[attr-defined]

    monkeypatch.setattr(worker_process, "run_worker", fake_run)
    monkeypatch.setattr(master_process, "run_master", fake_run)
    monkeypatch.setattr(
        server_cmds, "_serve", lambda run, *, store: asyncio.run(run(None, asyncio.Event()))
    )
    runner = CliRunner()
    flags = ["--max-connections", "7", "--max-connections-per-peer", "3", "--idle-timeout", "200"]
    flags += ["--max-unauthenticated", "5", "--max-unauthenticated-per-peer", "2"]
    flags += ["--min-receive-rate", "1000"]
    for verb in ("worker", "master"):
        result = runner.invoke(cli.main, [verb, *flags, "--max-buffered-bytes", str(100 * MiB)])
        assert result.exit_code == 0, result.output
        bad = runner.invoke(cli.main, [verb, "--idle-timeout", "5"])
        assert bad.exit_code == 2 and "--idle-timeout" in bad.output
        small = runner.invoke(cli.main, [verb, "--max-buffered-bytes", str(MiB)])
        assert small.exit_code == 2 and "--max-buffered-bytes" in small.output
        none = runner.invoke(cli.main, [verb, "--max-unauthenticated", "0"])
        assert none.exit_code == 2 and "--max-unauthenticated" in none.output
    want = RpcServerOptions(
        max_connections=7,
        max_connections_per_peer=3,
        max_unauthenticated=5,
        max_unauthenticated_per_peer=2,
        min_receive_rate=1000,
        idle_timeout=200.0,
        max_buffered_bytes=100 * MiB,
    )
    assert seen == [want, want]
