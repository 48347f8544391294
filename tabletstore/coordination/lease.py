"""The holder's side of a lease (a Chubby session, §4), shared by every Coordinator.

A backend supplies two calls, ``_send_keep_alive`` (is the lease still alive at the server
after this refresh?) and ``_send_revoke``; this module owns what the holder believes:

* ``last_renewed`` is read from the injected clock *before* the grant or keep-alive is sent
  (after waiting for a connection, if the backend has to).
  The server starts the lease's new ``ttl`` only when it receives the request, so the lease
  cannot end at the server before ``last_renewed + ttl``.
* ``safe_until() = last_renewed + ttl - safety_margin``. The margin absorbs clock-rate
  differences between holder and server. A worker acknowledges writes only while its clock is
  below ``safe_until()`` (docs/architecture/design.md §6, fencing rule 1).
* Once ``last_renewed + ttl`` passes without a successful keep-alive, or the server reports
  the lease gone, or it is revoked, the lease is **expired** for good: ``refresh`` raises
  :class:`~tabletstore.errors.Fenced`, ``wait_expired`` returns and the keep-alive loop stops.
  The holder never revives a lease it has given up on, even if the server had not yet
  noticed; it must take a new lease (and, as a worker, new claims).
* The keep-alive loop never gives up on a transient error (a server restarting): it retries
  every third of its interval until the lease's own deadline. A restart shorter than the
  lease is ridden out (etcd keeps leases across a restart); a longer one ends the lease here
  first, from the last *successful* keep-alive, whatever etcd does afterwards.
* A holder that goes on under a new lease (a worker or master that rejoins in its process)
  first revokes the one it gave up at the server (:func:`end_lost_lease`): etcd may still hold
  it, and the keys attached to it, for a TTL after it answers again.

**Process-bound leases** (``bound_to_process``). A lease exists so that a holder presumed dead
cannot go on serving what others have taken over (§5.2: the master reassigns a tablet server's
tablets once its Chubby file is gone). When the coordinator's server side lives in the holder's
own process and no other process can reach it — the embedded database: its in-process
coordinator, a directory owned by one process through an exclusive ``flock``
(``coordination/local.py``) or a ``memory://`` state visible only in this process — nobody
else can ever take the lease's keys, and the lease ends with the process anyway (lease keys are
not journaled). Expiry by time then fences nobody but the holder itself: a keep-alive delayed
by a stalled event loop (a machine at load 15 starving the process for longer than the TTL)
would end the database for good. Such a lease therefore lasts as long as the process (or until
revoked): it is never ``expired`` by time and ``safe_until()`` is infinite. Leases from an etcd
coordinator, and from in-process coordinators shared by several workers (test clusters), keep
the TTL rules above; only the embedded database asks for process-bound leases.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from types import TracebackType
from typing import TYPE_CHECKING

from tabletstore.clock import Clock
from tabletstore.errors import Closed, Fenced, InvalidArgument, TabletStoreError, Unavailable

if TYPE_CHECKING:
    from tabletstore.coordination.base import Coordinator

log = logging.getLogger(__name__)

__all__ = ["KeepAlive", "LeaseBase", "end_lost_lease", "wait_event_or_sleep"]

#: Seconds between attempts of :func:`end_lost_lease` (doubling up to the second figure).
END_LOST_PAUSE = (0.2, 2.0)


async def wait_event_or_sleep(event: asyncio.Event, clock: Clock, seconds: float) -> None:
    """Return when ``event`` is set or ``seconds`` of ``clock`` time have passed."""
    if event.is_set():
        return
    waiter = asyncio.ensure_future(event.wait())
    sleeper = asyncio.ensure_future(clock.sleep(max(0.0, seconds)))
    try:
        await asyncio.wait({waiter, sleeper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (waiter, sleeper):
            task.cancel()
        await asyncio.gather(waiter, sleeper, return_exceptions=True)


def default_safety_margin(ttl: float) -> float:
    return ttl / 10


class LeaseBase:
    """Lease bookkeeping; subclasses implement the two server calls."""

    def __init__(
        self,
        lease_id: int,
        ttl: float,
        *,
        granted_at: float,
        clock: Clock,
        safety_margin: float | None = None,
        bound_to_process: bool = False,
    ) -> None:
        margin = default_safety_margin(ttl) if safety_margin is None else safety_margin
        if not 0 <= margin < ttl:
            raise InvalidArgument(f"safety margin {margin} must be in [0, ttl={ttl})")
        self._id = lease_id
        self._ttl = ttl
        self._margin = margin
        self._clock = clock
        self._last_renewed = granted_at
        self._gone = False
        self._gone_event = asyncio.Event()
        #: Never expires by time, only by revocation or the server's word (module docstring).
        self._bound_to_process = bound_to_process

    # -- what a backend provides

    async def _before_keep_alive(self, seconds: float) -> None:
        """Wait (at most ``seconds``) until a keep-alive can be sent, e.g. for a connection;
        Unavailable if it cannot. Runs before the send time is read, so time spent waiting
        for a server that is restarting does not shorten what the next renewal buys."""

    async def _send_keep_alive(self) -> bool:
        """Refresh at the server; False if the server no longer has the lease."""
        raise NotImplementedError

    async def _send_revoke(self) -> None:
        raise NotImplementedError

    def _poll(self) -> None:
        """Let the backend notice server-side expiry (the in-process coordinator reaps here)."""

    # -- the Lease protocol

    @property
    def id(self) -> int:
        return self._id

    @property
    def ttl(self) -> float:
        return self._ttl

    @property
    def last_renewed(self) -> float:
        return self._last_renewed

    @property
    def bound_to_process(self) -> bool:
        return self._bound_to_process

    def _deadline(self) -> float:
        """When the holder gives the lease up without a successful keep-alive."""
        return math.inf if self._bound_to_process else self._last_renewed + self._ttl

    @property
    def expired(self) -> bool:
        self._poll()
        if not self._gone and self._clock.monotonic() >= self._deadline():
            self._mark_gone()
        return self._gone

    def safe_until(self) -> float:
        return self._deadline() - self._margin

    def _mark_gone(self) -> None:
        self._gone = True
        self._gone_event.set()

    async def refresh(self) -> None:
        if self.expired:
            raise Fenced(f"lease {self._id:x} has expired")
        await self._before_keep_alive(min(self._ttl, self._deadline() - self._clock.monotonic()))
        if self.expired:
            raise Fenced(f"lease {self._id:x} expired while waiting to send a keep-alive")
        sent_at = self._clock.monotonic()
        alive = await self._send_keep_alive()
        if not alive:
            self._mark_gone()
            raise Fenced(f"lease {self._id:x} has expired at the server")
        if self.expired:
            # The reply came back after our own deadline: we already gave the lease up.
            raise Fenced(f"lease {self._id:x} expired while its keep-alive was in flight")
        self._last_renewed = max(self._last_renewed, sent_at)

    def keep_alive(self, *, interval: float | None = None) -> KeepAlive:
        every = self._ttl / 3 if interval is None else interval
        if not 0 < every < self._ttl:
            raise InvalidArgument(f"keep-alive interval {every} must be in (0, ttl={self._ttl})")
        return KeepAlive(self, every)

    async def wait_expired(self) -> None:
        while not self.expired:
            if self._bound_to_process:
                await self._gone_event.wait()
                continue
            remaining = self._deadline() - self._clock.monotonic()
            await wait_event_or_sleep(self._gone_event, self._clock, remaining)

    async def revoke(self) -> None:
        if self._gone:
            return
        await self._send_revoke()
        self._mark_gone()


class KeepAlive:
    """Refreshes a lease every ``interval`` while entered; owns exactly one task."""

    def __init__(self, lease: LeaseBase, interval: float) -> None:
        self._lease = lease
        self._interval = interval
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> LeaseBase:
        if self._task is not None:
            raise InvalidArgument("a KeepAlive can be entered only once")
        self._task = asyncio.create_task(self._run(), name=f"keep-alive {self._lease.id:x}")
        return self._lease

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def _run(self) -> None:
        lease = self._lease
        wait = self._interval
        while not lease.expired:
            await wait_event_or_sleep(lease._gone_event, lease._clock, wait)
            if lease.expired:
                return
            try:
                await lease.refresh()
                wait = self._interval
            except (Fenced, Closed):
                return
            except TabletStoreError as exc:
                # Swallowed (Unavailable above all: a server restarting): retried sooner until
                # the lease's own deadline passes; the holder learns of a lost lease through
                # ``expired`` / ``safe_until``, never through this task.
                log.info("keep-alive of lease %x failed, retrying: %s", lease.id, exc)
                wait = self._interval / 3


async def end_lost_lease(coordinator: Coordinator, lease_id: int, stop: asyncio.Event) -> bool:
    """Revoke at the coordinator a lease its holder has given up (``expired`` here), retrying
    while the coordinator cannot answer; False if ``stop`` was set first.

    ``revoke()`` of an expired lease sends nothing: the holder gave it up by its own clock, and
    the coordinator ends it in its own time. But the coordinator may still hold it for up to a
    TTL after it answers again (etcd extends every lease when a new raft leader is elected, as
    after a lost quorum), and with it the keys attached to it, which others wait for: a
    process that goes on under a new lease (a worker or master that rejoins) ends the old one
    first. Idempotent: a lease already gone is no error."""
    pause = END_LOST_PAUSE[0]
    while not stop.is_set():
        try:
            await coordinator.revoke_lease(lease_id)
            return True
        except Unavailable as exc:
            log.info("ending lost lease %x: %s; retrying", lease_id, exc)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(pause):
                await stop.wait()
        pause = min(pause * 2, END_LOST_PAUSE[1])
    return False
