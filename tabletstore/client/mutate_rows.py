"""Sending row mutations to the tablets of their rows, across retries (§3 batches, §5.2).

What :meth:`AsyncTable.mutate_row <tabletstore.client.table.AsyncTable.mutate_row>` and
:meth:`~tabletstore.client.table.AsyncTable.mutate_rows` do once the mutations are validated
(as python-bigtable's ``_mutate_rows`` does for its table): :func:`send_batches` groups the
entries by tablet, sends one MutateRows request per tablet (of at most ``BATCH_REQUEST_BYTES``
of row mutations each), and sends again, after looking the tablets up again, the entries that
were certainly not applied or are idempotent, until none is left or the client's retry deadline
passes. Which errors say "not applied" is ``_refused_call``'s and ``_refused``'s to decide;
an entry that may have been applied at any attempt fails as ``Indeterminate``
(:class:`_Batch`). A single row goes through the client's write coalescer, when it has one,
and :func:`mutate_tablets` sends each coalesced group (``client/coalesce.py``) as one
``mutate_tablets`` request.

Failures are reported per entry: :class:`MutationError`, and :class:`MutationsFailed` raised
by ``mutate_rows`` after every entry was tried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tabletstore.client.backoff import retry_pause
from tabletstore.data.model import (
    DeleteCells,
    DeleteFamily,
    DeleteRow,
    Mutation,
    RowMutation,
    SetCell,
)
from tabletstore.data.validation import mutation_bytes
from tabletstore.errors import Closed, Fenced, Indeterminate, TabletStoreError, Unavailable
from tabletstore.limits import BATCH_REQUEST_BYTES
from tabletstore.metadata.record import TabletRecord
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.rpc.messages import MutateRowsRequest, MutateTabletsRequest, TabletMutations

if TYPE_CHECKING:
    from tabletstore.client.client import AsyncClient

__all__ = [
    "MutationError",
    "MutationsFailed",
    "PointWrite",
    "PointWriteErrors",
    "PointWriteKey",
    "mutate_tablets",
    "send_batches",
]

#: Row-mutation bytes (``mutations.mutation_bytes``) per MutateRows request: a batch is sent
#: in requests of about this size; one row mutation (at most ``MAX_MUTATION_BYTES``) always
#: fits a frame on its own.
_REQUEST_BYTES = BATCH_REQUEST_BYTES
#: The worker coalesced mutations go to, who sends them, and whether they write METADATA
#: (a request of its own, so that a principal refused METADATA writes fails those alone):
#: (worker address, identity, metadata).
PointWriteKey = tuple[str, str | None, bool]
#: One coalesced mutation: (table id, tablet id, row mutation).
PointWrite = tuple[str, str, RowMutation]
#: A coalesced mutation's outcome: its entry's error, or () if it was applied.
PointWriteErrors = tuple[TabletStoreError, ...]


@dataclass(frozen=True, slots=True)
class MutationError:
    """One failed entry of a batch: its index in the batch, its row and the error."""

    index: int
    row: bytes
    error: TabletStoreError


class MutationsFailed(TabletStoreError):
    """Some entries of a batch failed; the others were applied. ``.failures`` lists them."""

    def __init__(self, failures: list[MutationError], total: int) -> None:
        self.failures = failures
        first = failures[0]
        super().__init__(
            f"{len(failures)} of {total} row mutations failed; first: row "
            f"{first.row[:64]!r}: {type(first.error).__name__}: {first.error}"
        )
        self.may_have_applied = any(f.error.may_have_applied for f in failures)


def _refused_call(error: TabletStoreError) -> bool:
    """Whether an error a whole call failed with says nothing of it was applied and the tablet
    will be served again: a refusal or a request never sent (any Unavailable: the Transport
    contract), or a log fenced by the tablet's recovery (Fenced: the write is not durable).
    Retried after looking the tablet up again, whatever the mutation."""
    return isinstance(error, Unavailable | Fenced)


def _refused(error: type[TabletStoreError]) -> bool:
    """Whether an error a worker answered for one entry (or one call) says the mutation was
    certainly not applied *and* that the tablet will be served again, here or elsewhere: a
    split or an unload refusing writes (NotServing), a log that stopped or a lease about to
    end (Unavailable), a log fenced by the tablet's recovery (Fenced: the writes in the fenced
    segment were not made durable, commitlog/writer.py), a log closing as its worker stops
    (Closed). Retried after looking the tablet up again, whatever the mutation."""
    return issubclass(error, Unavailable | Fenced | Closed)


def _idempotent(mutations: Iterable[Mutation]) -> bool:
    # AddToCell and MergeToCell are not: applied twice, a sum counts twice.
    return all(
        isinstance(m, DeleteCells | DeleteFamily | DeleteRow)
        or (isinstance(m, SetCell) and m.timestamp is not None)
        for m in mutations
    )


class _Batch:
    """The outcome of each entry of a MutateRows batch across attempts (``send_batches``)."""

    def __init__(self, entries: Sequence[RowMutation]) -> None:
        self.entries = entries
        self.failures: list[MutationError] = []
        #: Entries an attempt may have applied (sent, no answer; or Indeterminate): if they
        #: end up failing, they fail as Indeterminate.
        self._ambiguous: dict[int, TabletStoreError] = {}
        #: Entries to send again.
        self._retry: set[int] = set()
        #: Why each entry sent again failed its latest attempt.
        self._last: dict[int, TabletStoreError] = {}

    def refused(self, indexes: list[int], error: TabletStoreError) -> None:
        """Certainly not applied by this attempt: send again."""
        for i in indexes:
            self._retry.add(i)
            self._last[i] = error

    def maybe_applied(self, indexes: list[int], error: TabletStoreError) -> None:
        """May have been applied: send again only if idempotent, else fail as Indeterminate."""
        for i in indexes:
            self._ambiguous[i] = error
            if _idempotent(self.entries[i].mutations):
                self._retry.add(i)
                self._last[i] = error
            else:
                self.failures.append(self._failure(i, error))

    def fail(self, indexes: list[int], error: TabletStoreError) -> None:
        """Not applied by this attempt, and sending it again would not help."""
        for i in indexes:
            self.failures.append(self._failure(i, error))

    def take_retries(self) -> list[int]:
        indexes = sorted(self._retry)
        self._retry = set()
        return indexes

    def give_up(self, indexes: list[int], error: TabletStoreError | None) -> None:
        """The deadline passed, or the tablets could not be found (``error``): each of
        ``indexes`` fails, a retryable reason reported as the deadline passing."""
        for i in indexes:
            why = error if error is not None else self._last.get(i)
            if why is None or _refused(type(why)) or why.may_have_applied:
                why = Unavailable(
                    f"row {self.entries[i].row[:64]!r}: tablet not served within the retry "
                    f"deadline (last: {type(why).__name__}: {why})"
                )
            self.failures.append(self._failure(i, why))

    def _failure(self, i: int, error: TabletStoreError) -> MutationError:
        row = self.entries[i].row
        earlier = self._ambiguous.get(i)
        if earlier is not None and not isinstance(error, Indeterminate):
            # This attempt was not applied (or got no answer), but an earlier one may have been.
            error = Indeterminate(
                f"the mutation of row {row[:64]!r} may have been applied: "
                f"{type(earlier).__name__}: {earlier}; then {type(error).__name__}: {error}"
            )
        return MutationError(i, row, error)


async def send_batches(
    client: AsyncClient,
    table: str,
    entries: Sequence[RowMutation],
    indexes: list[int],
    *,
    first: list[tuple[TabletRecord, list[int]]] | None = None,
) -> list[MutationError]:
    """Send ``entries[i]`` for each of ``indexes``, one MutateRows request per tablet, and
    send again, after looking the tablets up again, the entries that were certainly not
    applied (refused, never sent) or are idempotent, until none is left or the deadline
    passes. Returns the entries that failed, an entry that may have been applied (at any
    attempt) as Indeterminate. ``first``: the first attempt's groups, if the caller knows
    them (from the location cache)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + client.retry_deadline
    batch = _Batch(entries)
    refresh = False
    attempt = 0
    while indexes:
        if first is not None:
            groups, first = first, None
        else:
            try:
                groups = await _group(
                    client, table, entries, indexes, refresh=refresh, deadline=deadline
                )
            except TabletStoreError as exc:
                # No location within the deadline (or the table is gone): what is left
                # fails.
                batch.give_up(indexes, exc)
                break
        sends = [
            _send(client, batch, rec, part)
            for rec, idx in groups
            for part in (_by_size(entries, idx) if len(idx) > 1 else (idx,))
        ]
        if len(sends) == 1:
            await sends[0]  # one request (a single row, say): no task of its own
        else:
            await asyncio.gather(*sends)
        indexes = batch.take_retries()
        if indexes:
            if loop.time() >= deadline:
                batch.give_up(indexes, None)
                break
            refresh = True
            await asyncio.sleep(retry_pause(attempt))
            attempt += 1
    return batch.failures


