"""Reading rows from the tablets that hold them, across retries (§3, §5.1).

What :class:`AsyncTable <tabletstore.client.table.AsyncTable>`'s reads do once the request is
checked (as python-bigtable's ``_read_rows`` does for its table):

- a point read (:func:`read_one`) is one unary ``read_row`` request to the worker serving the
  row; a plain one, on a client that coalesces (a cluster client), shares a ``read_points``
  request with the other point reads to that worker (:func:`point_read`, sent by
  :func:`read_points`; ``client/coalesce.py``). A row too large for one reply comes back as
  ``LargeRow`` and is read again as a stream.
- a scan (:func:`read_batches`) streams the row set tablet by tablet, in key order (descending
  with ``reverse``), whole rows in batches and a large row in pieces (``rpc.row_pieces``); when
  a tablet splits or moves or its worker stops answering, it resumes after the last row it
  handed out (or the last row a progress report said was scanned), within the client's retry
  deadline counted from the last progress.

A read is always safe to send again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Iterable, Sequence
from typing import TYPE_CHECKING, cast

from tabletstore.client.backoff import retry_pause
from tabletstore.client.coalesce import Coalescer
from tabletstore.data.filters import RowFilter
from tabletstore.data.model import Row
from tabletstore.data.query import RowRange, RowSet
from tabletstore.data.validation import check_row_key
from tabletstore.errors import Fenced, Indeterminate, InvalidArgument, NotServing, Unavailable
from tabletstore.metadata.catalog import TableInfo
from tabletstore.rpc.messages import (
    EntryError,
    LargeRow,
    PointReadsRequest,
    ReadRowsRequest,
    RowBatch,
    ScanProgress,
    TabletKeys,
)
from tabletstore.rpc.row_pieces import RowAssembler
from tabletstore.rpc.services import TabletService

if TYPE_CHECKING:
    from tabletstore.client.client import AsyncClient

__all__ = [
    "PointRead",
    "PointReadKey",
    "point_read",
    "read_batches",
    "read_one",
    "read_points",
    "select_rows",
]

#: The worker coalesced point reads go to and who sends them: (worker address, identity).
PointReadKey = tuple[str, str | None]
#: One coalesced point read: (table id, tablet id, row key).
PointRead = tuple[str, str, bytes]


async def read_one(
    client: AsyncClient,
    table: str,
    row: bytes,
    filter: RowFilter | None,
    fams: tuple[str, ...] | None,
) -> RowBatch | LargeRow:
    """One ``read_row`` request for ``row``. With the table and the row's tablet in the
    caches (nearly always), the first try goes straight to the worker, without the retry
    loop's lookups (a few µs of coroutines per read); a
    refusal or a request without answer (safe: a read) goes through ``_with_retry``,
    as :func:`point_read`'s."""

    def send(w: TabletService, table_id: str, tablet_id: str) -> Awaitable[RowBatch | LargeRow]:
        return w.read_row(
            ReadRowsRequest(
                table_id,
                tablet_id,
                keys=(row,),
                filter=filter,
                families=fams,
                identity=client.identity,
            )
        )

    info = client._tables.get(table)
    rec = None if info is None else client.locations.cached(info.table_id, row)
    if info is not None and rec is not None and rec.location is not None:
        try:
            return await send(client._worker(rec.location), info.table_id, rec.tablet_id)
        except Indeterminate:
            client.locations.invalidate(info.table_id, row)  # as _with_retry does
        except (Unavailable, Fenced):
            pass
    return await client._with_retry(
        table, row, "read", lambda w, i, r: send(w, i.table_id, r.tablet_id), safe=True
    )


async def point_read(
    client: AsyncClient,
    table: str,
    point_reads: Coalescer[PointReadKey, PointRead, Row | LargeRow | None],
    row: bytes,
) -> Row | LargeRow | None:
    """A coalesced point read (sent by :func:`read_points`). With the table and the row's
    tablet in the caches (nearly always), it is submitted at once, without the retry
    loop's lookups; a refusal or a request without answer (safe: a read) goes through
    ``_with_retry``, which looks the tablet up again as usual."""
    info = client._tables.get(table)
    rec = None if info is None else client.locations.cached(info.table_id, row)
    if info is not None and rec is not None and rec.location is not None:
        try:
            return await point_reads.submit(
                (rec.location, client.identity), (info.table_id, rec.tablet_id, row)
            )
        except Indeterminate:
            client.locations.invalidate(info.table_id, row)  # as _with_retry does
        except (Unavailable, Fenced):
            pass
    return await client._with_retry(
        table,
        row,
        "read",
        lambda w, i, r: point_reads.submit(
            (cast(str, r.location), client.identity), (i.table_id, r.tablet_id, row)
        ),
        safe=True,
    )


