"""What an RPC server lets its clients take: connections, buffered bytes, time (issue 16 item 4).

A tablet server serves many clients (paper §5: "clients communicate directly with tablet
servers"), so none of them may exhaust it. This module holds the server's bookkeeping, with no
I/O of its own: ``server.py`` calls it from its connection's hooks. The settings are
:class:`tabletstore.options.RpcServerOptions`.

- :class:`ConnectionGate` counts open connections in total and per peer IP address; one over a
  cap is refused: the server sends its hello and one ERROR (request id 0, ``Unavailable``
  naming the cap) and closes, so the client's next call fails ``Unreachable`` with that reason.
- :class:`ByteBudget` is the process's budget of bytes held by connections, and
  :class:`ReadGuard` one connection's share of it. A connection holds (a) the frame it is
  receiving, reserved whole (its declared length) as soon as its header arrives, and (b) the
  request bodies it sent that are still being handled (unary requests; a stream's small request
  is released once its handler starts). A frame is read only while its reservation fits both
  the connection's cap and the budget; otherwise the connection stops being read (the kernel's
  socket buffer and TCP flow control hold the rest) and waits, first come first served, for
  bytes to be returned. Bytes that arrived before the wait began are counted all the same, so
  the budget is exceeded by at most one socket read per connection.

  No wait depends on the waiting connection's own input, so the budget cannot deadlock: held
  request bytes come back when their handlers finish, and a reservation comes back when its
  frame completes -- or when the :class:`Watchdog` closes a connection that stopped sending
  part way through a frame.
- :class:`Watchdog` closes a connection that never says hello (``handshake_timeout``, in
  server.py), that goes silent part way through a frame (``stall_timeout``; not counted while
  the server itself has stopped reading it), or that has nothing in flight and stays silent
  (``idle_timeout``; clients never reuse a connection idle for ``rpc.client.IDLE_REUSE``, half
  of the smallest idle timeout a CLI accepts, so a request never crosses that close).
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable

from tabletstore.errors import InvalidArgument
from tabletstore.limits import format_size
from tabletstore.options import RpcServerOptions

__all__ = [
    "ByteBudget",
    "ConnectionGate",
    "ReadGuard",
    "Watchdog",
    "check_options",
]


def check_options(options: RpcServerOptions) -> None:
    """A clear error for settings that cannot work together."""
    if options.max_frame < 1024:
        raise InvalidArgument(f"max_frame must be at least 1024 bytes, got {options.max_frame}")
    if options.connection_bytes < options.max_frame:
        raise InvalidArgument(
            f"max_connection_bytes ({options.connection_bytes}) must be at least max_frame "
            f"({options.max_frame}): a maximal request must fit"
        )
    if options.max_buffered_bytes < options.connection_bytes:
        raise InvalidArgument(
            f"max_buffered_bytes ({options.max_buffered_bytes}) must be at least the bytes of "
            f"one connection ({options.connection_bytes})"
        )
    if options.max_connections < 1 or options.max_connections_per_peer < 1:
        raise InvalidArgument("max_connections and max_connections_per_peer must be at least 1")
    for name in ("handshake_timeout", "idle_timeout", "stall_timeout"):
        if getattr(options, name) <= 0:
            raise InvalidArgument(f"{name} must be positive, got {getattr(options, name)}")


class ConnectionGate:
    """Open connections, in total and per peer IP address, and the refusals by reason."""

    def __init__(self, max_total: int, max_per_peer: int) -> None:
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._per_peer: Counter[str] = Counter()
        self.open = 0
        #: Connections refused, by reason: ``total`` or ``peer`` (cap), ``handshake``,
        #: ``stalled`` or ``idle`` (closed by the watchdog).
        self.refused: Counter[str] = Counter()

    def admit(self, peer: str, server: str) -> str | None:
        """Count a new connection from ``peer``; or, over a cap, count its refusal and return
        the message saying why (the connection is then not counted as open)."""
        if self.open >= self.max_total:
            self.refused["total"] += 1
            return (
                f"server {server} refuses the connection from {peer}: {self.open} connections "
                f"are open, the limit is {self.max_total} (max_connections)"
            )
        if self._per_peer[peer] >= self.max_per_peer:
            self.refused["peer"] += 1
            return (
                f"server {server} refuses the connection from {peer}: it has "
                f"{self._per_peer[peer]} connections open, the limit per peer address is "
                f"{self.max_per_peer} (max_connections_per_peer)"
            )
        self._per_peer[peer] += 1
        self.open += 1
        return None

    def release(self, peer: str) -> None:
        self.open -= 1
        self._per_peer[peer] -= 1
        if self._per_peer[peer] <= 0:
            del self._per_peer[peer]

    def closed_by_watchdog(self, reason: str) -> None:
        self.refused[reason] += 1


class ByteBudget:
    """The bytes all connections of one server may hold; connections wait in FIFO order."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        #: The largest ``used`` seen (a figure for tests and benchmarks).
        self.peak = 0
        self._waiting: deque[ReadGuard] = deque()

    def fits(self, delta: int, guard: ReadGuard) -> bool:
        """Whether ``guard`` may grow its share by ``delta`` now (the first waiter goes first)."""
        if delta <= 0:
            return True
        if self._waiting and self._waiting[0] is not guard:
            return False
        return self.used + delta <= self.capacity

    def adjust(self, delta: int) -> None:
        self.used += delta
        self.peak = max(self.peak, self.used)
        if delta < 0 and self._waiting:
            self._wake()

    def enqueue(self, guard: ReadGuard) -> None:
        if guard not in self._waiting:
            self._waiting.append(guard)

    def leave(self, guard: ReadGuard) -> None:
        if guard in self._waiting:
            self._waiting.remove(guard)
            self._wake()  # whoever was behind it may fit now

    def _wake(self) -> None:
        while self._waiting:
            guard = self._waiting[0]
            if not guard.retry():
                return
            if self._waiting and self._waiting[0] is guard:
                self._waiting.popleft()

    @property
    def waiting(self) -> int:
        return len(self._waiting)


