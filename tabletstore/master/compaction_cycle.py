"""The master's major-compaction cycle (§5.4): every tablet is major-compacted at least once a
period, so deleted data (and a dropped family's cells) is gone from the bucket within a bounded
time, even in a tablet nobody writes to.

Paper §5.4: "Bigtable cycles through all of its tablets and regularly applies major
compactions to them." :func:`due` is the pure planner: a tablet is due when its last
``major_compaction`` event (or, with none in its event log, its oldest event) is at least
``period`` seconds old and it has SSTables. The master runs :class:`MajorCompactionCycle` after
each assignment round; it hands each due tablet to its :class:`CompactionExecutor`:

* :class:`WorkerCompactionExecutor` (the default) asks the serving worker (``compact_tablet``,
  major), which runs the rewrite on its compaction processes
  (``WorkerOptions.compaction_processes``);
* ``master.remote_compaction.RemoteCompactionExecutor`` runs the rewrite in the master's
  process, and ``master.compaction_lambda.LambdaCompactionExecutor`` in an AWS Lambda function
  (``functions/compaction.py``): both read the SSTables straight from the bucket and hand
  the output to the serving worker to adopt.

Either way the serving worker commits the result with the epoch-conditional record update
every compaction of the tablet uses, under the tablet's compaction lock, and refuses one whose
tablet moved or changed since (``master/remote_compaction.py``). At most ``max_in_flight`` run at
once, in the background: the master loop never waits on one, nor on the listing of every
record, which runs in the background too and at most every ``period / 24`` seconds (hourly
by default): listing every record each second would load METADATA for nothing, and wait on it
while a METADATA tablet is being recovered.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.metadata.record import TabletRecord

__all__ = [
    "MAJOR_COMPACTION_EVENT",
    "CompactionExecutor",
    "MajorCompactionCycle",
    "WorkerCompactionExecutor",
    "due",
]

log = logging.getLogger(__name__)

#: The event kind a tablet records after a major compaction (engine.state).
MAJOR_COMPACTION_EVENT = "major_compaction"


def due(records: Sequence[TabletRecord], now: float, period: float) -> list[TabletRecord]:
    """The records whose tablet is due for a major compaction, the longest-waiting first."""
    waiting: list[tuple[float, TabletRecord]] = []
    for rec in records:
        if not any(rec.sstables.values()):
            continue  # nothing on disk to rewrite
        majors = [e.at for e in rec.events if e.kind == MAJOR_COMPACTION_EVENT]
        last = max(majors) if majors else min((e.at for e in rec.events), default=0.0)
        if now - last >= period:
            waiting.append((last, rec))
    waiting.sort(key=lambda w: w[0])
    return [rec for _, rec in waiting]


class CompactionExecutor(Protocol):
    """Where the cycle's major compactions run (module docstring)."""

    async def compact(self, record: TabletRecord) -> None:
        """Major-compact ``record``'s tablet; a TabletStoreError when it is not served now,
        moved or changed meanwhile (the cycle tries again at a later round)."""
        ...

    async def close(self) -> None: ...


class WorkerCompactionExecutor:
    """Asks the worker serving the tablet to run the major compaction itself."""

    def __init__(self, ask: Callable[[TabletRecord], Awaitable[None]]) -> None:
        """``ask``: send ``compact_tablet`` (major) to the tablet's worker (the master's)."""
        self._ask = ask

    async def compact(self, record: TabletRecord) -> None:
        await self._ask(record)

    async def close(self) -> None:
        """Nothing held."""


class MajorCompactionCycle:
    """Starts the due major compactions each round, in the background (module docstring)."""

    def __init__(
        self,
        *,
        period: float | None,
        records: Callable[[], Awaitable[Sequence[TabletRecord]]],
        executor: CompactionExecutor,
        now: Callable[[], float],
        max_in_flight: int = 2,
    ) -> None:
        """``records``: every tablet record; ``executor``: runs one tablet's major
        compaction (raises if it is not served); ``now``: wall-clock seconds."""
        if period is not None and period <= 0:
            raise InvalidArgument(f"major_compaction_period must be > 0 seconds, got {period}")
        if max_in_flight < 1:
            raise InvalidArgument(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.period = period
        self._records = records
        #: Where the compactions run; the master process may replace it before it leads.
        self.executor = executor
        self._now = now
        self.max_in_flight = max_in_flight
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._scan: asyncio.Task[int] | None = None
        #: When the next listing may start (``now()`` seconds); the first one at once.
        self.next_scan = 0.0
        #: Major compactions this cycle finished (for tests and status).
        self.finished = 0

    def run_round(self) -> None:
        """Reap what finished and, when the next listing is due, start it in the background
        (it starts the due compactions). Never waits."""
        for key, task in list(self._running.items()):
            if task.done():
                del self._running[key]
                if not task.cancelled() and (exc := task.exception()) is not None:
                    log.warning("major compaction of %s/%s failed: %s", *key, exc)
        if self._scan is not None and self._scan.done():
            if not self._scan.cancelled() and (exc := self._scan.exception()) is not None:
                log.info("major compaction cycle: listing the tablets failed: %s", exc)
                self.next_scan = self._now()  # METADATA not served yet: try again soon
            self._scan = None
        if self.period is None or self._scan is not None or self._now() < self.next_scan:
            return
        self._scan = asyncio.get_running_loop().create_task(
            self.scan(), name="major compaction cycle"
        )

    async def scan(self) -> int:
        """List every record and start the due compactions (within the in-flight bound);
        returns how many started. The next listing is due ``period / 24`` s later, or at
        once if the bound left due tablets waiting."""
        assert self.period is not None
        started = 0
        pending = False
        for rec in due(await self._records(), self._now(), self.period):
            key = (rec.table_id, rec.tablet_id)
            if key in self._running:
                continue
            if len(self._running) >= self.max_in_flight:
                pending = True
                break
            self._running[key] = asyncio.get_running_loop().create_task(
                self._one(rec), name=f"major compaction of {rec.tablet_id}"
            )
            started += 1
        self.next_scan = self._now() + (0.0 if pending else self.period / 24)
        return started

    async def _one(self, rec: TabletRecord) -> None:
        try:
            await self.executor.compact(rec)
        except TabletStoreError as exc:
            # Not served right now (moving, recovering): the next round sees it due again.
            log.info("major compaction of %s/%s not run: %s", rec.table_id, rec.tablet_id, exc)
            return
        self.finished += 1

    async def wait(self) -> None:
        await asyncio.gather(*self._running.values(), return_exceptions=True)

    async def close(self) -> None:
        tasks = [*self._running.values(), *([self._scan] if self._scan is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._running.clear()
        self._scan = None
        await self.executor.close()
