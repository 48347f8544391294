"""The cyclic garbage collector's pauses in a server process.

CPython frees most objects by reference counting, but the cyclic collector stops the
interpreter -- every thread, the event loop with them -- while it walks the tracked objects of
the generations it collects. A young collection walks the objects made since the last one; a
full one walks everything the process holds that is not frozen (``ops/process_warmup.py``
freezes what start-up loaded and raises the thresholds). Each pause lands on whatever request
is running then, as a tail latency its own work does not explain.

:class:`GcPauses` times every collection through :data:`gc.callbacks` (called in the thread
that collects, at its start and its stop) and hands ``(generation, seconds)`` to ``observe``:
the worker's ``tabletstore_gc_pause_seconds{generation}`` histogram. It also keeps the total
time collected (in all, and per generation) and the collection under way, which the loop-lag
watchdog (``ops/loop_lag.py``) names in a stall report, generation by generation. Installed for as long as the ``with`` block
runs; the callbacks are the process's, so one process should install one.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

from tabletstore.clock import monotonic

__all__ = ["GC_PAUSE_BUCKETS", "GcPauses"]

#: Histogram buckets (seconds) of one collection's pause.
GC_PAUSE_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)


class GcPauses:
    """Times the cyclic collector's collections while installed (``with``)."""

    def __init__(self, observe: Callable[[int, float], None]) -> None:
        self._observe = observe
        #: Seconds spent collecting since installed.
        self.total = 0.0
        #: The same per generation collected (0: young ... 2: full). Every key is here from
        #: the start: another thread may read it while a collection adds to it.
        self.by_generation = dict.fromkeys(range(len(gc.get_threshold())), 0.0)
        #: Collections seen since installed.
        self.collections = 0
        #: ``(generation, monotonic start)`` of the collection under way, or None.
        self.collecting: tuple[int, float] | None = None

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        # Runs inside the collection, in the thread that collects, which holds the GIL until
        # the collection ends: nothing here may block, and no other thread runs meanwhile.
        if phase == "start":
            self.collecting = (int(info["generation"]), monotonic())
            return
        started = self.collecting
        self.collecting = None
        if started is None:  # installed during a collection
            return
        seconds = monotonic() - started[1]
        self.total += seconds
        generation = started[0]
        self.by_generation[generation] = self.by_generation.get(generation, 0.0) + seconds
        self.collections += 1
        self._observe(started[0], seconds)
