"""Taking a snapshot of a table: the master's side of reading ``tabletstore.batch`` (§8).

Bulk loads, the output side, are master/bulk_load.py.

The cut. A snapshot is "as of one instant": every write acknowledged before it is in, none
that started after it. Sequence numbers are per worker, so no one number names an instant
across a table's tablets; the cut is taken in two phases instead:

1. ``snapshot_hold`` to every worker serving a tablet of the table, concurrently: each of
   its tablets stops letting writes take sequence numbers (they wait; none is refused),
   waits for the writes already past that point, and records its *mark*, the largest seq of
   any of its cells (``Tablet.hold_for_snapshot``). A tablet's cells are totally ordered by
   seq (a tablet loaded on another worker advances that worker's sequence past its cells),
   so "seq <= mark" is exactly "written before the hold".
2. Once every worker holds, ``snapshot_write`` to each: the hold ends at once, then the
   worker writes what the memtables held at the cut as SSTables for the snapshot.

The instant T after the last hold began and before the first one ended is the cut: a write
acknowledged before T has a seq <= its tablet's mark (it finished before, or could not start
after, the hold); a write started after T has a larger one. Writes wait only for the round
trip between the phases, never for I/O of a compaction. A hold that timed out before phase 2
(``held`` false) voids the cut, and the snapshot is taken again.

The manifest lists, per tablet, the SSTables at the cut plus the snapshot's own memtable
SSTables, and the mark; the reader drops cells with a larger seq (engine/iterators.py
``snapshot_seq``). GC keeps what it names (master/gc_plan.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from tabletstore.clock import Clock
from tabletstore.errors import InvalidArgument, NotServing, Unavailable, Unreachable
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.metadata.snapshot import (
    SnapshotManifest,
    TabletSnapshot,
    new_snapshot_id,
    write_manifest,
)
from tabletstore.rpc.messages import (
    SnapshotHoldRequest,
    SnapshotWriteRequest,
    SnapshotWriteResponse,
)
from tabletstore.rpc.services import TabletService
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["HOLD_SECONDS", "cut_table", "take_snapshot"]

log = logging.getLogger(__name__)

#: The longest a tablet holds writes for a snapshot's cut if phase 2 never comes.
HOLD_SECONDS = 5.0
_ATTEMPTS = 5

#: (table id, tablet id) -> address of the worker serving it; raises if one is not served.
Locate = Callable[[list[TabletRecord]], Awaitable[Mapping[str, str]]]


async def take_snapshot(
    *,
    info: TableInfo,
    catalog: Catalog,
    worker: Callable[[str], TabletService],
    store: ObjectStore,
    clock: Clock,
    locate: Locate,
    ttl: float | None = None,
) -> SnapshotManifest:
    """Take a snapshot of the table ``info`` and write its manifest (module docstring)."""
    if ttl is not None and ttl <= 0:
        raise InvalidArgument(f"a snapshot's TTL must be > 0 seconds, got {ttl}")
    manifest = await cut_table(
        info=info, catalog=catalog, worker=worker, store=store, clock=clock, locate=locate, ttl=ttl
    )
    await write_manifest(store, manifest)
    return manifest


async def cut_table(
    *,
    info: TableInfo,
    catalog: Catalog,
    worker: Callable[[str], TabletService],
    store: ObjectStore,
    clock: Clock,
    locate: Locate,
    ttl: float | None = None,
) -> SnapshotManifest:
    """Take the table's cut (module docstring) without writing a snapshot manifest: backups
    and clones (master/backups.py) keep it their own way. Every SSTable the returned
    manifest names holds only cells at or below its tablet's ``cut_seq``. The memtables'
    SSTables it wrote are named by nothing yet: the caller must make something name them
    well within GC's grace period."""
    error: Exception | None = None
    for attempt in range(_ATTEMPTS):
        try:
            manifest = await _attempt(info, catalog, worker, store, clock, locate, ttl)
        except (NotServing, Unavailable, Unreachable) as exc:
            # A split, a move or a tablet being loaded: the next attempt sees the new tablets.
            log.info("snapshot of %s: attempt %d failed: %s", info.schema.name, attempt, exc)
            error = exc
            await asyncio.sleep(0.05 * 2**attempt)
            continue
        return manifest
    raise Unavailable(f"could not take a snapshot of table {info.schema.name!r}: {error}")


async def _attempt(
    info: TableInfo,
    catalog: Catalog,
    worker: Callable[[str], TabletService],
    store: ObjectStore,
    clock: Clock,
    locate: Locate,
    ttl: float | None,
) -> SnapshotManifest:
    records = await catalog.list_tablets(info.table_id)
    where = await locate(records)
    by_worker: dict[str, list[str]] = {}
    for rec in records:
        by_worker.setdefault(where[rec.tablet_id], []).append(rec.tablet_id)
    snapshot_id = new_snapshot_id(clock.time())
    holds = await asyncio.gather(
        *(
            worker(addr).snapshot_hold(
                SnapshotHoldRequest(snapshot_id, info.table_id, tuple(ids), HOLD_SECONDS)
            )
            for addr, ids in by_worker.items()
        ),
        return_exceptions=True,
    )
    created_at = clock.time()  # inside the cut's window: every hold is in place
    failed = [h for h in holds if isinstance(h, BaseException)]
    replies = await asyncio.gather(
        *(
            worker(addr).snapshot_write(SnapshotWriteRequest(snapshot_id, bool(failed)))
            for addr in by_worker
        ),
        return_exceptions=True,
    )
    if failed:
        raise failed[0]
    tablets: list[TabletSnapshot] = []
    for reply in replies:
        if isinstance(reply, BaseException):
            raise reply
        assert isinstance(reply, SnapshotWriteResponse)
        if not reply.held:
            raise Unavailable("a tablet's hold timed out before the cut was complete")
        for t in reply.tablets:
            rec = TabletRecord.from_bytes(t.record)
            tablets.append(
                TabletSnapshot(t.tablet_id, rec.start_row, rec.end_row, t.cut_seq, rec.sstables)
            )
    tablets.sort(key=lambda t: t.start_row)
    manifest = SnapshotManifest(
        snapshot_id=snapshot_id,
        table=info.schema.name,
        table_id=info.table_id,
        created_at=created_at,
        expires_at=None if ttl is None else created_at + ttl,
        schema=info.schema,
        tablets=tuple(tablets),
    )
    try:
        SnapshotManifest.from_bytes(manifest.to_bytes())  # the tablets tile the rows
    except Exception as exc:
        raise Unavailable(f"the table's tablets changed during the snapshot: {exc}") from exc
    return manifest
