"""One framed RPC connection as an asyncio Protocol: frames in, coalesced writes out.

tcp.py builds its server and client connections on :class:`FrameConnection`; this module owns
what both sides share below the request level (docs/architecture/design.md §8 "keep the hot path
lean"):

- Reading: bytes are parsed by frames.FrameParser inside ``data_received``, with no coroutine
  per frame; a subclass gets ``hello_received`` once, then ``frame_received`` per frame.
- Writing: ``write(frame, more_coming=True)`` appends to an output list flushed by one
  ``transport.write`` per event-loop iteration (or sooner, past 64 KiB), so replies to many
  requests in flight leave in few system calls; a lone frame is sent at once. Every frame is
  appended whole and the list is sent in order, so frames never interleave.
- Flow control: ``await drain()`` waits while the transport is above its high-water mark
  (``pause_writing`` / ``resume_writing``), the socket-level backpressure for writers.
- Failure: after a protocol error (``fail``) the connection sends one ERROR frame (request id
  0), half-closes, ignores further input and is aborted after a short linger; ``lost``
  resolves when the transport is gone, whatever the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import cast

from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.rpc import frames
from tabletstore.rpc.codec import encode_error
from tabletstore.rpc.frames import Frame, FrameError, FrameParser, Hello, Kind

__all__ = ["LINGER", "FrameConnection", "format_address", "parse_address"]

#: How long a connection closing after an error, or on shutdown, waits for its peer to read
#: what was written before it is aborted.
LINGER = 0.5
# Flush early past either bound, so the peer starts on the first replies while we produce
# the rest (two processes pipeline instead of passing one large batch back and forth).
_FLUSH_BYTES = 64 * 1024
_FLUSH_FRAMES = 8


def parse_address(address: str) -> tuple[str, int]:
    """``"127.0.0.1:7000"`` or ``"[::1]:7000"`` → (host, port)."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise InvalidArgument(f"RPC address must be HOST:PORT, got {address!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port_text)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class FrameConnection(asyncio.Protocol):
    """Base protocol; subclasses implement the ``*_received`` / ``closed`` hooks."""

    def __init__(self, max_frame: int, hello: bytes) -> None:
        self._loop = asyncio.get_running_loop()
        self._parser = FrameParser(max_frame)
        self._hello = hello
        self._hello_pending = True
        self._dead = False  # a protocol error happened: input is ignored from now on
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self._out_bytes = 0
        self._paused = False
        self._drain_waiters: list[asyncio.Future[None]] = []
        #: Resolved (None) once the transport is closed, for any reason.
        self.lost: asyncio.Future[None] = self._loop.create_future()

    # -- hooks for subclasses --

    def hello_received(self, hello: Hello) -> None:
        raise NotImplementedError

    def frame_received(self, frame: Frame) -> None:
        raise NotImplementedError

    def closed(self, exc: Exception | None) -> None:
        """The transport is gone (``exc`` is the OS error, if any)."""

    # -- asyncio.Protocol --

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self._hello)

    def data_received(self, data: bytes) -> None:
        if self._dead:
            return
        try:
            if self._hello_pending:
                hello = self._parser.feed_hello(data)
                if hello is None:
                    return
                self._hello_pending = False
                self.hello_received(hello)
                data = b""
            for frame in self._parser.feed(data):
                if self._dead:
                    return
                self.frame_received(frame)
        except FrameError as exc:
            self.fail(exc)

    def eof_received(self) -> bool | None:
        return None  # the peer is done: close our side too (connection_lost follows)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake_drainers()

    def connection_lost(self, exc: Exception | None) -> None:
        self._out.clear()
        self._wake_drainers()
        if not self.lost.done():
            self.lost.set_result(None)
        self.closed(exc)

    # -- writing --

    @property
    def is_open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing()

    def write(self, frame: bytes, *, more_coming: bool = False) -> None:
        """Queue one whole frame and send what is queued, in order.

        ``more_coming=True`` says other frames will probably be written in this event-loop
        iteration (more replies in flight, stream items): the frame waits for the flush at the
        end of the iteration (or 8 frames, or 64 KiB), so they share a system call. Otherwise it goes now,
        which is what a lone request wants (no extra loop iteration of latency). Dropped
        silently if the connection is closing: its users learn of that through ``lost``.
        """
        if not self.is_open:
            return
        if not self._out and more_coming:
            self._loop.call_soon(self.flush)
        self._out.append(frame)
        self._out_bytes += len(frame)
        if not more_coming or self._out_bytes >= _FLUSH_BYTES or len(self._out) >= _FLUSH_FRAMES:
            self.flush()

    def flush(self) -> None:
        out = self._out
        if not out:
            return
        self._out = []
        self._out_bytes = 0
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(out[0] if len(out) == 1 else b"".join(out))

    async def drain(self) -> None:
        """Wait while the peer is not reading fast enough (returns at once otherwise)."""
        if self._paused and not self.lost.done():
            waiter: asyncio.Future[None] = self._loop.create_future()
            self._drain_waiters.append(waiter)
            await waiter

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- closing --

    def fail(self, exc: TabletStoreError) -> None:
        """Protocol error: send ERROR (request id 0) naming it, half-close, ignore input.

        The caller (or ``close_and_wait``) aborts after LINGER: waiting lets the peer read the
        ERROR instead of a reset caused by bytes it sent that we never read.
        """
        self._dead = True
        self.write(frames.encode_frame(Kind.ERROR, 0, encode_error(exc)))
        self.flush()
        if self.transport is not None and self.transport.can_write_eof():
            with contextlib.suppress(OSError):  # already reset by the peer: closed anyway
                self.transport.write_eof()

    def close(self) -> None:
        """Flush what is queued and close (the transport finishes sending first)."""
        self.flush()
        if self.transport is not None:
            self.transport.close()

    async def close_and_wait(self) -> None:
        """Close, then abort if the peer has not let the transport finish within LINGER."""
        self.close()
        try:
            await asyncio.wait_for(asyncio.shield(self.lost), LINGER)
        except TimeoutError:
            if self.transport is not None:
                self.transport.abort()
            await asyncio.shield(self.lost)
