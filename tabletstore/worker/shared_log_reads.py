"""Reading a dead worker's commit log once for every tablet this worker recovers from it
(§5.3, §6 "Commit-log implementation").

The paper's warning: with one log per tablet server, every new owner of one of a dead server's
tablets would read the whole log for its few records, N times over. The sorted recovery of
docs/architecture/design.md §7 removes that across workers; within one worker,
:class:`SharedLogReads` makes the tablets it recovers from the same log concurrently (the master
loads a level's tablets together) share one read of it: the first load fences the log and reads it
whole, the others wait for that read and filter its records, and the records stay for ``keep``
seconds after the last use (the next level's loads follow within a round or two).

The records read are exactly :class:`~tabletstore.commitlog.reader.CommitLogReader`'s: the
log must be whole up to its first fence, else Corruption — never a silent skip.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass

from tabletstore.clock import Clock
from tabletstore.commitlog import CommitLogReader, LogRecord, fence
from tabletstore.keys import Cell
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["SharedLogReads", "tablet_cells"]

#: Seconds a log's records stay after their last use.
KEEP_SECONDS = 30.0


@dataclass
class _Read:
    records: list[LogRecord]
    last_used: float
    #: The first segment read (a tablet's log position, §5.3: earlier ones hold none of its
    #: writes past its redo point).
    start: int = 0


class SharedLogReads:
    """One fenced read of each dead log, shared by the loads that need it."""

    def __init__(self, store: ObjectStore, clock: Clock, *, keep: float = KEEP_SECONDS) -> None:
        self._store = store
        self._clock = clock
        self._keep = keep
        self._locks: dict[LogRef, asyncio.Lock] = {}
        self._reads: dict[LogRef, _Read] = {}

    async def records(self, ref: LogRef, start: int = 0) -> list[LogRecord]:
        """Every record of the (fenced) log ``ref`` from segment ``start`` on (or from an
        earlier one, when such a read is at hand), in log order."""
        self._expire()
        async with self._locks.setdefault(ref, asyncio.Lock()):
            read = self._reads.get(ref)
            if read is None or read.start > start:
                # (From a lower position, fenced and read again: the fence plugs the gaps of
                # the dead writer's in-flight window from there on, which the reader must see.)
                await fence(self._store, ref.worker_id, ref.incarnation, start=start)
                reader = CommitLogReader(self._store, ref.worker_id, ref.incarnation)
                read = _Read([r async for r in reader.records(start_segment=start)], 0.0, start)
                self._reads[ref] = read
            read.last_used = self._clock.monotonic()
            return read.records

    def holds(self, ref: LogRef) -> bool:
        """Whether this worker has read the (fenced) log ``ref`` lately: a root or METADATA
        tablet it recovered first read it before the user tablets' sort was even planned,
        and they then take their records from that read (read again from a lower position
        if theirs is lower) rather than wait for the sort."""
        self._expire()
        return ref in self._reads

    def _expire(self) -> None:
        now = self._clock.monotonic()
        for ref in [r for r, read in self._reads.items() if now - read.last_used > self._keep]:
            del self._reads[ref]
            lock = self._locks.get(ref)
            if lock is not None and not lock.locked():
                del self._locks[ref]


def tablet_cells(records: list[LogRecord], tablet: TabletRecord) -> Iterator[Cell]:
    """The cells of ``tablet`` (its table, its row range) past its redo point."""
    redo, end = tablet.redo_seq, tablet.end_row
    for record in records:
        if (
            record.table_id == tablet.table_id
            and record.last_seq > redo
            and record.row >= tablet.start_row
            and (end is None or record.row < end)
        ):
            for cell in record.cells:
                if cell.seq > redo:
                    yield cell
