"""gRPC calls made frame by frame, as an attacker makes them: bench.attacks' large-message
attack on the front door.

A gRPC library copies each request message whole before it sends a byte (grpcio copies a
64 MiB message into a fresh 64 MiB buffer per call), so an attacker using one spends its own
memory and CPU on every call, and on a machine shared with the servers that cost lands on
them: a 64 MiB copy here takes about 70 ms of page faults, which slowed every process on the
virtual machine. An attacker sending from elsewhere pays that on its own machine, or not at all:
the server sees only the bytes on the wire. :class:`RawGrpcConnection` sends exactly those
bytes (HTTP/2 frames over TLS, built with the ``h2`` library): a call's headers, the
gRPC message prefix announcing its length, and then slices of one shared body, as fast as the
server's flow-control window lets them go, until the server answers or resets the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions

__all__ = ["RawGrpcConnection"]


@dataclass
class _Call:
    """One stream's state: its answer (the grpc-status, or ``reset:<code>``) once known, and
    an event set whenever the stream may send more (a window opened, or it ended)."""

    answer: asyncio.Future[str]
    window: asyncio.Event = field(default_factory=asyncio.Event)
    headers: dict[str, str] = field(default_factory=dict)


class RawGrpcConnection:
    """One HTTP/2 connection to a gRPC server over TLS, carrying calls side by side."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, authority: str
    ) -> None:
        self._reader, self._writer, self._authority = reader, writer, authority
        self._h2 = h2.connection.H2Connection(
            config=h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self._calls: dict[int, _Call] = {}
        self._reading: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, host: str, port: int, ca_pem: bytes) -> RawGrpcConnection:
        ctx = ssl.create_default_context(cadata=ca_pem.decode())
        ctx.set_alpn_protocols(["h2"])
        reader, writer = await asyncio.open_connection(host, port, ssl=ctx)
        conn = cls(reader, writer, f"{host}:{port}")
        conn._h2.initiate_connection()
        conn._flush()
        conn._reading = asyncio.create_task(conn._read())
        return conn

    async def call(
        self, path: str, body: memoryview, metadata: tuple[tuple[str, str], ...] = ()
    ) -> str:
        """Send a unary call whose message is ``body`` (its gRPC length prefix announces all
        of it) and return the server's grpc-status (``reset:<code>`` if it reset the stream
        without one). The body is sent as slices of ``body``, never copied whole."""
        sid = self._h2.get_next_available_stream_id()
        call = _Call(asyncio.get_running_loop().create_future())
        self._calls[sid] = call
        try:
            self._h2.send_headers(
                sid,
                [
                    (":method", "POST"),
                    (":scheme", "https"),
                    (":path", path),
                    (":authority", self._authority),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                    *metadata,
                ],
            )
            self._flush()
            prefix = b"\0" + len(body).to_bytes(4, "big")
            await self._send(sid, call, memoryview(prefix))
            await self._send(sid, call, body)
            if not call.answer.done():
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self._h2.end_stream(sid)
                    self._flush()
            return await call.answer
        finally:
            self._calls.pop(sid, None)

    async def _send(self, sid: int, call: _Call, data: memoryview) -> None:
        """Send ``data`` on the stream as the flow-control windows allow, until all of it is
        sent or the stream is answered."""
        sent = 0
        while sent < len(data) and not call.answer.done():
            room = min(self._h2.local_flow_control_window(sid), self._h2.max_outbound_frame_size)
            if room <= 0:
                call.window.clear()
                await call.window.wait()
                continue
            try:
                self._h2.send_data(sid, bytes(data[sent : sent + room]))
            except h2.exceptions.StreamClosedError:
                return  # answered meanwhile: the answer is on its way
            sent += room
            self._flush()
            await self._writer.drain()

    async def _read(self) -> None:
        try:
            while data := await self._reader.read(65536):
                for event in self._h2.receive_data(data):
                    self._on(event)
                self._flush()
        except (ConnectionError, OSError, ssl.SSLError, h2.exceptions.ProtocolError) as exc:
            self._fail(f"connection lost: {exc}")
            return
        self._fail("connection closed by the server")

    def _on(self, event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", 0)
        call = self._calls.get(sid)
        if isinstance(event, h2.events.WindowUpdated):
            targets = self._calls.values() if sid == 0 else [call] if call else []
            for c in targets:
                c.window.set()
        elif isinstance(event, h2.events.DataReceived):
            self._h2.acknowledge_received_data(event.flow_controlled_length, sid)
        elif call is None:
            return
        elif isinstance(event, (h2.events.ResponseReceived, h2.events.TrailersReceived)):
            call.headers.update((str(k), str(v)) for k, v in event.headers)
        elif isinstance(event, h2.events.StreamEnded):
            self._answer(call, call.headers.get("grpc-status", "no grpc-status"))
        elif isinstance(event, h2.events.StreamReset):
            self._answer(call, call.headers.get("grpc-status", f"reset:{event.error_code}"))

    def _answer(self, call: _Call, status: str) -> None:
        if not call.answer.done():
            call.answer.set_result(status)
        call.window.set()

    def _fail(self, why: str) -> None:
        for call in list(self._calls.values()):
            if not call.answer.done():
                call.answer.set_exception(ConnectionError(why))
            call.window.set()

    def _flush(self) -> None:
        if out := self._h2.data_to_send():
            self._writer.write(out)

    async def close(self) -> None:
        if self._reading is not None:
            self._reading.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reading
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self._h2.close_connection()
            self._flush()
        self._writer.close()
        with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
            await self._writer.wait_closed()
