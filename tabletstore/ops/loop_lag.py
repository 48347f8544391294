"""How late a process's event loop runs what is due: its lag, and the stalls behind it.

A tabletstore process serves every request on one asyncio event loop. Whatever holds the loop --
CPU work left on it, a synchronous call, a long garbage collection -- delays every request
waiting behind it, and the tail latency it causes lands on requests that did nothing slow
themselves: a read p99 a hundred times its p50 on a machine with cores to spare.

:class:`LoopLag` measures it from inside. A task asks to wake every ``interval`` seconds and
records how much later than asked it woke into a histogram (``tabletstore_event_loop_lag_seconds``
on the process's ``/metrics``): a loop that keeps up wakes within a millisecond; a loop held for
300 ms wakes that much late once. With ``stall_seconds`` it also names the culprit, as Go's and
Node's blocked-loop detectors do: a watchdog thread checks the loop's next wake-up, and once the
loop is that far past it, logs the loop thread's Python stack -- where it is held -- as a
warning, once per stall and at most every ``report_every`` seconds; given the process's
:class:`~tabletstore.ops.gc_pauses.GcPauses`, it also says how much of the stall the garbage
collector took, generation by generation (a collection stops every thread, and the stack then
shows only where the loop was when it began; a young collection's pause grows with the
threshold of generation 0, a full one's with the heap). The thread takes the GIL for
a moment a few times per ``stall_seconds``, so reports are off by default
(``tabletstore worker --report-stalls SECONDS``).

Used as an async context manager around a worker's serving (``worker/worker_process.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import traceback
from collections.abc import Callable

from tabletstore.clock import monotonic
from tabletstore.ops.gc_pauses import GcPauses

__all__ = ["LAG_BUCKETS", "LoopLag"]

log = logging.getLogger(__name__)

#: Histogram buckets (seconds) of the lag: from "keeps up" to "held for seconds".
LAG_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)

#: Frames of the loop thread's stack a stall report shows (innermost last).
STACK_FRAMES = 30


class LoopLag:
    """Samples the running loop's lag into ``observe``; with ``stall_seconds``, reports stalls."""

    def __init__(
        self,
        observe: Callable[[float], None],
        *,
        interval: float = 0.05,
        stall_seconds: float | None = None,
        report_every: float = 10.0,
        gc_pauses: GcPauses | None = None,
    ) -> None:
        self._observe = observe
        self._gc = gc_pauses
        #: ``gc_pauses.by_generation`` when the sampler last went to sleep.
        self._gc_at_due: dict[int, float] = {}
        self.interval = interval
        self.stall_seconds = stall_seconds
        self.report_every = report_every
        #: ``monotonic()`` by which the loop should next have woken the sampler.
        self._due = monotonic() + interval
        #: Stall reports logged (the watchdog's count).
        self.reports = 0
        self._task: asyncio.Task[None] | None = None
        self._watchdog: threading.Thread | None = None
        self._stopped = threading.Event()
        self._loop_thread = threading.get_ident()

    async def __aenter__(self) -> LoopLag:
        loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._due = loop.time() + self.interval
        self._task = loop.create_task(self._sample(), name="loop-lag")
        if self.stall_seconds is not None:
            self._watchdog = threading.Thread(
                target=self._watch, name="loop-stall-watchdog", daemon=True
            )
            self._watchdog.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stopped.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._watchdog is not None:
            await asyncio.to_thread(self._watchdog.join)

    async def _sample(self) -> None:
        # The default loop's time() is monotonic(), which the watchdog reads too.
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.interval
            if self._gc is not None:
                self._gc_at_due = dict(self._gc.by_generation)
            self._due = due
            await asyncio.sleep(self.interval)
            self._observe(max(0.0, loop.time() - due))

    def _watch(self) -> None:
        assert self.stall_seconds is not None
        stall = self.stall_seconds
        reported_due = 0.0
        last_report = -self.report_every
        while not self._stopped.wait(min(stall / 4, 0.25)):
            due = self._due
            now = monotonic()
            held = now - due
            if held < stall or due == reported_due or now - last_report < self.report_every:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            stack = "".join(traceback.format_stack(frame)[-STACK_FRAMES:])
            del frame
            reported_due, last_report = due, now
            self.reports += 1
            collected = "" if self._gc is None else self._collected(now)
            log.warning(
                "event loop held for %.0f ms so far (every request waits%s); it is at:\n%s",
                held * 1000,
                collected,
                stack,
            )

    def _collected(self, now: float) -> str:
        """How much of the stall the garbage collector took, by generation, for the report."""
        assert self._gc is not None
        took = {
            generation: seconds - self._gc_at_due.get(generation, 0.0)
            for generation, seconds in self._gc.by_generation.items()
        }
        running = self._gc.collecting
        if running is not None:
            took[running[0]] = took.get(running[0], 0.0) + now - running[1]
        parts = [
            f"{seconds * 1000:.0f} ms in generation {generation}"
            for generation, seconds in sorted(took.items(), reverse=True)
            if seconds > 0
        ]
        detail = f" ({', '.join(parts)})" if parts else ""
        return f"; garbage collection: {sum(took.values()) * 1000:.0f} ms of it{detail}"
