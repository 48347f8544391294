"""Which of a worker's tablets a log trim moves forward (§5.3, §5.4).

A tablet's log position (``TabletRecord.log_starts``) pins the worker's commit log from that
segment on: after a crash, recovery sorts and replays the dead log from the lowest position of
its tablets. Minor compactions move a position forward; so does the worker's periodic trim
(``TabletServer._trim_logs``, every ``WorkerOptions.log_trim_interval``), for every tablet whose
position lags the log's end by ``log_trim_segments`` segments or ``log_trim_bytes`` bytes,
whichever comes first: a minor compaction when the tablet has writes in memory (§5.4: it
"reduces how much data has to be read from the commit log during recovery"), else a record
update alone.

The two bounds answer to different costs. Recovery reads the tail with one GET per segment, so
a tail of many one-write segments (a lightly loaded worker) is slow to read however few bytes
it holds: the segment bound keeps it short. Every trim of a tablet with writes in memory writes
an SSTable of what it logged meanwhile, so a tail of B bytes shared by T tablets written evenly
makes SSTables of about B / T: the byte bound is what sets their size under load, and it also
bounds the memory the worker's memtables hold between trims. A segment bound alone made a
worker of 30 tablets written in 100 KB group commits flush a few hundred KB per trim, and its
minor and merging compactions per GB written grew with its tablet count.

Tablets written evenly reach a bound in the same round, and their minor compactions then land
together: a burst of SSTable writes (on a local disk, fsyncs the commit log's own wait behind)
and of CPU, every trim interval of the run. :class:`TrimShares` gives each tablet a share of
the bounds, drawn between half and all of them and drawn again after each of its trims, so
their trims spread out instead (HBase's periodic memstore flusher delays each of its flushes
by a random amount for the same reason). The bounds stay what the options say at most.

Segments carry no byte offsets, so :class:`LogTail` keeps samples of (segment mark, bytes
written) taken at each trim round and measures a tail from the last sample at or before its
first segment: it overestimates by at most one round's bytes (a trim comes slightly early,
never late). The samples no position needs any more are dropped each round.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Collection, Hashable

from tabletstore.clock import Random

__all__ = ["LogTail", "TrimShares", "lags"]


class LogTail:
    """Samples of one log's (segment mark, bytes written before it), oldest first."""

    __slots__ = ("_bytes", "_log", "_marks")

    def __init__(self) -> None:
        self._log: Hashable | None = None
        self._marks: list[int] = []
        self._bytes: list[int] = []

    def sample(self, log: Hashable, mark: int, written: int) -> None:
        """Record that ``written`` bytes of ``log`` were written before segment ``mark``. A new
        ``log`` (the worker switched to another incarnation) starts the samples again."""
        if log != self._log:
            self._log = log
            self._marks.clear()
            self._bytes.clear()
        if not self._marks or mark > self._marks[-1]:
            self._marks.append(mark)
            self._bytes.append(written)

    def bytes_after(self, segment: int, written: int) -> int:
        """Bytes of the log from ``segment`` to its end, ``written`` being the bytes written so
        far: counted from the last sample at or before ``segment`` (from the log's start when
        there is none)."""
        i = bisect_right(self._marks, segment) - 1
        return written - (self._bytes[i] if i >= 0 else 0)

    def forget_before(self, segment: int) -> None:
        """Drop the samples no position at or after ``segment`` needs (all but the last one at
        or before it)."""
        i = bisect_right(self._marks, segment) - 1
        if i > 0:
            del self._marks[:i]
            del self._bytes[:i]

    def __len__(self) -> int:
        return len(self._marks)


def lags(
    position: int,
    mark: int,
    tail: LogTail,
    written: int,
    *,
    max_segments: int,
    max_bytes: int,
) -> bool:
    """Whether a tablet whose log position is segment ``position`` lags the log's end (its
    segment ``mark``, ``written`` bytes so far) by ``max_segments`` segments or ``max_bytes``
    bytes."""
    return mark - position >= max_segments or tail.bytes_after(position, written) >= max_bytes


class TrimShares:
    """The share of the trim bounds at which each tablet is trimmed (module docstring)."""

    #: The smallest share: a tablet is trimmed once it lags at least half the bounds.
    LOW = 0.5

    __slots__ = ("_random", "_shares")

    def __init__(self, random: Random) -> None:
        self._random = random
        self._shares: dict[Hashable, float] = {}

    def of(self, key: Hashable) -> float:
        """The share of the bounds ``key``'s tablet is trimmed at (drawn at first sight)."""
        share = self._shares.get(key)
        if share is None:
            share = self._shares[key] = self._random.uniform(self.LOW, 1.0)
        return share

    def trimmed(self, key: Hashable) -> None:
        """``key``'s tablet was trimmed: its next trim comes at a new share."""
        self._shares[key] = self._random.uniform(self.LOW, 1.0)

    def keep(self, keys: Collection[Hashable]) -> None:
        """Forget the tablets not among ``keys`` (no longer served here)."""
        for key in [k for k in self._shares if k not in keys]:
            del self._shares[key]