async def read_points(
    client: AsyncClient, key: PointReadKey, reads: list[PointRead]
) -> list[Row | LargeRow | BaseException | None]:
    """One ``read_points`` request for the point reads of one worker (the client's read coalescer),
    whatever their tablets: each caller's row, or None; its tablet's own error (a tablet
    no longer served there), raised to that tablet's callers only; or a ``LargeRow``
    answer (its tablet's rows are too large for one reply), which sends each of those
    callers to read its row alone."""
    location, identity = key
    parts: dict[tuple[str, str], dict[bytes, None]] = {}
    for table_id, tablet_id, row in reads:
        parts.setdefault((table_id, tablet_id), {})[row] = None  # one row read once
    reply = await client._worker(location).read_points(
        PointReadsRequest(
            tuple(TabletKeys(t, tablet, tuple(rows)) for (t, tablet), rows in parts.items()),
            identity,
        )
    )
    if len(reply.answers) != len(parts):
        raise Indeterminate(
            f"{location} answered {len(reply.answers)} parts to {len(parts)} of read_points"
        )
    found: dict[tuple[str, str], dict[bytes, Row] | LargeRow | EntryError] = {}
    for part, answer in zip(parts, reply.answers, strict=True):
        if isinstance(answer, RowBatch):
            found[part] = {r.key: r for r in answer.rows}
        else:
            found[part] = answer
    out: list[Row | LargeRow | BaseException | None] = []
    for table_id, tablet_id, row in reads:
        got = found[table_id, tablet_id]
        if type(got) is dict:
            out.append(got.get(row))
        elif type(got) is EntryError:
            out.append(got.exception())  # each caller its own exception
        else:
            out.append(cast(LargeRow, got))
    return out


async def read_batches(
    client: AsyncClient,
    table: str,
    rs: RowSet,
    filter: RowFilter | None,
    limit: int | None,
    families: Iterable[str] | None,
    reverse: bool,
    *,
    stats: bool,
) -> AsyncIterator[Sequence[Row] | ScanProgress]:
    """The rows in non-empty batches (one generator step per stream item, not per row),
    and with ``stats`` ScanProgress items; resumes after the last row handed
    out when a tablet splits or moves."""
    if limit is not None and limit < 0:
        raise InvalidArgument(f"row limit must be >= 0, not {limit}")
    fams = tuple(families) if families is not None else None
    info = await client._info(table)
    if fams is not None:
        for f in fams:
            if f not in info.schema.families:
                raise InvalidArgument(f"table {table!r} has no column family {f!r}")
    remaining = limit
    resume_after: bytes | None = None
    totals = _Totals() if stats else None
    loop = asyncio.get_running_loop()
    # A scan that keeps delivering rows may meet many splits and moves: the deadline
    # bounds the time without progress, not the scan.
    deadline = loop.time() + client.retry_deadline
    attempt = 0
    refresh = False
    while remaining is None or remaining > 0:
        try:
            items = _read_from(
                client, info, rs, resume_after, filter, remaining, fams, reverse, totals, refresh
            )
            async for item in items:
                if type(item) is not ScanProgress and remaining is not None:
                    item = cast(Sequence[Row], item)[:remaining]
                    if not item:
                        continue
                yield item
                attempt = 0
                deadline = loop.time() + client.retry_deadline
                if type(item) is ScanProgress:
                    # Rows up to the last one scanned need not be read again.
                    scanned = item.last_scanned
                    if scanned and (resume_after is None or scanned > resume_after):
                        resume_after = scanned
                    continue
                batch = cast(Sequence[Row], item)
                resume_after = batch[-1].key
                if remaining is not None:
                    remaining -= len(batch)
                    # With stats, the stream ends by itself (its limit is what was left)
                    # after one last ScanProgress: read it for the totals.
                    if remaining <= 0 and totals is None:
                        break
            break
        except (Unavailable, Indeterminate):
            # The tablet split or moved, or its worker stopped answering: a read is safe
            # to send again, so resume after the last row delivered.
            if loop.time() >= deadline:
                raise
            await asyncio.sleep(retry_pause(attempt))
            attempt += 1
            info = await client._info(table, refresh=True)
            # Read the table's locations again, but keep the cached ones should METADATA
            # not answer (LocationCache.tablets): dropping them all would stall every
            # request to the table's healthy tablets until METADATA is served.
            refresh = True
    if totals is not None:
        yield ScanProgress(b"", totals.rows, totals.cells)


