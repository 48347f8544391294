"""What an RPC server lets its clients take: connections, buffered bytes, time.

A tablet server serves many clients (paper §5: "clients communicate directly with tablet
servers"), so none of them may exhaust it. This module holds the server's bookkeeping, with no
I/O of its own: ``rpc_server.py`` calls it from its connection's hooks. The settings are
:class:`tabletstore.options.RpcServerOptions`.

- :class:`ConnectionGate` counts open connections in total and per peer IP address; one over a
  cap is refused: the server sends its hello and one ERROR (request id 0, ``Unavailable``
  naming the cap) and closes, so the client's next call fails ``Unreachable`` with that reason.
  A server with auth has two gates: connections that have proven nothing yet (TLS without a
  client certificate, before their token is checked) count in a small gate of their own
  (``max_unauthenticated``, ``max_unauthenticated_per_peer``) and move to the main one once
  authenticated, so nobody unauthenticated can take the slots of authenticated clients.
- :class:`ByteBudget` is the process's budget of bytes held by connections, and
  :class:`ReadGuard` one connection's share of it. A connection holds (a) the bytes that have
  arrived of the frame it is receiving -- charged as they arrive, never reserved from the
  length its header announces -- and (b) the request bodies it sent that are still being
  handled (unary requests; a stream's small request is released once its handler starts). A
  connection is read only while the budget has room (and its held requests leave room under
  its own cap); otherwise it stops being read (the kernel's socket buffer and TCP flow control
  hold the rest) and waits, first come first served, for bytes to be returned. A read may pass
  the budget by one socket read.

  The budget cannot deadlock: held request bytes come back when their handlers finish, and
  when half-received frames fill it, connections may finish their frames past the capacity (up
  to one and a half times it; one frame however large when no request is being handled), which
  then go to handlers.
- :class:`Watchdog` closes a connection that goes silent part way through a frame
  (``stall_timeout``), that sends a frame slower than ``min_receive_rate``, that has nothing in
  flight and stays silent (``idle_timeout``; clients never reuse a connection idle for
  ``rpc.client.IDLE_REUSE``, half of the smallest idle timeout a CLI accepts, so a request
  never crosses that close), or that the server has not read for ``idle_timeout``. Before it
  runs, rpc_server.py gives a new connection ``handshake_timeout`` to send its hello and, without a
  client certificate, to have its token (the AUTH frame, at most ``MAX_AUTH_FRAME`` bytes)
  accepted; until then nothing else it sends is read.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from collections.abc import Callable

from tabletstore.errors import InvalidArgument
from tabletstore.limits import format_size
from tabletstore.options import RpcServerOptions

__all__ = [
    "MAX_AUTH_FRAME",
    "ByteBudget",
    "ConnectionGate",
    "ReadGuard",
    "Watchdog",
    "check_options",
]


#: The largest AUTH frame a connection without a certificate may send first (a token is a
#: few dozen bytes); anything else first, or larger, is refused before it is buffered.
MAX_AUTH_FRAME = 4096


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
    if options.max_unauthenticated < 1 or options.max_unauthenticated_per_peer < 1:
        raise InvalidArgument(
            "max_unauthenticated and max_unauthenticated_per_peer must be at least 1"
        )
    if options.min_receive_rate < 0:
        raise InvalidArgument(
            f"min_receive_rate must be at least 0, got {options.min_receive_rate}"
        )
    for name in ("handshake_timeout", "idle_timeout", "stall_timeout"):
        if getattr(options, name) <= 0:
            raise InvalidArgument(f"{name} must be positive, got {getattr(options, name)}")


class ConnectionGate:
    """Open connections, in total and per peer IP address, and the refusals by reason."""

    def __init__(
        self,
        max_total: int,
        max_per_peer: int,
        names: tuple[str, str] = ("max_connections", "max_connections_per_peer"),
    ) -> None:
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._names = names  # the settings, for the refusals' messages
        self._per_peer: Counter[str] = Counter()
        self.open = 0
        #: Connections refused, by reason: ``total`` or ``peer`` (cap), ``handshake``,
        #: ``stalled``, ``slow``, ``paused`` or ``idle`` (closed by the watchdog).
        self.refused: Counter[str] = Counter()

    def admit(self, peer: str, server: str) -> str | None:
        """Count a new connection from ``peer``; or, over a cap, count its refusal and return
        the message saying why (the connection is then not counted as open)."""
        if self.open >= self.max_total:
            self.refused["total"] += 1
            return (
                f"server {server} refuses the connection from {peer}: {self.open} connections "
                f"are open, the limit is {self.max_total} ({self._names[0]})"
            )
        if self._per_peer[peer] >= self.max_per_peer:
            self.refused["peer"] += 1
            return (
                f"server {server} refuses the connection from {peer}: it has "
                f"{self._per_peer[peer]} connections open, the limit per peer address is "
                f"{self.max_per_peer} ({self._names[1]})"
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
    """The bytes all connections of one server may hold; connections wait in FIFO order.

    Bytes are charged as they arrive, never reserved from a frame's announced length. When the
    budget is full, connections that have begun a frame may still finish it (:meth:`may_read`)
    while the bytes held and still to come stay within one and a half ``capacity``; and when
    nothing held could come back (no request is being handled) one frame may finish however
    large. So a budget filled with half-received frames always has a frame that completes and
    goes to a handler (which gives its bytes back), and finishing senders are read, so the
    watchdog's stall and rate limits close the ones that do not send."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        #: The largest ``used`` seen (a figure for tests and benchmarks).
        self.peak = 0
        self._waiting: deque[ReadGuard] = deque()
        #: Bytes of request bodies being handled (they come back without any reading).
        self.held = 0
        #: Connections finishing their frame past the capacity, and what each still needs.
        self._finishing: dict[ReadGuard, int] = {}
        self._overdraft = 0

    def may_read(self, guard: ReadGuard) -> bool:
        """Whether ``guard`` may read more now (the first waiter goes first)."""
        if guard.finishing:
            return True
        if self._waiting and self._waiting[0] is not guard:
            return False
        return self.used < self.capacity or self._finish(guard)

    def _finish(self, guard: ReadGuard) -> bool:
        need = guard.remaining
        if not need:
            return False
        ceiling = self.capacity + self.capacity // 2
        if self.used + self._overdraft + need > ceiling and (self._finishing or self.held):
            return False
        self._finishing[guard] = need
        self._overdraft += need
        guard.finishing = True
        return True

    def adjust(self, delta: int) -> None:
        self.used += delta
        if self.used > self.peak:
            self.peak = self.used
        if delta < 0 and self._waiting:
            self._wake()

    def finished(self, guard: ReadGuard) -> None:
        """``guard``'s frame completed (or its connection closed): others may finish theirs."""
        need = self._finishing.pop(guard, None)
        guard.finishing = False
        if need is not None:
            self._overdraft -= need
            if self._waiting:
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
                break
            if self._waiting and self._waiting[0] is guard:
                self._waiting.popleft()
        if self._waiting and self.used >= self.capacity:
            # The first waiter may have no frame begun: let those behind it that have one
            # finish it, or half-received frames could hold the budget with nobody reading.
            for guard in list(self._waiting):
                if guard.midframe and self._finish(guard):
                    self._waiting.remove(guard)
                    guard.retry()

    @property
    def waiting(self) -> int:
        return len(self._waiting)


