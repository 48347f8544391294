"""Tablet location cache (§5.1).

"The client library caches tablet locations. If the client does not know the location of a
tablet, or if it discovers that cached location information is incorrect, then it recursively
moves up the tablet location hierarchy." (§5.1)

The cache holds, per table, the sorted list of tablet records read from the catalog; a lookup
is a binary search on start rows. A stale entry (a worker answered ``NotServing``) is dropped
and the table's records are read again; reading all of a table's records at once is the
prefetch of neighbouring METADATA rows the paper describes.
"""

from __future__ import annotations

import bisect
from collections.abc import Awaitable, Callable

from tabletstore.errors import NotServing
from tabletstore.metadata import TabletRecord

__all__ = ["LocationCache"]


class _TableLocations:
    __slots__ = ("records", "starts")

    def __init__(self, records: list[TabletRecord]) -> None:
        self.records = sorted(records, key=lambda r: r.start_row)
        self.starts = [r.start_row for r in self.records]

    def find(self, row: bytes) -> TabletRecord | None:
        i = bisect.bisect_right(self.starts, row) - 1
        if i < 0:
            return None
        rec = self.records[i]
        return rec if rec.contains(row) else None


class LocationCache:
    """Table id -> its tablets, refreshed on demand."""

    def __init__(self, fetch: Callable[[str], Awaitable[list[TabletRecord]]]) -> None:
        self._fetch = fetch
        self._tables: dict[str, _TableLocations] = {}
        self.lookups = 0
        self.refreshes = 0

    async def tablets(self, table_id: str, *, refresh: bool = False) -> list[TabletRecord]:
        """Every tablet of the table in row order."""
        locs = self._tables.get(table_id)
        if locs is None or refresh:
            self.refreshes += 1
            locs = self._tables[table_id] = _TableLocations(await self._fetch(table_id))
        return locs.records

    async def locate(self, table_id: str, row: bytes, *, refresh: bool = False) -> TabletRecord:
        """The tablet holding ``row``; NotServing if no tablet has a location yet."""
        self.lookups += 1
        await self.tablets(table_id, refresh=refresh)
        rec = self._tables[table_id].find(row)
        if rec is None or rec.location is None:
            if not refresh:
                return await self.locate(table_id, row, refresh=True)
            raise NotServing(f"no served tablet holds row {row[:64]!r} of table {table_id}")
        return rec

    def invalidate(self, table_id: str) -> None:
        self._tables.pop(table_id, None)
