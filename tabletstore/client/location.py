"""Tablet location: the three-level lookup and its cache (§5.1).

"The client library caches tablet locations. If the client does not know the location of a
tablet, or if it discovers that cached location information is incorrect, then it recursively
moves up the tablet location hierarchy." (§5.1)

The levels (``metadata_table`` describes the rows):

1. the root tablet's record, read from the coordinator key ``root``;
2. rows of the root tablet, locating the other METADATA tablets;
3. rows of those METADATA tablets, locating user tablets.

A lookup for ``row`` of a table reads the first METADATA row whose key is after
``metadata_row_key(table, row)`` — the tablet with the smallest end row above ``row`` — from the
METADATA tablet holding that key, itself found the same way one level up. Each read is a scan
of up to ``prefetch`` rows, and every row read goes into the cache: "the client library
prefetches tablet locations: it reads the metadata for more than one tablet whenever it reads
the METADATA table" (§5.1).

The cache of levels 2 and 3 is one sorted map from METADATA row key to record, so a cached
lookup is one bisection. Overlapping entries (a stale parent cached before a split) resolve to
the smaller end row, exactly as the METADATA scan does. Records without a location are never
cached.

Staleness: callers that get ``NotServing`` (or cannot reach a worker) drop the entry with
:meth:`LocationCache.invalidate` and look up again. A METADATA read that itself fails drops the
METADATA tablet's entry and walks up one level (then to the coordinator) and tries again, up to
``attempts`` times per call; what is left is the caller's to retry with back-off.

:class:`LocationCache` is also what the catalog uses to read and write METADATA rows
(``catalog.MetadataRows``): the same walk finds the tablet holding a METADATA row.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

from sortedcontainers import SortedDict

from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.data.filters import RowFilter
from tabletstore.data.model import Mutation, Row, RowMutation
from tabletstore.data.query import RowRange
from tabletstore.errors import Indeterminate, NotServing, Unavailable
from tabletstore.metadata.record import TabletRecord, metadata_row_key
from tabletstore.metadata.rows import (
    METADATA_TABLE_ID,
    ROOT_END,
    MetadataRow,
    decode_row,
    is_root,
    table_range,
)
from tabletstore.rpc.messages import CheckAndMutateRequest, MutateRowsRequest, ReadRowsRequest
from tabletstore.rpc.row_pieces import RowAssembler
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Transport

__all__ = ["LocationCache", "LocationStats"]


@dataclass(slots=True)
class LocationStats:
    """Counters for tests and metrics."""

    #: Lookups answered from the cache (root included).
    hits: int = 0
    #: Lookups that had to read: level -> count (1: coordinator, 2: root tablet, 3: METADATA).
    reads: dict[int, int] = field(default_factory=lambda: {1: 0, 2: 0, 3: 0})
    #: Entries dropped because a worker said it no longer serves them (or did not answer).
    invalidations: int = 0
    #: Refreshes that could not read METADATA and answered with the cached entry.
    stale: int = 0


#: Set while a task reads a location for :meth:`LocationCache.locate`'s waiters.
_in_lookup: contextvars.ContextVar[bool] = contextvars.ContextVar("in_lookup", default=False)


def _unlocated(what: str) -> NotServing:
    return NotServing(f"{what} is not served yet (unassigned or moving)")


class LocationCache:
    """Where each tablet is served, found through the three levels and cached."""

    def __init__(
        self,
        coordinator: Coordinator,
        transport: Transport,
        *,
        prefetch: int = 16,
        attempts: int = 4,
        rpc_timeout: float = 3.0,
    ) -> None:
        """``prefetch``: METADATA rows read per lookup. ``attempts``: METADATA tablets tried
        per call (walking up after each failure). ``rpc_timeout``: seconds a METADATA request
        may take — a worker that is paused (not dead: its socket still accepts) must not hold
        a lookup for the transport's much longer data timeout."""
        self._coord = coordinator
        self._transport = transport
        self._prefetch = max(1, prefetch)
        self._attempts = max(1, attempts)
        self._rpc_timeout = rpc_timeout
        self._root: TabletRecord | None = None
        #: METADATA row key -> record (levels 2 and 3), every entry with a location.
        self._rows: SortedDict = SortedDict()
        #: Table id -> the lookup of a missed row of it being read now (see :meth:`locate`).
        self._lookups: dict[str, asyncio.Event] = {}
        self.stats = LocationStats()

    # ------------------------------------------------------------------ lookups

    async def root(self, *, refresh: bool = False) -> TabletRecord:
        """Level 1: the root tablet's record, from the coordinator."""
        if self._root is not None and not refresh:
            self.stats.hits += 1
            return self._root
        self._root = None
        self.stats.reads[1] += 1
        kv = await self._coord.get(paths.ROOT_TABLET)
        if kv is None:
            raise NotServing("the METADATA table has no root tablet yet (no master has run)")
        record = TabletRecord.from_bytes(kv.value)
        if record.location is None:
            raise _unlocated("the root tablet")
        self._root = record
        return record

    def _cached(self, table_id: str, row: bytes) -> TabletRecord | None:
        i = self._rows.bisect_right(metadata_row_key(table_id, row))
        if i >= len(self._rows):
            return None
        rec: TabletRecord = self._rows.peekitem(i)[1]
        return rec if rec.table_id == table_id and rec.contains(row) else None

    def cached(self, table_id: str, row: bytes) -> TabletRecord | None:
        """The cached entry for ``row`` (with a location), or None: what ``locate`` answers
        without a lookup, for a caller that must not suspend on the common path."""
        if table_id == METADATA_TABLE_ID and row < ROOT_END:
            return self._root
        found = self._cached(table_id, row)
        if found is not None:
            self.stats.hits += 1
        return found

    async def locate(self, table_id: str, row: bytes, *, refresh: bool = False) -> TabletRecord:
        """The served tablet holding ``row``; NotServing if it has no location yet.

        With ``refresh``, the entry is read again (one level up). If that read fails (the
        METADATA tablet holding it is itself being recovered), the cached entry is kept and
        returned: it is most likely still right (only one tablet's error led here), and a
        wrong one only costs a refused request, while dropping it would stall every request
        to a healthy tablet until METADATA is served again."""
        if table_id == METADATA_TABLE_ID and row < ROOT_END:
            return await self.root(refresh=refresh)
        cached = self._cached(table_id, row)
        if not refresh and cached is None and not _in_lookup.get():
            pending = self._lookups.get(table_id)
            if pending is not None:
                # Many requests of a table missing at once (a new client, a cold cache):
                # the first one's read prefetches the rows after its own, most likely the
                # others' too. Each waits for it once, then reads for itself if still missing.
                await pending.wait()
                cached = self._cached(table_id, row)
            else:
                mine = self._lookups[table_id] = asyncio.Event()
                # Whatever this read awaits (METADATA lookups of its own) never waits for a
                # lookup in flight: it might be this one.
                token = _in_lookup.set(True)
                try:
                    return await self._read_location(table_id, row, None)
                finally:
                    _in_lookup.reset(token)
                    mine.set()
                    if self._lookups.get(table_id) is mine:
                        del self._lookups[table_id]
        if not refresh and cached is not None:
            self.stats.hits += 1
            return cached
        return await self._read_location(table_id, row, cached)

    async def _read_location(
        self, table_id: str, row: bytes, cached: TabletRecord | None
    ) -> TabletRecord:
        """:meth:`locate` of a row not cached (``cached`` None) or refreshed: one METADATA
        read."""
        if cached is not None:
            self.stats.invalidations += 1  # in doubt: replaced unless METADATA cannot answer
        self.stats.reads[2 if table_id == METADATA_TABLE_ID else 3] += 1
        key = metadata_row_key(table_id, row)
        _, hi = table_range(table_id)
        try:
            found = await self._scan(key, False, hi, True, limit=self._prefetch)
        except Unavailable:
            if cached is None:
                raise
            self.stats.stale += 1
            return cached
        for r in found:
            for rec in (*r.pending, r.record):
                if rec.table_id == table_id and rec.contains(row):
                    if cached != rec:
                        self._forget(cached)  # a split or merge may have left it under a key
                    if rec.location is None:
                        raise _unlocated(f"tablet {rec.tablet_id} of table {table_id}")
                    return rec
        self._forget(cached)
        raise NotServing(f"no tablet of table {table_id} holds row {row[:64]!r}")

    def _forget(self, rec: TabletRecord | None) -> None:
        """Drop ``rec`` from the cache if it is still there (METADATA said otherwise)."""
        if rec is not None and self._rows.get(rec.row_key) == rec:
            del self._rows[rec.row_key]

    async def tablets(self, table_id: str, *, refresh: bool = False) -> list[TabletRecord]:
        """Every tablet of the table in row order (a whole-table METADATA scan unless the cache
        already covers the table without gaps). Tablets not served yet have no location."""
        lo, hi = table_range(table_id)
        keys = list(self._rows.irange(lo, hi, inclusive=(False, True)))
        if not refresh:
            cover = _contiguous([self._rows[k] for k in keys])
            if cover is not None:
                self.stats.hits += 1
                return cover
        self.stats.reads[2 if table_id == METADATA_TABLE_ID else 3] += 1
        # Read first: if METADATA cannot answer (a METADATA tablet being recovered), the
        # cached entries stay, as in a failed refresh of one (``locate``), so requests to the
        # table's healthy tablets go on meanwhile instead of all waiting for METADATA.
        found = await self._scan(lo, False, hi, True, limit=None)
        # A whole-table read replaces whatever the cache held for the table (stale entries
        # overlapping fresh ones would otherwise keep the cover from ever being whole); the
        # scan has cached the fresh ones already.
        fresh = {r.key for r in found if r.record.location is not None}
        for k in keys:
            if k not in fresh:
                self._rows.pop(k, None)
        out: dict[bytes, TabletRecord] = {}
        for r in found:
            for rec in r.pending:
                out.setdefault(rec.row_key, rec)
            out[r.key] = r.record
        return sorted(out.values(), key=lambda rec: rec.start_row)

    def invalidate(self, table_id: str, row: bytes | None = None) -> None:
        """Forget the entry for ``row`` of the table (every entry of the table if None)."""
        self.stats.invalidations += 1
        if table_id == METADATA_TABLE_ID and row is not None and row < ROOT_END:
            self._root = None
            return
        if row is None:
            lo, hi = table_range(table_id)
            for key in list(self._rows.irange(lo, hi, inclusive=(False, True))):
                del self._rows[key]
            if table_id == METADATA_TABLE_ID:
                self._root = None
            return
        i = self._rows.bisect_right(metadata_row_key(table_id, row))
        if i < len(self._rows):
            rec: TabletRecord = self._rows.peekitem(i)[1]
            if rec.table_id == table_id:
                del self._rows[rec.row_key]

    def _drop(self, holder: TabletRecord) -> None:
        """A METADATA tablet did not answer as its entry said: walk up next time."""
        self.stats.invalidations += 1
        if is_root(holder):
            self._root = None
        elif self._rows.get(holder.row_key) == holder:
            del self._rows[holder.row_key]

    def retain(self, addresses: set[str]) -> None:
        """Forget every entry located at a worker not in ``addresses`` (e.g. the live workers
        of the servers directory: a worker whose lease ended serves nothing)."""
        if self._root is not None and self._root.location not in addresses:
            self._root = None
        for key, rec in list(self._rows.items()):
            if rec.location not in addresses:
                del self._rows[key]

    def _worker(self, holder: TabletRecord) -> TabletService:
        """A stub of the worker serving METADATA tablet ``holder``, each request bounded by
        ``rpc_timeout`` (past it: Indeterminate if sent, as the Transport contract says)."""
        assert holder.location is not None
        return TABLET.client(self._transport, holder.location, timeout=self._rpc_timeout)

    # ------------------------------------------------------------------ METADATA rows

    async def _holder(self, key: bytes) -> TabletRecord:
        """The METADATA tablet holding METADATA row key ``key``."""
        return await self.locate(METADATA_TABLE_ID, key)

    async def _next_holder(
        self, key: bytes, failed: TabletRecord | None, error: Exception | None
    ) -> TabletRecord:
        """The METADATA tablet holding ``key``, looked up again after ``failed`` (None on the
        first try) did not answer. If the level above still names the same place, asking it
        again now is pointless: ``error`` goes to the caller, who backs off."""
        holder = await self._holder(key)
        if failed is not None and (holder.tablet_id, holder.location, holder.epoch) == (
            failed.tablet_id,
            failed.location,
            failed.epoch,
        ):
            assert error is not None
            raise error
        return holder

    async def _scan(
        self, lo: bytes, lo_incl: bool, hi: bytes, hi_incl: bool, *, limit: int | None
    ) -> list[MetadataRow]:
        """Decoded METADATA rows between ``lo`` and ``hi``; each record with a location is
        cached (the prefetch)."""
        rows = await self.read_rows(
            lo, hi, start_inclusive=lo_incl, end_inclusive=hi_incl, limit=limit
        )
        out = []
        for row in rows:
            decoded = decode_row(row)
            if decoded is None:
                continue  # a row being deleted
            out.append(decoded)
            if decoded.record.location is not None:
                self._rows[decoded.key] = decoded.record
        return out

    async def _read_at(
        self,
        pos: bytes,
        pos_incl: bool,
        hi: bytes,
        hi_incl: bool,
        limit: int | None,
        have: int,
    ) -> tuple[list[Row], TabletRecord]:
        """Rows from the METADATA tablet holding ``pos``, clipped to it; walks up on failure."""
        error: Exception | None = None
        failed: TabletRecord | None = None
        for _ in range(self._attempts):
            holder = await self._next_holder(pos, failed, error)
            end, end_incl = hi, hi_incl
            if holder.end_row is not None and holder.end_row <= hi:
                end, end_incl = holder.end_row, False
            req = ReadRowsRequest(
                METADATA_TABLE_ID,
                holder.tablet_id,
                ranges=(RowRange(pos, end, start_inclusive=pos_incl, end_inclusive=end_incl),),
                limit=None if limit is None else limit - have,
            )
            assert holder.location is not None
            try:
                rows: list[Row] = []
                assembler = RowAssembler(holder.location)
                async for item in self._worker(holder).read_rows(req):
                    rows.extend(assembler.rows(item))
                assembler.finish()
                return rows, holder
            except Unavailable as exc:  # NotServing included: the tablet moved
                self._drop(holder)
                error, failed = exc, holder
            except Indeterminate as exc:
                # A read with no answer is simply not available (it changes nothing).
                self._drop(holder)
                error, failed = Unavailable(f"METADATA read got no answer: {exc}"), holder
        assert error is not None
        raise error

    async def read_rows(
        self,
        start: bytes,
        end: bytes,
        *,
        start_inclusive: bool = True,
        end_inclusive: bool = True,
        limit: int | None = None,
    ) -> list[Row]:
        """Raw METADATA rows in a key range (the catalog's reads)."""
        out: list[Row] = []
        pos, pos_incl = start, start_inclusive
        while limit is None or len(out) < limit:
            rows, holder = await self._read_at(pos, pos_incl, end, end_inclusive, limit, len(out))
            out.extend(rows)
            stop = holder.end_row
            if stop is None or stop > end or (stop == end and not end_inclusive):
                break
            pos, pos_incl = stop, True
        return out

    async def check_and_mutate(
        self,
        key: bytes,
        predicate: RowFilter | None,
        true_mutations: Sequence[Mutation],
        false_mutations: Sequence[Mutation],
    ) -> bool:
        """A single-row transaction on METADATA row ``key`` (§3). A refusal (``Unavailable``,
        ``NotServing`` included: nothing was applied) is retried here at the tablet's next
        location; ``Indeterminate`` (no answer) may have been applied and is the caller's to
        resolve (after this entry is dropped)."""
        req_args = (key, predicate, tuple(true_mutations), tuple(false_mutations))
        error: Exception | None = None
        failed: TabletRecord | None = None
        for _ in range(self._attempts):
            holder = await self._next_holder(key, failed, error)
            assert holder.location is not None
            req = CheckAndMutateRequest(METADATA_TABLE_ID, holder.tablet_id, *req_args)
            try:
                resp = await self._worker(holder).check_and_mutate(req)
                return resp.matched
            except Unavailable as exc:
                self._drop(holder)
                error, failed = exc, holder
            except Indeterminate:
                self._drop(holder)
                raise
        assert error is not None
        raise error

    async def mutate_row(self, key: bytes, mutations: Sequence[Mutation]) -> None:
        """Apply mutations to METADATA row ``key`` (idempotent ones: retried on any failure)."""
        error: Exception | None = None
        failed: TabletRecord | None = None
        for _ in range(self._attempts):
            holder = await self._next_holder(key, failed, error)
            assert holder.location is not None
            req = MutateRowsRequest(
                METADATA_TABLE_ID, holder.tablet_id, (RowMutation(key, tuple(mutations)),)
            )
            try:
                resp = await self._worker(holder).mutate_rows(req)
            except (Unavailable, Indeterminate) as exc:  # idempotent: no answer is retried too
                self._drop(holder)
                error, failed = exc, holder
                continue
            entry = resp.errors[0].exception() if resp.errors else None
            if isinstance(entry, NotServing):
                self._drop(holder)
                error, failed = entry, holder
                continue
            if isinstance(entry, Indeterminate):
                raise entry
            if entry is not None:
                raise Unavailable(f"METADATA row {key!r}: {type(entry).__name__}: {entry}")
            return
        assert error is not None
        raise error


def _contiguous(records: list[TabletRecord]) -> list[TabletRecord] | None:
    """``records`` (in key order) if they tile a whole table: first starts at b"", each starts
    where the previous ends, the last is unbounded. Else None (the cache has gaps)."""
    if not records or records[0].start_row != b"" or records[-1].end_row is not None:
        return None
    for a, b in itertools.pairwise(records):
        if a.end_row != b.start_row:
            return None
    return records
