"""Scan progress and read statistics of one read (§5.3 reads; Cloud Bigtable's request stats).

A filtered scan (§3: filters run in the tablet server) may read many rows and return few. The
server then reports how far it got, so that a client cut off in the middle resumes after the
last row *scanned* rather than the last row *returned*, and how much it read (Cloud Bigtable's
``FullReadStatsView``: rows and cells seen, rows and cells returned).

:class:`ScanStats` is the tablet's tally for one read. ``seen(row)`` counts a row the merge
produced, before the filter; ``dropped()`` counts one the filter removed and says when
:data:`REPORT_DROPPED_ROWS` have been dropped since the last row returned or report: the scan
then reports progress (the worker sends a ``ScanProgress`` stream item).
"""

from __future__ import annotations

from tabletstore.data.model import Row

__all__ = ["REPORT_DROPPED_ROWS", "ScanStats"]

#: A scan reports its progress after this many rows in a row were filtered out.
REPORT_DROPPED_ROWS = 1000


class ScanStats:
    """Rows and cells one read has seen (before filters), and the last row key it scanned."""

    __slots__ = ("_dropped", "cells_seen", "last_scanned", "report_every", "rows_seen")

    def __init__(self, report_every: int | None = None) -> None:
        self.rows_seen = 0
        self.cells_seen = 0
        self.last_scanned: bytes | None = None
        self.report_every = REPORT_DROPPED_ROWS if report_every is None else report_every
        self._dropped = 0

    def seen(self, row: Row) -> None:
        self.rows_seen += 1
        self.cells_seen += len(row.cells)
        self.last_scanned = row.key

    def returned(self) -> None:
        """A row got past the filter: the run of dropped rows ends."""
        self._dropped = 0

    def dropped(self) -> bool:
        """A row was filtered out; True when it is time to report progress."""
        self._dropped += 1
        if self._dropped >= self.report_every:
            self._dropped = 0
            return True
        return False