async def _group(
    client: AsyncClient,
    table: str,
    entries: Sequence[RowMutation],
    indexes: list[int],
    *,
    refresh: bool,
    deadline: float,
) -> list[tuple[TabletRecord, list[int]]]:
    """The entries by the tablet holding their row (looked up again with ``refresh``)."""
    info = await client._info(table, refresh=refresh)
    groups: dict[str, tuple[TabletRecord, list[int]]] = {}
    # With refresh, each tablet's location is read again once, whatever the number of its
    # rows here (a failed read keeps the cached entry: LocationCache.locate).
    refreshed: list[TabletRecord] = []
    last: TabletRecord | None = None
    for i in indexes:
        row = entries[i].row
        if not refresh and last is not None and last.contains(row):
            rec = last  # the row's neighbour's tablet (batches are often in key order)
        else:
            again = refresh and not any(r.contains(row) for r in refreshed)
            rec = await client._locate(info.table_id, row, refresh=again, deadline=deadline)
            if again:
                refreshed.append(rec)
            last = rec
        groups.setdefault(rec.tablet_id, (rec, []))[1].append(i)
    return list(groups.values())


async def _send(client: AsyncClient, batch: _Batch, rec: TabletRecord, idx: list[int]) -> None:
    """One MutateRows request to ``rec``'s worker; outcomes recorded in ``batch``."""
    entries = batch.entries
    assert rec.location is not None
    try:
        if len(idx) == 1 and client._point_writes is not None:
            # One row (mutate_row): shares a request with others to this worker.
            key = (rec.location, client.identity, rec.table_id == METADATA_TABLE_ID)
            write = (rec.table_id, rec.tablet_id, entries[idx[0]])
            errors = [(0, e) for e in await client._point_writes.submit(key, write)]
        else:
            req = MutateRowsRequest(
                rec.table_id, rec.tablet_id, tuple(entries[i] for i in idx), client.identity
            )
            resp = await client._worker(rec.location).mutate_rows(req)
            errors = [(e.index, e.exception()) for e in resp.errors]
    except Indeterminate as exc:
        # Sent, no answer: the owner may be dead or moved (forget where this tablet was);
        # any entry may have been applied.
        client.locations.invalidate(rec.table_id, rec.start_row)
        batch.maybe_applied(idx, exc)
        return
    except TabletStoreError as exc:
        if _refused_call(exc):
            batch.refused(idx, exc)  # refused or never sent: none was applied
        else:
            # Refused as a whole for another reason (a malformed request): none applied.
            batch.fail(idx, exc)
        return
    for index, error in errors:
        i = idx[index]
        if _refused(type(error)):
            batch.refused([i], error)
        elif isinstance(error, Indeterminate):
            batch.maybe_applied([i], error)
        else:
            batch.fail([i], error)


