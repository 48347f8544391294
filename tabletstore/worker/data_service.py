"""The data service of a tablet server: the reads and writes clients send (§3, §5.3).

The request handlers of ``rpc.services.TabletService`` that read and write rows — row
mutations (one tablet's batch, or the coalesced single-row mutations of several tablets),
streamed scans, point reads (one tablet's keys, or several tablets' in one reply),
check-and-mutate, read-modify-write and ``sample_row_keys``. Each finds its tablet through
:meth:`TabletServer.tablet <tabletstore.worker.tablet_server.TabletServer.tablet>`, which answers
``NotServing`` for a tablet not served here or a worker whose lease may have expired (fencing
rule 1, for reads too), and does the rest through the tablet (``engine.tablet``). The server's
lifecycle — lease, commit log, claims, loads, splits — is ``worker/tablet_server.py``'s; the
control requests are ``worker/admin_service.py``'s.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from tabletstore.data.model import Row
from tabletstore.data.query import RowSet
from tabletstore.engine.scan_stats import ScanStats
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import InvalidArgument, PermissionDenied, TabletStoreError
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import (
    CheckAndMutateRequest,
    CheckAndMutateResponse,
    EntryError,
    LargeRow,
    MutateRowsRequest,
    MutateRowsResponse,
    MutateTabletsRequest,
    PointReadsRequest,
    PointReadsResponse,
    ReadModifyWriteRequest,
    ReadRowsRequest,
    RowBatch,
    RowPiece,
    SampleRowKeysRequest,
    SampleRowKeysResponse,
    ScanProgress,
    TabletMutations,
)
from tabletstore.rpc.row_pieces import STREAM_ITEM_BYTES, UNARY_ROW_BYTES, row_bytes, split_row
from tabletstore.worker.eager_gather import gather_eager
from tabletstore.worker.tablet_service_guard import may_see_keys

if TYPE_CHECKING:
    from tabletstore.worker.tablet_server import TabletServer

__all__ = ["DataService"]

#: Rows per streamed item of a scan, and a byte bound on one item: a larger row goes alone,
#: in pieces of about that size (rpc.row_pieces).
_ROWS_PER_BATCH = 256
_BYTES_PER_BATCH = STREAM_ITEM_BYTES


def _progress(stats: ScanStats) -> ScanProgress:
    return ScanProgress(stats.last_scanned or b"", stats.rows_seen, stats.cells_seen)


class DataService:
    """The data requests of ``TabletService``, served from one tablet server's tablets."""

    def __init__(self, server: TabletServer) -> None:
        # The bound lookup itself, not the server: one attribute load per request, as when
        # the handlers were the server's own methods.
        self._tablet = server.tablet

    async def mutate_rows(self, req: MutateRowsRequest) -> MutateRowsResponse:
        """Apply each row mutation atomically; report failures per entry (§3 batches)."""
        tablet = self._tablet(req.table_id, req.tablet_id)

        async def one(i: int) -> EntryError | None:
            entry = req.entries[i]
            try:
                await tablet.apply(entry.row, entry.mutations, identity=req.identity)
            except TabletStoreError as exc:
                return EntryError.of(i, exc)
            return None

        if len(req.entries) == 1:
            error = await one(0)
            return MutateRowsResponse(() if error is None else (error,))
        # One commit-log append for the whole batch (its records share segments).
        try:
            errors = await tablet.apply_many(
                [(e.row, e.mutations) for e in req.entries], identity=req.identity
            )
        except TabletStoreError as exc:  # nothing was applied
            errors = [exc] * len(req.entries)
        return MutateRowsResponse(
            tuple(EntryError.of(i, e) for i, e in enumerate(errors) if e is not None)
        )

    async def mutate_tablets(self, req: MutateTabletsRequest) -> MutateRowsResponse:
        """The single-row mutations of several tablets (a cluster client's concurrent
        ``mutate_row`` calls to this worker's tablets, client/coalesce.py) in one request: each
        part applied as ``mutate_rows`` would, all parts concurrently, so their records share
        the worker's commit-log segments (§5.3 group commit); each row is acknowledged only once
        durable. A part refused as a whole (its tablet not served here: moved, split) fails
        only its own entries, which its callers retry. Entry indexes count the parts' entries
        one after another."""
        applies = [self._apply_part(part, req.identity) for part in req.parts]
        found = [await applies[0]] if len(applies) == 1 else await gather_eager(applies)
        errors: list[EntryError] = []
        base = 0
        for part, got in zip(req.parts, found, strict=True):
            if isinstance(got, BaseException):
                # Not a refusal of the part (those are answered in it): the request fails, as
                # mutate_rows' would; the client treats every entry as maybe applied.
                raise got
            for i, error in enumerate(got):
                if error is not None:
                    errors.append(EntryError.of(base + i, error))
            base += len(part.entries)
        return MutateRowsResponse(tuple(errors))

    async def _apply_part(
        self, part: TabletMutations, identity: str | None
    ) -> Sequence[TabletStoreError | None]:
        """One part of ``mutate_tablets``: per entry, None once applied and durable, or its
        error; a tablet not served here (or refusing writes as a whole) fails every entry."""
        try:
            tablet = self._tablet(part.table_id, part.tablet_id)
            if len(part.entries) == 1:
                entry = part.entries[0]
                await tablet.apply(entry.row, entry.mutations, identity=identity)
                return (None,)
            return await tablet.apply_many(
                [(e.row, e.mutations) for e in part.entries], identity=identity
            )
        except TabletStoreError as exc:  # nothing of the part was applied
            return [exc] * len(part.entries)

    async def read_rows(
        self, req: ReadRowsRequest
    ) -> AsyncIterator[RowBatch | RowPiece | ScanProgress]:
        """Stream the requested rows of one tablet in key order (descending when
        ``req.reverse``), in items of bounded size:
        whole rows in batches, a row larger than one item alone in pieces (rpc.row_pieces)."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        families = set(req.families) if req.families is not None else None
        remaining = req.limit
        batch: list[Row] = []
        size = 0
        stats = ScanStats() if req.stats else None
        async for row in self._rows(tablet, req, families, stats):
            if type(row) is ScanStats:
                # Rows before the report go first: progress never overtakes a row.
                if batch:
                    yield RowBatch(tuple(batch))
                    batch, size = [], 0
                yield _progress(row)
                continue
            assert isinstance(row, Row)
            if remaining is not None:
                remaining -= 1
            row_size = row_bytes(row)
            if row_size > _BYTES_PER_BATCH:
                if batch:
                    yield RowBatch(tuple(batch))
                    batch, size = [], 0
                for piece in split_row(row, _BYTES_PER_BATCH):
                    yield piece
            else:
                batch.append(row)
                size += row_size
                if len(batch) >= _ROWS_PER_BATCH or size >= _BYTES_PER_BATCH:
                    yield RowBatch(tuple(batch))
                    batch, size = [], 0
            if remaining is not None and remaining <= 0:
                break
        if batch:
            yield RowBatch(tuple(batch))
        if stats is not None:
            yield _progress(stats)

    async def _rows(
        self,
        tablet: Tablet,
        req: ReadRowsRequest,
        families: set[str] | None,
        stats: ScanStats | None = None,
    ) -> AsyncIterator[Row | ScanStats]:
        """The request's keys and ranges, visited in key order (RowSet's normal form), or in
        descending order when ``req.reverse``."""
        pieces = RowSet(req.keys, req.ranges).pieces()
        for piece in reversed(list(pieces)) if req.reverse else pieces:
            if isinstance(piece, bytes):
                if not tablet.contains(piece):
                    continue
                row = await tablet.read_row(
                    piece, filter=req.filter, families=families, identity=req.identity, stats=stats
                )
                if row is not None:
                    yield row
            elif stats is None:
                async for row in tablet.scan(
                    piece,
                    filter=req.filter,
                    families=families,
                    identity=req.identity,
                    reverse=req.reverse,
                ):
                    yield row
            else:
                async for item in tablet.scan_with_progress(
                    piece,
                    stats,
                    filter=req.filter,
                    families=families,
                    identity=req.identity,
                    reverse=req.reverse,
                ):
                    yield item

    async def read_row(self, req: ReadRowsRequest) -> RowBatch | LargeRow:
        """Point reads (``req.keys``: one, or the concurrent reads of a cluster client,
        client/coalesce.py) answered in one reply: no stream to set up. Each row is read
        atomically on its own; the reply holds those that have (matching) cells, in the order
        of ``req.keys``. Rows too large together for one reply are answered ``LargeRow``:
        the client reads each alone, streaming one that is still too large."""
        rows = await self._point_rows(req)
        size = sum(row_bytes(row) for row in rows)
        return RowBatch(rows) if size <= UNARY_ROW_BYTES else LargeRow(rows[0].key, size)

    async def read_points(self, req: PointReadsRequest) -> PointReadsResponse:
        """The plain point reads of several tablets (a cluster client's concurrent reads of
        this worker's tablets, client/coalesce.py) in one reply: each part answered as
        ``read_row`` would, all parts concurrently, or with its own error (a tablet not
        served here any more fails its own callers only). Parts past ``UNARY_ROW_BYTES`` in
        all are answered ``LargeRow``, so the reply stays as bounded as ``read_row``'s."""
        reads = [
            self._point_rows(
                ReadRowsRequest(
                    part.table_id, part.tablet_id, keys=part.keys, identity=req.identity
                )
            )
            for part in req.parts
        ]
        found: list[tuple[Row, ...] | BaseException]
        if len(reads) == 1:  # one tablet: no concurrency to add around it
            try:
                found = [await reads[0]]
            except TabletStoreError as exc:
                found = [exc]
        else:
            found = await gather_eager(reads)
        answers: list[RowBatch | LargeRow | EntryError] = []
        budget = UNARY_ROW_BYTES
        for i, got in enumerate(found):
            if isinstance(got, TabletStoreError):
                answers.append(EntryError.of(i, got))
                continue
            if isinstance(got, BaseException):
                raise got  # not a refusal of the part: the request fails, as read_row's would
            size = sum(row_bytes(row) for row in got)
            if size <= budget:
                budget -= size
                answers.append(RowBatch(got))
            else:
                answers.append(LargeRow(got[0].key, size))
        return PointReadsResponse(tuple(answers))

    async def _point_rows(self, req: ReadRowsRequest) -> tuple[Row, ...]:
        """``read_row``'s rows: each key read atomically on its own, concurrently (a read
        from the store must not wait for the others' reads, and one from memory runs inline,
        with no task: worker/eager_gather.py). One that fails (a key outside the tablet after
        a split) fails the request: each caller's client retries its own read."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        if not req.keys or req.ranges:
            raise InvalidArgument("read_row takes one or more row keys and no ranges")
        families = set(req.families) if req.families is not None else None
        if len(req.keys) == 1:
            row = await tablet.read_row(
                req.keys[0], filter=req.filter, families=families, identity=req.identity
            )
            return () if row is None else (row,)
        found = await gather_eager(
            [
                tablet.read_row(key, filter=req.filter, families=families, identity=req.identity)
                for key in req.keys
            ]
        )
        for got in found:
            if isinstance(got, BaseException):
                raise got
        return tuple(row for row in found if isinstance(row, Row))

    async def check_and_mutate(self, req: CheckAndMutateRequest) -> CheckAndMutateResponse:
        tablet = self._tablet(req.table_id, req.tablet_id)
        matched = await tablet.check_and_mutate(
            req.row,
            req.predicate,
            req.true_mutations,
            req.false_mutations,
            identity=req.identity,
        )
        return CheckAndMutateResponse(matched)

    async def read_modify_write(self, req: ReadModifyWriteRequest) -> Row:
        tablet = self._tablet(req.table_id, req.tablet_id)
        return await tablet.read_modify_write(req.row, req.rules, identity=req.identity)

    async def sample_row_keys(self, req: SampleRowKeysRequest) -> SampleRowKeysResponse:
        """Keys that split the tablet into parts of roughly equal size (SSTable boundaries).
        Row keys are data: a caller that may read none of the table's families is refused
        (PermissionDenied)."""
        tablet = self._tablet(req.table_id, req.tablet_id)
        principal = current_principal()
        if not may_see_keys(principal, tablet):
            assert principal is not None
            raise PermissionDenied(
                f"{principal.name} may not sample the row keys of table {tablet.schema.name!r}: "
                "it may read none of its families (permission: read)"
            )
        record = tablet.record
        keys: list[bytes] = []
        offsets: list[int] = []
        offset = 0
        refs = sorted(
            (ref for refs in record.sstables.values() for ref in refs), key=lambda r: r.last_row
        )
        for ref in refs:
            offset += ref.size
            keys.append(ref.last_row)
            offsets.append(offset)
        if record.end_row is not None:
            keys.append(record.end_row)
        else:
            keys.append(b"")
        offsets.append(offset + tablet.state.memtable.approximate_size)
        return SampleRowKeysResponse(tuple(keys), tuple(offsets))
