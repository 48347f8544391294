"""A table's data API (§3): row mutations, single-row transactions, reads and scans.

An :class:`AsyncTable` comes from its client (``client.table(name)``, ``create_table``; happybase's
shape: factories, not constructors) and knows only its name: each call validates its request
against the table's schema and sends it to the worker serving the row's tablet, through the
client's location cache and retries (``client/client.py``). Sending mutations across retries is
``client/mutate_rows.py``'s, reading rows ``client/read_rows.py``'s; the single-row transactions
(check-and-mutate, read-modify-write) are never sent twice (``AsyncClient._with_retry`` with
``safe=False``).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator, Iterable, Sequence
from typing import TYPE_CHECKING, cast

from tabletstore.client import change_stream
from tabletstore.client.backoff import retry_pause
from tabletstore.client.change_plan import ChangePartition
from tabletstore.client.change_stream import ChangeItem
from tabletstore.client.mutate_rows import MutationError, MutationsFailed, send_batches
from tabletstore.client.read_rows import point_read, read_batches, read_one, select_rows
from tabletstore.clock import SystemClock
from tabletstore.data.filters import RowFilter
from tabletstore.data.model import Mutation, ReadModifyWriteRule, Row, RowMutation
from tabletstore.data.query import RowSet
from tabletstore.data.validation import (
    check_replica_write,
    check_row_key,
    validate_row_mutation,
)
from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    NotServing,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.metadata.snapshot import SnapshotManifest
from tabletstore.rpc.messages import (
    CheckAndMutateRequest,
    LargeRow,
    ReadModifyWriteRequest,
    RowBatch,
    SampleRowKeysRequest,
    ScanProgress,
)

if TYPE_CHECKING:
    from tabletstore.client.client import AsyncClient

__all__ = ["AsyncTable"]


class AsyncTable:
    """One table's data API (§3)."""

    def __init__(self, client: AsyncClient, name: str) -> None:
        self._client = client
        self.name = name

    # ------------------------------------------------------------------ writes

    async def mutate_row(self, row: bytes, mutations: Sequence[Mutation]) -> None:
        """Apply mutations to one row atomically (§2). A split, move or recovery of the tablet
        is retried within the client's deadline (``client/client.py``'s docstring says how)."""
        muts = tuple(mutations)
        client = self._client
        info = client._tables.get(self.name) or await client._info(self.name)
        try:
            validate_row_mutation(info.schema, row, muts, client.identity)
        except (PreconditionFailed, Unavailable):
            # The replication write policy refused it: the table may have been promoted (or
            # made a replica) since its schema was cached; the master's word decides.
            info = await client._info(self.name, refresh=True)
            validate_row_mutation(info.schema, row, muts, client.identity)
        # With the row's tablet in the cache (nearly always), the first attempt goes straight
        # to it, without the batch path's lookups; what it leaves to retry is retried there.
        rec = client.locations.cached(info.table_id, row)
        first = [(rec, [0])] if rec is not None and rec.location is not None else None
        failures = await send_batches(
            client, self.name, (RowMutation(row, muts),), [0], first=first
        )
        if failures:
            raise failures[0].error

    async def mutate_rows(self, entries: Sequence[RowMutation]) -> None:
        """Apply many row mutations, each atomic on its own (§3). Entries go to their tablets
        in one request per tablet, concurrently; failures are reported per entry by raising
        :class:`MutationsFailed` after every entry was tried."""
        if not entries:
            return
        info = await self._client._info(self.name)
        try:
            check_replica_write(info.schema, self._client.identity)
        except (PreconditionFailed, Unavailable):
            info = await self._client._info(self.name, refresh=True)  # as mutate_row does
        failures: list[MutationError] = []
        pending: list[int] = []
        for i, e in enumerate(entries):
            try:
                validate_row_mutation(info.schema, e.row, e.mutations, self._client.identity)
                pending.append(i)
            except TabletStoreError as exc:
                failures.append(MutationError(i, e.row, exc))
        failures.extend(await send_batches(self._client, self.name, entries, pending))
        if failures:
            failures.sort(key=lambda f: f.index)
            raise MutationsFailed(failures, len(entries))

    async def check_and_mutate_row(
        self,
        row: bytes,
        predicate: RowFilter | None,
        *,
        true_mutations: Sequence[Mutation] = (),
        false_mutations: Sequence[Mutation] = (),
    ) -> bool:
        """Single-row transaction: apply ``true_mutations`` if the predicate matches any cell
        of the row, else ``false_mutations``. Returns whether it matched."""
        check_row_key(row)
        if not true_mutations and not false_mutations:
            raise InvalidArgument("check-and-mutate needs true or false mutations")
        resp = await self._client._with_retry(
            self.name,
            row,
            "check-and-mutate",
            lambda w, i, r: w.check_and_mutate(
                CheckAndMutateRequest(
                    i.table_id,
                    r.tablet_id,
                    row,
                    predicate,
                    tuple(true_mutations),
                    tuple(false_mutations),
                    self._client.identity,
                )
            ),
            safe=False,
        )
        return resp.matched

    async def read_modify_write_row(self, row: bytes, rules: Sequence[ReadModifyWriteRule]) -> Row:
        """Atomically append to / increment columns of one row; returns the new values."""
        check_row_key(row)
        return await self._client._with_retry(
            self.name,
            row,
            "read-modify-write",
            lambda w, i, r: w.read_modify_write(
                ReadModifyWriteRequest(
                    i.table_id, r.tablet_id, row, tuple(rules), self._client.identity
                )
            ),
            safe=False,
        )

    # ------------------------------------------------------------------ reads

    async def read_row(
        self, row: bytes, *, filter: RowFilter | None = None, families: Iterable[str] | None = None
    ) -> Row | None:
        """One row, or None if it has no (matching) cells. One unary request to the worker
        serving the row (no stream), retried transparently when the tablet moved."""
        check_row_key(row)
        fams = tuple(families) if families is not None else None
        client = self._client
        if fams is not None:
            info = await client._info(self.name)
            for f in fams:
                if f not in info.schema.families:
                    raise InvalidArgument(f"table {self.name!r} has no column family {f!r}")
        point_reads = client._point_reads
        if point_reads is not None and filter is None and fams is None:
            # A plain point read shares a request with others to this worker.
            got = await point_read(client, self.name, point_reads, row)
            if type(got) is not LargeRow:
                return cast(Row | None, got)
        reply = await read_one(client, self.name, row, filter, fams)
        if type(reply) is LargeRow:
            # Too large for one reply: read it again as a stream, which carries it in pieces
            # (one read of the row, so still atomic; the unary answer held none of it).
            async for whole in self.read_rows(keys=(row,), filter=filter, families=fams):
                return whole
            return None
        assert isinstance(reply, RowBatch)
        return reply.rows[0] if reply.rows else None

    async def read_rows(
        self,
        *,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        keys: Iterable[bytes] | None = None,
        row_set: RowSet | None = None,
        filter: RowFilter | None = None,
        limit: int | None = None,
        families: Iterable[str] | None = None,
        reverse: bool = False,
    ) -> AsyncIterator[Row]:
        """Rows in key order, streamed tablet by tablet; in descending key order when
        ``reverse`` (the last tablet first; ``limit`` then takes the highest keys).

        Choose rows by ``start``/``end`` (end exclusive), ``prefix``, explicit ``keys``, or a
        ``row_set``; no selection means the whole table. ``limit`` bounds the number of rows.
        """
        rs = select_rows(start, end, prefix, keys, row_set)
        async for batch in read_batches(
            self._client, self.name, rs, filter, limit, families, reverse, stats=False
        ):
            for row in cast(Sequence[Row], batch):
                yield row

    async def read_rows_with_stats(
        self,
        *,
        start: bytes | None = None,
        end: bytes | None = None,
        prefix: bytes | None = None,
        keys: Iterable[bytes] | None = None,
        row_set: RowSet | None = None,
        filter: RowFilter | None = None,
        limit: int | None = None,
        families: Iterable[str] | None = None,
        reverse: bool = False,
    ) -> AsyncIterator[Row | ScanProgress]:
        """:meth:`read_rows`, with :class:`ScanProgress` items among the rows: the rows and
        cells seen so far (before the filter, over the whole read) and, for forward scans, the
        last row key scanned -- after every long run of rows the filter removed and once per
        tablet. The last item is always a ScanProgress with the read's totals."""
        rs = select_rows(start, end, prefix, keys, row_set)
        async for item in read_batches(
            self._client, self.name, rs, filter, limit, families, reverse, stats=True
        ):
            if type(item) is ScanProgress:
                yield item
            else:
                for row in cast(Sequence[Row], item):
                    yield row

    async def snapshot(self, *, ttl: float | None = None) -> SnapshotManifest:
        """:meth:`AsyncClient.snapshot` of this table."""
        return await self._client.snapshot(self.name, ttl=ttl)

    async def bulk_load(self, url: str, *, load_id: str | None = None) -> tuple[int, int]:
        """:meth:`AsyncClient.bulk_load` into this table."""
        return await self._client.bulk_load(self.name, url, load_id=load_id)

    # ------------------------------------------------------------------ change streams

    async def change_partitions(self) -> list[ChangePartition]:
        """The partitions of this table's change stream now (its tablets' row ranges)."""
        return await change_stream.change_partitions(self._client.catalog, self.name)

    async def read_changes(
        self,
        partition: ChangePartition | None = None,
        *,
        tokens: Sequence[str] = (),
        start_time: float | None = None,
        end_time: float | None = None,
        poll: float = 0.5,
        heartbeat: float = 2.0,
    ) -> AsyncIterator[ChangeItem]:
        """Follow one partition of this table's change stream (a table with a change
        retention): every committed row mutation as a ``Change`` with its row, commit time,
        order within the row and a token resuming after it; ``Heartbeat`` items with the low
        watermark; last, a ``PartitionEnd`` naming the partitions that replace it after a
        split or merge. From ``tokens`` (one, or those of every partition a merged one
        replaces), else from ``start_time`` (default now), until the watermark passes
        ``end_time`` (default: never). Read from the bucket's commit log, not the workers
        (``client/change_stream.py``)."""
        async with self._client._database_store() as store:
            async for item in change_stream.read_changes(
                store,
                self._client.catalog,
                self.name,
                partition,
                tokens=tokens,
                start_time=start_time,
                end_time=end_time,
                poll=poll,
                heartbeat=heartbeat,
                clock=SystemClock(),
                cache=self._client.change_segments,
            ):
                yield item

    async def follow_changes(
        self,
        *,
        start_time: float | None = None,
        end_time: float | None = None,
        poll: float = 0.5,
        heartbeat: float = 2.0,
    ) -> AsyncIterator[tuple[ChangePartition, ChangeItem]]:
        """:meth:`read_changes` of every partition at once, and of the partitions that
        replace them after splits and merges: (partition, item) pairs as they come."""
        since = SystemClock().time() if start_time is None else start_time

        def read(part: ChangePartition, tokens: Sequence[str]) -> AsyncIterator[ChangeItem]:
            return self.read_changes(
                part,
                tokens=tokens,
                start_time=None if tokens else since,
                end_time=end_time,
                poll=poll,
                heartbeat=heartbeat,
            )

        async for pair in change_stream.follow(await self.change_partitions(), read):
            yield pair

    async def sample_row_keys(self) -> list[tuple[bytes, int]]:
        """(row key, approximate bytes up to it) pairs that split the table evenly-ish.
        Asked again from the start, within the retry deadline, when a tablet split or moved
        meanwhile."""
        client = self._client
        loop = asyncio.get_running_loop()
        deadline = loop.time() + client.retry_deadline
        for attempt in itertools.count():
            try:
                return await self._sample_row_keys()
            except (Unavailable, Indeterminate):
                if loop.time() >= deadline:
                    raise
            await asyncio.sleep(retry_pause(attempt))
        raise AssertionError("unreachable")

    async def _sample_row_keys(self) -> list[tuple[bytes, int]]:
        client = self._client
        info = await client._info(self.name)
        out: list[tuple[bytes, int]] = []
        base = 0
        for rec in await client.locations.tablets(info.table_id, refresh=True):
            if rec.location is None:
                raise NotServing(f"tablet {rec.tablet_id} has no location yet")
            resp = await client._worker(rec.location).sample_row_keys(
                SampleRowKeysRequest(info.table_id, rec.tablet_id)
            )
            for key, off in zip(resp.keys, resp.offsets, strict=True):
                out.append((key, base + off))
            base += resp.offsets[-1] if resp.offsets else 0
        return out