async def mutate_tablets(
    client: AsyncClient, key: PointWriteKey, writes: list[PointWrite]
) -> list[PointWriteErrors]:
    """One ``mutate_tablets`` request for the single-row mutations of one worker
    (the client's write coalescer), whatever their tablets: for each caller, its entry's error
    (``(error,)``: a tablet that moved fails its own callers only) or ``()`` if it was
    applied. An error of the whole call is raised (to every caller)."""
    location, identity, _ = key
    parts: dict[tuple[str, str], list[int]] = {}
    for i, (table_id, tablet_id, _) in enumerate(writes):
        parts.setdefault((table_id, tablet_id), []).append(i)
    resp = await client._worker(location).mutate_tablets(
        MutateTabletsRequest(
            tuple(
                TabletMutations(table_id, tablet_id, tuple(writes[i][2] for i in idx))
                for (table_id, tablet_id), idx in parts.items()
            ),
            identity,
        )
    )
    order = [i for idx in parts.values() for i in idx]  # the wire's entry index -> writes'
    outcome: list[PointWriteErrors] = [()] * len(writes)
    for e in resp.errors:
        if not 0 <= e.index < len(order):
            raise Indeterminate(
                f"{location} answered an error for entry {e.index} of {len(order)} "
                "of mutate_tablets"
            )
        outcome[order[e.index]] = (e.exception(),)
    return outcome


def _by_size(entries: Sequence[RowMutation], indexes: list[int]) -> list[list[int]]:
    """``indexes`` cut into requests of at most ``_REQUEST_BYTES`` of row mutations each (a
    larger entry alone), so a batch of any size fits the frames that carry it."""
    parts: list[list[int]] = [[]]
    size = 0
    for i in indexes:
        entry = entries[i]
        n = mutation_bytes(entry.row, entry.mutations)
        if parts[-1] and size + n > _REQUEST_BYTES:
            parts.append([])
            size = 0
        parts[-1].append(i)
        size += n
    return parts
