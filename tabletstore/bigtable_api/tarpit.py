"""The front door's tarpit: refusals of unauthenticated calls, answered at a bounded rate.

A call without a valid bearer token is refused before its request is read
(:mod:`tabletstore.bigtable_api.token_check`), but every refusal still costs gRPC's own
per-call work: the call's HTTP/2 headers, its task, the status sent back (about half a
millisecond of CPU). Refused at once, a caller that sends nothing but refused calls would take
CPU in proportion to how fast it sends them, from every authenticated caller of the process and
of the machine. So refusals wait their turn here: the tarpit answers at most ``rate`` of them a
second over all callers, after a ``burst`` answered at once (a client that forgot its token
hears so at once from a server nobody floods). A waiting refusal holds its call open, which
costs memory, not CPU: about 20 KiB, and the request bytes HTTP/2 flow control let in before
the answer, at most a stream's window (the front door keeps it at 64 KiB: no bandwidth
probing, ``front_door.py``).

Why more calls or more connections do not get around it: a connection carries at most
``grpc.max_concurrent_streams`` calls at once (:data:`tabletstore.bigtable_api.front_door.
STREAMS_PER_CONNECTION`, as Cloud Bigtable's own servers allow), and a client opens
another call on it only when one has ended; so once a connection's calls all wait here it sends
no more, and however many connections a caller opens, the refusals answered stay at ``rate`` a
second. What more connections buy is held calls, that is memory: the tarpit holds at most
``capacity`` calls and refuses beyond that at once (:attr:`Tarpit.overflowed` counts them).
Reaching it takes ``capacity`` / 100 concurrent TLS connections (11 at the front door's
default of 1,024), each a handshake the server
pays as well: the regime of a connection flood, which per-source connection limits at the
network edge bound, as for any TLS server. A caller that cancels its own calls before their
answer frees its streams sooner, at the price of its own per-call work; each such call costs
the front door its arrival only.

Fairness: waiting refusals are answered round robin over source addresses (the caller's IP,
without its port), each source's in arrival order, so one source's backlog does not delay the
refusal of a client elsewhere by more than a round.

Authenticated calls never wait here, and a held call takes no place of the front door's
concurrent-call limit (:class:`tabletstore.bigtable_api.request_budget.BudgetAdmission`
counts admitted calls only). The tarpit is bookkeeping on the front door's event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from tabletstore import clock as _clock
from tabletstore.errors import InvalidArgument

__all__ = ["Tarpit", "source_of"]


def source_of(peer: str) -> str:
    """The source address of a gRPC peer string (``ipv4:1.2.3.4:5678`` -> ``ipv4:1.2.3.4``,
    ``ipv6:[::1]:5678`` -> ``ipv6:[::1]``); other forms (a unix socket) are their own source."""
    if peer.startswith(("ipv4:", "ipv6:")):
        return peer.rpartition(":")[0]
    return peer


class Tarpit:
    """Answers refusals at most ``rate`` a second after a ``burst``; holds at most ``capacity``
    waiting ones (module docstring). ``clock``: monotonic seconds (tests pass their own)."""

    def __init__(
        self,
        rate: float,
        burst: int,
        capacity: int,
        *,
        clock: Callable[[], float] = _clock.monotonic,
    ) -> None:
        if rate <= 0:
            raise InvalidArgument(f"the tarpit's rate must be positive, got {rate}")
        if burst < 1 or capacity < 0:
            raise InvalidArgument(
                f"the tarpit needs a burst of at least 1 and a capacity of at least 0, got "
                f"{burst} and {capacity}"
            )
        self.rate = rate
        self.burst = burst
        self.capacity = capacity
        self._clock = clock
        self._tokens = float(burst)
        self._stamp = clock()
        #: Waiting refusals by source; the dict's order is the round robin's, and each
        #: source's dict (insertion-ordered, O(1) removal) its arrival order.
        self._queues: dict[str, dict[asyncio.Future[None], None]] = {}
        self._timer: asyncio.TimerHandle | None = None
        #: Calls waiting now, and the most that ever waited at once.
        self.held = 0
        self.peak = 0
        #: Refusals answered (at once from the burst, or after waiting).
        self.answered = 0
        #: Refusals answered at once because ``capacity`` calls were waiting already.
        self.overflowed = 0

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now

    async def turn(self, source: str) -> None:
        """Return when a refusal of a call from ``source`` may be answered."""
        if not self._queues:
            self._refill()
            if self._tokens >= 1:
                self._tokens -= 1
                self.answered += 1
                return
        if self.held >= self.capacity:
            self.overflowed += 1
            self.answered += 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queues.setdefault(source, {})[waiter] = None
        self.held += 1
        self.peak = max(self.peak, self.held)
        self._schedule()
        try:
            await waiter
        finally:
            self.held -= 1
            queue = self._queues.get(source)
            if queue is not None and waiter in queue:  # the call went away while it waited
                del queue[waiter]
                if not queue:
                    del self._queues[source]
        self.answered += 1

    def _schedule(self) -> None:
        if self._timer is not None or not self._queues:
            return
        self._refill()
        delay = max(0.0, (1.0 - self._tokens) / self.rate)
        self._timer = asyncio.get_running_loop().call_later(delay, self._release)

    def _release(self) -> None:
        """Answer waiting refusals while there are tokens: one source's oldest in turn."""
        self._timer = None
        self._refill()
        while self._tokens >= 1 and self._queues:
            source = next(iter(self._queues))
            queue = self._queues.pop(source)
            waiter = next(iter(queue))
            del queue[waiter]
            if queue:
                self._queues[source] = queue  # to the end of the round
            if waiter.done():  # cancelled, its task not yet told: it takes no turn
                continue
            waiter.set_result(None)
            self._tokens -= 1
        self._schedule()