class ReadGuard:
    """One connection's share of the :class:`ByteBudget`; pauses and resumes its reading.

    The connection calls :meth:`after_read` after every read with the frame in progress (its
    declared length, 0 before its length field has arrived, and the bytes of it buffered),
    :meth:`frame_done` for every frame completed, :meth:`hold` when a request body goes to a
    handler and :meth:`release` when the handler is done with it.
    """

    __slots__ = (
        "_budget",
        "_buffered",
        "_declared",
        "_held",
        "_limit",
        "_need",
        "_pause",
        "_reserved",
        "_resume",
        "_share",
        "closed",
        "paused",
    )

    def __init__(
        self,
        budget: ByteBudget,
        limit: int,
        pause: Callable[[], None],
        resume: Callable[[], None],
    ) -> None:
        self._budget = budget
        self._limit = limit
        self._pause = pause
        self._resume = resume
        self._held = 0  # request bodies being handled
        self._reserved = 0  # granted for the frame in progress (its whole length)
        self._buffered = 0  # bytes of the frame in progress held by the parser
        self._need = 0  # what the frame in progress needs reserved
        self._declared = 0
        self._share = 0  # what this connection counts in the budget
        self.paused = False  # reading stopped by this guard
        self.closed = False

    @property
    def held(self) -> int:
        return self._held

    @property
    def share(self) -> int:
        return self._share

    def _update(self) -> None:
        share = self._held + max(self._reserved, self._buffered)
        delta = share - self._share
        self._share = share
        self._budget.adjust(delta)

    def frame_done(self) -> None:
        """A frame completed: its reservation is used up (its body, if a request, is held)."""
        self._reserved = self._buffered = 0

    def hold(self, n: int) -> None:
        """A request body of ``n`` bytes went to a handler."""
        if self.closed:
            return
        self._held += n
        self._update()

    def release(self, n: int) -> None:
        """A handler is done with a request body of ``n`` bytes."""
        if self.closed:
            return
        self._held -= n
        self._update()
        if self.paused:
            self.retry()

    def after_read(self, declared: int, buffered: int) -> None:
        """Account for the frame in progress after a read; stop reading unless it fits."""
        if self.closed:
            return
        self._declared = declared
        self._buffered = buffered
        self._need = declared + 4 if declared else 0
        if self._grant():
            return
        self._update()  # what is here already counts; wait for room for the rest
        if not self.paused:
            self.paused = True
            self._pause()
        self._wait()

    def _grant(self) -> bool:
        """Reserve the frame in progress whole, if it fits the connection's cap and the
        budget (and the connection's held requests fit its cap)."""
        need = self._need
        if self._held + max(need, self._buffered) > self._limit:
            return False
        if need > self._reserved:
            if not self._budget.fits(self._held + need - self._share, self):
                return False
            self._reserved = need
        self._update()
        return True

    def _wait(self) -> None:
        # Over the connection's own cap: its handlers' release() retries. Else the budget's
        # queue (only its first waiter may be granted, so a waiter must be in it).
        if self._held + max(self._need, self._buffered) <= self._limit:
            self._budget.enqueue(self)

    def retry(self) -> bool:
        """Try again to reserve what the paused connection waits for; resume if granted."""
        if self.closed or not self.paused:
            return True
        if not self._grant():
            self._wait()
            return False
        self.paused = False
        self._budget.leave(self)
        self._resume()
        return True

    def close(self) -> None:
        """The connection is gone: return everything (its handlers were cancelled)."""
        if self.closed:
            return
        self.closed = True
        self._held = self._reserved = self._buffered = self._need = 0
        self._budget.leave(self)
        self._update()

    def describe(self) -> str:
        """The frame in progress, for error messages."""
        return f"a frame of {format_size(self._declared)}" if self._declared else "a frame"