async def _read_from(
    client: AsyncClient,
    info: TableInfo,
    rs: RowSet,
    resume_after: bytes | None,
    filter: RowFilter | None,
    limit: int | None,
    families: tuple[str, ...] | None,
    reverse: bool,
    totals: _Totals | None,
    refresh: bool = False,
) -> AsyncIterator[Sequence[Row] | ScanProgress]:
    if resume_after is not None:
        rs = _before(rs, resume_after) if reverse else _after(rs, resume_after)
    tablets = await client.locations.tablets(info.table_id, refresh=refresh)
    sent = 0
    for rec in reversed(tablets) if reverse else tablets:
        if limit is not None and sent >= limit:
            return
        part = rs.clip(rec.start_row, rec.end_row)
        if part.is_empty():
            continue
        if rec.location is None:
            raise NotServing(f"tablet {rec.tablet_id} has no location yet")
        req = ReadRowsRequest(
            info.table_id,
            rec.tablet_id,
            keys=tuple(part.keys),
            ranges=tuple(part.ranges),
            filter=filter,
            limit=None if limit is None else limit - sent,
            families=families,
            identity=client.identity,
            reverse=reverse,
            stats=totals is not None,
        )
        # Whole rows come in batches; a large row in pieces, handed out once complete.
        assembler = RowAssembler(rec.location)
        seen = ScanProgress(b"", 0, 0)  # this stream's counts so far
        async for item in client._worker(rec.location).read_rows(req):
            if type(item) is ScanProgress:
                if totals is not None:
                    totals.rows += item.rows_seen - seen.rows_seen
                    totals.cells += item.cells_seen - seen.cells_seen
                    seen = item
                    scanned = b"" if reverse else item.last_scanned
                    yield ScanProgress(scanned, totals.rows, totals.cells)
                continue
            rows = assembler.rows(item)
            if rows:
                sent += len(rows)
                yield rows
        assembler.finish()


def select_rows(
    start: bytes | None,
    end: bytes | None,
    prefix: bytes | None,
    keys: Iterable[bytes] | None,
    row_set: RowSet | None,
) -> RowSet:
    """The rows a read names, by exactly one of start/end, prefix, keys or a row set (none:
    the whole table)."""
    chosen = sum(x is not None for x in (prefix, keys, row_set)) + (
        1 if start is not None or end is not None else 0
    )
    if chosen > 1:
        raise InvalidArgument("choose rows by one of start/end, prefix, keys or row_set")
    if row_set is not None:
        return row_set
    if keys is not None:
        ks = list(keys)
        for k in ks:
            check_row_key(k)
        return RowSet(keys=ks)
    if prefix is not None:
        return RowSet(ranges=[RowRange.prefix(prefix)])
    return RowSet(ranges=[RowRange(start, end)])


def _after(rs: RowSet, key: bytes) -> RowSet:
    """The part of ``rs`` strictly after ``key`` (to resume a scan after a retry)."""
    tail = RowRange(key, None, start_inclusive=False)
    return RowSet(
        [k for k in rs.keys if k > key],
        [c for r in rs.ranges if (c := r.intersect(tail)) is not None],
    )


class _Totals:
    """Rows and cells a read has seen over all its streams (``AsyncTable.read_rows_with_stats``)."""

    __slots__ = ("cells", "rows")

    def __init__(self) -> None:
        self.rows = 0
        self.cells = 0


def _before(rs: RowSet, key: bytes) -> RowSet:
    """The part of ``rs`` strictly before ``key`` (to resume a reversed scan)."""
    head = RowRange(None, key)
    return RowSet(
        [k for k in rs.keys if k < key],
        [c for r in rs.ranges if (c := r.intersect(head)) is not None],
    )