class ReadGuard:
    """One connection's share of the :class:`ByteBudget`; pauses and resumes its reading.

    The connection calls :meth:`after_read` after every read with the frame in progress (its
    declared length, 0 before its length field has arrived, and the bytes of it buffered),
    :meth:`frame_done` for every frame completed, :meth:`hold` when a request body goes to a
    handler and :meth:`release` when the handler is done with it. Its share is what it holds:
    the bytes of the frame in progress that have arrived, and its requests' bodies.
    """

    __slots__ = (
        "_budget",
        "_buffered",
        "_declared",
        "_held",
        "_limit",
        "_pause",
        "_resume",
        "_share",
        "closed",
        "finishing",
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
        self._buffered = 0  # bytes of the frame in progress held by the parser
        self._declared = 0
        self._share = 0  # what this connection counts in the budget
        self.paused = False  # reading stopped by this guard
        self.closed = False
        #: Finishing its frame past the budget's capacity (set by the budget).
        self.finishing = False

    @property
    def held(self) -> int:
        return self._held

    @property
    def share(self) -> int:
        return self._share

    @property
    def midframe(self) -> bool:
        """Whether a frame has begun to arrive (its length is known)."""
        return self._declared > 0

    @property
    def remaining(self) -> int:
        """Bytes of the frame in progress still to come (0 between frames)."""
        return max(self._declared + 4 - self._buffered, 0) if self._declared else 0

    def _update(self) -> None:
        share = self._held + self._buffered
        delta = share - self._share
        if delta:
            self._share = share
            self._budget.adjust(delta)

    def frame_done(self) -> None:
        """A frame completed (its body, if a request, is held next)."""
        self._buffered = self._declared = 0
        if self.finishing:
            self._budget.finished(self)

    def hold(self, n: int) -> None:
        """A request body of ``n`` bytes went to a handler."""
        if self.closed:
            return
        self._held += n
        self._budget.held += n
        self._update()

    def release(self, n: int) -> None:
        """A handler is done with a request body of ``n`` bytes."""
        if self.closed:
            return
        self._held -= n
        self._budget.held -= n
        self._update()
        if self.paused:
            self.retry()

    def after_read(self, declared: int, buffered: int) -> None:
        """Charge what arrived; stop reading unless more may come now."""
        if self.closed:
            return
        self._declared = declared
        self._buffered = buffered
        self._update()
        if self._may_read():
            return
        if not self.paused:
            self.paused = True
            self._pause()
        self._wait()

    def _over_own_cap(self) -> bool:
        # A connection holding nothing may always receive one frame (max_frame <= its cap).
        return self._held > 0 and self._held + max(self._declared + 4, self._buffered) > self._limit

    def _may_read(self) -> bool:
        return not self._over_own_cap() and self._budget.may_read(self)

    def _wait(self) -> None:
        # Over the connection's own cap: its handlers' release() retries. Else the budget's
        # queue (only its first waiter may read, so a waiter must be in it).
        if not self._over_own_cap():
            self._budget.enqueue(self)

    def retry(self) -> bool:
        """Try again to let the paused connection read; resume if it may."""
        if self.closed or not self.paused:
            return True
        if not self._may_read():
            self._wait()
            return False
        self.paused = False
        self._resume()
        self._budget.leave(self)
        return True

    def close(self) -> None:
        """The connection is gone: return everything (its handlers were cancelled)."""
        if self.closed:
            return
        self.closed = True
        self._budget.held -= self._held
        self._held = self._buffered = self._declared = 0
        self._budget.leave(self)
        self._budget.finished(self)
        self._update()

    def describe(self) -> str:
        """The frame in progress, for error messages."""
        return f"a frame of {format_size(self._declared)}" if self._declared else "a frame"


class Watchdog:
    """Closes a connection that stays silent or slow too long after its handshake.

    - part way through a frame: no byte for ``stall_timeout``, or fewer than
      ``min_receive_rate`` bytes a second over a window of ``stall_timeout`` (a frame trickled
      in a byte at a time is not a live client);
    - nothing in flight and silent for ``idle_timeout``;
    - reading stopped by the server (the byte budget, or the connection's own cap) for longer
      than ``idle_timeout``: no state of a connection is exempt.

    ``touch()`` on every read and every finished request; ``received()`` counts the bytes read
    so far; ``expire(reason, message)`` closes. The check runs on a timer re-armed for the
    next deadline that could pass, never per read or per frame.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        *,
        stall_timeout: float,
        idle_timeout: float,
        min_receive_rate: int,
        midframe: Callable[[], bool],
        busy: Callable[[], bool],
        paused: Callable[[], bool],
        received: Callable[[], int],
        expire: Callable[[str, str], None],
    ) -> None:
        self._loop = loop
        self._stall = stall_timeout
        self._idle = idle_timeout
        self._min_rate = min_receive_rate
        self._midframe = midframe
        self._busy = busy
        self._paused = paused
        self._received = received
        self._expire = expire
        self._last = loop.time()
        self._paused_since: float | None = None
        # The receive-rate window: when it began (None: not part way through a frame) and
        # the bytes received by then.
        self._window: float | None = None
        self._window_bytes = 0
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
        if self._paused():  # the server stopped reading it: not the peer's silence...
            self._last = now
            self._window = None
            if self._paused_since is None:
                self._paused_since = now
            elif now - self._paused_since >= self._idle:  # ...but not forever
                self._expire(
                    "paused",
                    f"waited {self._idle:g} s for the server's byte budget (idle_timeout)",
                )
                return
            self._arm(min(self._stall, self._idle))
            return
        self._paused_since = None
        silent = now - self._last
        if self._midframe():
            if silent >= self._stall:
                self._expire(
                    "stalled",
                    f"no byte for {self._stall:g} s part way through a frame (stall_timeout)",
                )
                return
            received = self._received()
            if self._window is None:
                self._window, self._window_bytes = now, received
            elif now - self._window >= self._stall:
                rate = (received - self._window_bytes) / (now - self._window)
                if rate < self._min_rate:
                    self._expire(
                        "slow",
                        f"received {rate:.0f} bytes/s part way through a frame for "
                        f"{now - self._window:.0f} s, below {self._min_rate} "
                        "(min_receive_rate)",
                    )
                    return
                self._window, self._window_bytes = now, received
            self._arm(min(self._stall - silent, self._stall - (now - self._window)))
            return
        self._window = None
        if self._busy():
            self._arm(min(self._stall, self._idle))
        else:
            if silent >= self._idle:
                self._expire(
                    "idle", f"idle for {self._idle:g} s with nothing in flight (idle_timeout)"
                )
                return
            # A frame may begin before then: look again within the stall timeout.
            self._arm(min(self._idle - silent, self._stall))