class Watchdog:
    """Closes a connection that stays silent too long after its handshake: part way through a
    frame (``stall_timeout``) or with nothing in flight (``idle_timeout``).

    ``touch()`` on every read and every finished request; ``state()`` says whether a frame is
    in progress and whether requests are in flight; ``expire(reason, message)`` closes. The
    check runs on a timer re-armed for the next deadline that could pass.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        stall_timeout: float,
        idle_timeout: float,
        midframe: Callable[[], bool],
        busy: Callable[[], bool],
        paused: Callable[[], bool],
        expire: Callable[[str, str], None],
    ) -> None:
        self._loop = loop
        self._stall = stall_timeout
        self._idle = idle_timeout
        self._midframe = midframe
        self._busy = busy
        self._paused = paused
        self._expire = expire
        self._last = loop.time()
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._last = self._loop.time()
        self._arm(min(self._stall, self._idle))

    def touch(self) -> None:
        self._last = self._loop.time()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, delay: float) -> None:
        self._timer = self._loop.call_later(max(delay, 0.01), self._check)

    def _check(self) -> None:
        self._timer = None
        now = self._loop.time()
        if self._paused():  # the server stopped reading it: not the peer's silence
            self._last = now
        silent = now - self._last
        if self._midframe():
            if silent >= self._stall:
                self._expire(
                    "stalled",
                    f"no byte for {self._stall:g} s part way through a frame (stall_timeout)",
                )
                return
            self._arm(self._stall - silent)
        elif self._busy():
            self._arm(min(self._stall, self._idle))
        else:
            if silent >= self._idle:
                self._expire(
                    "idle", f"idle for {self._idle:g} s with nothing in flight (idle_timeout)"
                )
                return
            # A frame may begin before then: look again within the stall timeout.
            self._arm(min(self._idle - silent, self._stall))
