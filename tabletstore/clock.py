"""Injected time and randomness: the only module that reads the system's clocks or imports
:mod:`random` (ruff's banned-api rule TID251 enforces it; see ``pyproject.toml``).

Lease expiry (§4 Chubby sessions, here etcd leases), backoff and server-assigned timestamps all
read time through a :class:`Clock`, so tests drive them with :class:`ManualClock` instead of
sleeping (docs/architecture/conventions.md convention 6).

Code that measures rather than decides -- request latencies, a scan's slice of the event loop,
a metric's timestamp -- has nothing to gain from a manual clock and reads the process's clocks
through the plain functions here (:func:`stopwatch`, :func:`monotonic`, :func:`wall_time`);
randomness is a :class:`Random` (seed it in tests).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections.abc import Callable
from random import Random
from typing import Protocol

__all__ = [
    "Clock",
    "ManualClock",
    "Random",
    "SteppedClock",
    "SystemClock",
    "micros",
    "monotonic",
    "stopwatch",
    "wall_time",
]


def wall_time() -> float:
    """The system's wall-clock seconds since the epoch, for code that only records or shows
    it (a stored object's modification time, a metric's timestamp). Decisions use a Clock."""
    return time.time()


def monotonic() -> float:
    """The system's monotonic seconds, for code that only measures with it."""
    return time.monotonic()


#: The highest-resolution monotonic seconds: take two readings and subtract to time a piece of
#: work (request latencies, a scan's turn on the event loop). ``time.perf_counter`` itself, not
#: a wrapper: a scan reads it once per row.
stopwatch: Callable[[], float] = time.perf_counter


def micros(seconds: float) -> int:
    """Seconds to integer microseconds, the unit of Bigtable cell timestamps (§2)."""
    return int(seconds * 1_000_000)


class Clock(Protocol):
    """Where time comes from."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch (cell timestamps, object ages)."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never goes back (deadlines, leases)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock's time."""
        ...

    def random(self) -> Random:
        """The source of randomness (jitter), seeded in tests."""
        ...


class SystemClock:
    """The real clock."""

    def __init__(self, seed: int | None = None) -> None:
        self._random = Random(seed)

    def time(self) -> float:
        return wall_time()

    def monotonic(self) -> float:
        return monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    def random(self) -> Random:
        return self._random


class SteppedClock:
    """Another clock whose wall time is stepped by :attr:`offset` seconds: a process whose
    system clock was set forward or back (an operator's mistake, an NTP step). As on Linux,
    where a step moves ``CLOCK_REALTIME`` and never ``CLOCK_MONOTONIC``, only :meth:`time`
    moves: leases and deadlines, which read :meth:`monotonic`, are unaffected by a step, and
    whatever reads :meth:`time` (server-assigned cell timestamps, recorded times) sees it.
    The chaos harness steps a worker's clock this way (its ``clock_jump`` fault)."""

    def __init__(self, inner: Clock) -> None:
        self._inner = inner
        #: Seconds added to the inner clock's wall time.
        self.offset = 0.0

    def time(self) -> float:
        return self._inner.time() + self.offset

    def monotonic(self) -> float:
        return self._inner.monotonic()

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)

    def random(self) -> Random:
        return self._inner.random()


class ManualClock:
    """A clock that moves only when a test calls :meth:`advance`.

    ``sleep`` returns once the clock has been advanced past the sleeper's deadline; sleepers
    wake in deadline order.
    """

    def __init__(self, start: float = 1_700_000_000.0, seed: int = 0) -> None:
        self._now = start
        self._origin = start
        self._random = Random(seed)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._counter = itertools.count()

    def time(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now - self._origin

    def random(self) -> Random:
        return self._random

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._counter), fut))
        await fut

    def step(self, seconds: float) -> None:
        """Step the wall clock by ``seconds``, forward or back, as setting the system's clock
        does: :meth:`monotonic` and the sleepers are unaffected."""
        self._now += seconds
        self._origin += seconds

    def advance(self, seconds: float) -> None:
        """Move time forward and wake every sleeper whose deadline has passed."""
        self._now += seconds
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, fut = heapq.heappop(self._sleepers)
            if not fut.done():
                fut.set_result(None)
