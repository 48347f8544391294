"""Point-in-time restore: rebuild a table as of an instant of its history window into a new
table (the shell around ``master/pitr_plan.py``, which says what is rebuilt and why).

:func:`restore_as_of`, step by step:

1. Check the request before anything is written: the source table keeps history and the
   instant is in its window, the new table does not exist, a checkpoint at or before the
   instant is kept (every error names the problem; nothing is created).
2. List the commit logs and read the header of each segment that may have been written
   between the checkpoint (less the clock margin) and the instant (one ranged GET each;
   older segments are told by their object's time), and choose each log's segments
   (``pitr_plan.select_segments``).
3. Sort them with the sorted-recovery machinery and its executors: each log's chosen
   segments get a sort plan (``pitr_plan.sort_plan``: tasks cut as a recovery's, records
   partitioned over the checkpoint's tablet ranges) created under the restore's own scope
   ``restores/<restore-id>/`` (``layout.recovery_prefix``), and the tasks run on the
   executor given — in this process (the default), on the live workers' sorters
   (``WorkerSortExecutor``) or as Lambda functions (``LambdaSortExecutor``) — exactly as a
   dead log's tasks do. The runs of the table (checked against their manifests) are decoded
   and routed to the checkpoint tablets with the cells after each one's cut. The scope never
   shares a key with a recovery's ``recovery/`` (a restore reads logs a recovery may be
   sorting at the same time, and logs still being written), and the restore deletes it when
   it ends, done or failed (garbage collection deletes what a restore that died left).
4. Per checkpoint tablet, merge its checkpoint cells with its logged cells
   (``pitr_plan.merge_cells``) and write them as one SSTable per locality group under the
   new table; then create the new table in one catalog step with the checkpoint's schema
   and split points and those SSTables, and have it assigned.

Bulk loads write no log: beside step 3, the parts of the loads committed between the
checkpoint (less the clock margin) and the instant (metadata/load_part.py,
``pitr_plan.select_parts``) add their cells after each checkpoint tablet's cut to its logged
cells; a finished load with a part unrecorded is refused (``pitr_plan.check_loads``).

A clone (``zero_copy``) differs in step 4 only: a new tablet names its checkpoint tablet's
SSTables as they are and one new SSTable per locality group with its logged cells, so only
the replayed log tail is written, whatever the table's size.

The new tablets' records list their SSTables and no log (their redo point is their largest
seq), so the restored table is served like any other, and a worker that loads a tablet
advances its sequence past its cells. The source table is only read. SSTables uploaded
before a failed create are unreferenced and garbage collection deletes them.

The restore runs in the calling process (the CLI, or the embedded database); only the sort
tasks run where the executor puts them. Its memory holds one tablet's cells at a time, plus
the table's sorted log records of the replayed span.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from tabletstore.clock import Clock
from tabletstore.commitlog.reader import read_segment_header
from tabletstore.commitlog.runs import RunInfo, SortManifest, SortPlan, SortTask, TabletRange
from tabletstore.commitlog.sorting import DEFAULT_TASK_BYTES, MAX_TASK_SEGMENTS, read_run
from tabletstore.coordination import paths
from tabletstore.data.schema import TableSchema
from tabletstore.errors import (
    AlreadyExists,
    Corruption,
    InvalidArgument,
    NotFound,
    TabletStoreError,
    Unavailable,
)
from tabletstore.keys import Cell
from tabletstore.master import pitr_plan as plan
from tabletstore.master.bulk_load import LoadRecord
from tabletstore.master.checkpoints import CLOCK_MARGIN, window_of
from tabletstore.master.log_recovery import InProcessSortExecutor, SortExecutor
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.load_part import list_load_parts
from tabletstore.metadata.record import LogRef, SSTableRef, TabletRecord
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot, list_manifests
from tabletstore.sstable.reader import read_sstable_bytes
from tabletstore.sstable.writer import upload_sstable, write_sstable
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo, ObjectStore, object_url

__all__ = ["RestoreReport", "restore_as_of"]

#: Object requests a restore keeps in flight.
PARALLEL = 16
#: Times a sort task that failed with Unavailable (a sorter or function gone) is tried.
ATTEMPTS = 3

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RestoreReport:
    """What a restore rebuilt."""

    table: str
    new_table: str
    instant: float
    checkpoint_id: str
    checkpoint_at: float
    tablets: int
    cells: int
    segments_read: int
    log_cells: int
    #: SSTables of the checkpoint the new table names as they are (a clone's; 0 for a restore).
    shared_sstables: int = 0
    cloned: bool = False
    #: Bytes of the log segments read (sorted) for the span.
    log_bytes: int = 0

    def summary(self) -> str:
        shared = f", {self.shared_sstables} SSTables shared" if self.cloned else ""
        verb = "cloned" if self.cloned else "restored"
        return (
            f"{verb} {self.table} as of {plan.utc(self.instant)} into {self.new_table}: "
            f"{self.tablets} tablets, {self.cells} cells (checkpoint {self.checkpoint_id} of "
            f"{plan.utc(self.checkpoint_at)}, {self.log_cells} cells from {self.segments_read} "
            f"log segments{shared})"
        )


async def restore_as_of(
    store: ObjectStore,
    catalog: Catalog,
    *,
    table: str,
    instant: float,
    new_table: str,
    clock: Clock,
    assign: Callable[[], Awaitable[object]] | None = None,
    zero_copy: bool = False,
    executor: SortExecutor | None = None,
    task_bytes: int = DEFAULT_TASK_BYTES,
) -> RestoreReport:
    """Rebuild ``table`` as of ``instant`` (seconds since the epoch) into the new table
    ``new_table`` (module docstring); ``assign`` is called once it exists (the embedded
    master's assignment round; a cluster's master assigns it in its next round).

    ``zero_copy`` makes a clone: each new tablet names its checkpoint tablet's SSTables as they
    are and gets one new SSTable per locality group holding only the replayed log cells (a
    checkpoint tablet whose SSTables hold a cell after its cut is rewritten whole, as a
    restore does). Garbage collection keeps a shared SSTable while any table's record names
    it (master/gc_plan.py), so the two tables stay whole whichever is deleted.

    ``executor``: where the log's sort tasks run (None: in this process; the caller closes
    one it gives); ``task_bytes``: bytes of segments per sort task."""
    info = await catalog.get_table(table)
    now = clock.time()
    window = window_of(info.schema.history, await catalog.history_default())
    plan.check_instant(table, instant, now, window)
    assert window is not None
    try:
        schema = TableSchema.model_validate(
            {**info.schema.model_dump(), "name": new_table, "history": None}
        )
    except ValueError as exc:
        raise InvalidArgument(f"cannot restore into {new_table!r}: {exc}") from exc
    await _check_absent(catalog, new_table)
    manifests = await list_manifests(store, info.table_id)
    checkpoint = plan.choose_checkpoint(table, manifests, instant, now, window)
    schema = TableSchema.model_validate(
        {**checkpoint.schema.model_dump(), "name": new_table, "history": None}
    )
    logged, segments, log_bytes = await _logged_cells(
        store,
        info.table_id,
        checkpoint,
        instant,
        executor or InProcessSortExecutor(store),
        task_bytes,
    )
    load_cells = await _loaded_cells(store, catalog, table, info.table_id, checkpoint, instant)
    for tablet_id, cells in load_cells.items():
        logged[tablet_id].extend(cells)
    log_cells = sum(len(c) for c in logged.values())
    table_id = Catalog.new_table_id(new_table)
    records: list[TabletRecord] = []
    cells_total = 0
    cache: dict[str, list[Cell]] = {}
    uses = Counter(
        ref.key for t in checkpoint.tablets for refs in t.sstables.values() for ref in refs
    )
    shared = 0
    verb = "cloned" if zero_copy else "restored"
    for i, tablet in enumerate(checkpoint.tablets):
        tablet_id = f"t{i:05d}"
        share = zero_copy and plan.shareable(tablet)
        held = await _checkpoint_cells(store, tablet, cache, uses) if not share else ()
        cells = plan.merge_cells(tablet, held, logged[tablet.tablet_id])
        del logged[tablet.tablet_id]
        sstables: dict[str, tuple[SSTableRef, ...]] = {}
        for group, group_cells in plan.group_cells(cells, schema).items():
            sstables[group] = (
                await _upload(store, schema, table_id, tablet_id, group, group_cells),
            )
        if share:
            sstables = plan.stacked(tablet, {g: refs[0] for g, refs in sstables.items()})
            shared += sum(len(refs) for refs in tablet.sstables.values())
        tablet_cells = len(cells) + (
            sum(r.cells for refs in tablet.sstables.values() for r in refs) if share else 0
        )
        cells_total += tablet_cells
        records.append(
            TabletRecord(
                table_id=table_id,
                tablet_id=tablet_id,
                start_row=tablet.start_row,
                end_row=tablet.end_row,
                sstables=sstables,
                redo_seq=max(
                    (r.max_seq for refs in sstables.values() for r in refs),
                    default=max((c.seq for c in cells), default=0),
                ),
            ).with_event(now, verb, f"{table} as of {plan.utc(instant)} ({tablet_cells} cells)")
        )
    await catalog.create_table(schema, records)
    if assign is not None:
        await assign()
    return RestoreReport(
        table=table,
        new_table=new_table,
        instant=instant,
        checkpoint_id=checkpoint.snapshot_id,
        checkpoint_at=checkpoint.created_at,
        tablets=len(records),
        cells=cells_total,
        segments_read=segments,
        log_cells=log_cells,
        log_bytes=log_bytes,
        shared_sstables=shared,
        cloned=zero_copy,
    )


async def _check_absent(catalog: Catalog, name: str) -> None:
    try:
        await catalog.get_table(name)
    except NotFound:
        return
    raise AlreadyExists(
        f"table {name!r} already exists: a restore creates a new table (delete it, or name another)"
    )


async def _logged_cells(
    store: ObjectStore,
    table_id: str,
    checkpoint: SnapshotManifest,
    instant: float,
    executor: SortExecutor,
    task_bytes: int,
) -> tuple[dict[str, list[Cell]], int, int]:
    """Checkpoint tablet id -> its cells after its cut acknowledged by ``instant``; and how
    many segments (and bytes of them) were read. The chosen segments are sorted by ``executor`` under a scope of
    this restore's own, deleted before returning (module docstring)."""
    low = checkpoint.created_at - CLOCK_MARGIN
    by_log: dict[LogRef, list[ObjectInfo]] = {}
    async for info in store.list(layout.LOGS):
        try:
            key = layout.parse_log_segment_key(info.key)
        except InvalidArgument:
            continue  # not a segment: not ours to judge
        by_log.setdefault(LogRef(key.worker_id, key.incarnation), []).append(info)
    ranges = tuple(
        TabletRange(table_id, t.tablet_id, t.start_row, t.end_row) for t in checkpoint.tablets
    )
    sem = asyncio.Semaphore(PARALLEL)
    scope = uuid.uuid4().hex
    plans: list[SortPlan] = []
    for ref, infos in sorted(by_log.items(), key=lambda kv: (kv[0].worker_id, kv[0].incarnation)):
        stamps = await asyncio.gather(*(_stamp(store, o, low, sem) for o in infos))
        sort_plan = plan.sort_plan(
            ref,
            plan.select_segments(ref, stamps, low, instant),
            {s.number: s.size for s in stamps},
            ranges,
            task_bytes=task_bytes,
            task_segments=MAX_TASK_SEGMENTS,
            scope=scope,
        )
        if sort_plan is not None:
            plans.append(sort_plan)
    out: dict[str, list[Cell]] = {t.tablet_id: [] for t in checkpoint.tablets}
    try:
        for sort_plan in plans:
            plan_key = layout.recovery_plan_key(sort_plan.worker_id, sort_plan.incarnation, scope)
            await store.create(plan_key, sort_plan.to_bytes())
        manifests = await asyncio.gather(*(_sorted(executor, p, t) for p in plans for t in p.tasks))
        wanted = [r for m in manifests for r in m.runs if r.table_id == table_id]

        async def fetch(run: RunInfo) -> None:
            # Routed as it arrives: only the cells after the cut stay in memory, not the
            # decoded records of every run at once.
            async with sem:
                records = await read_run(store, run)
            for tablet_id, cells in plan.route(checkpoint.tablets, table_id, records).items():
                out[tablet_id].extend(cells)

        await asyncio.gather(*(fetch(r) for r in wanted))
    finally:
        await _drop_scope(store, scope)
    tasks = [t for p in plans for t in p.tasks]
    return out, sum(t.stop - t.first for t in tasks), sum(t.size for t in tasks)


async def _sorted(executor: SortExecutor, sort_plan: SortPlan, task: SortTask) -> SortManifest:
    """Run one task on ``executor``, again when a sorter or function was lost
    (Unavailable); a task is idempotent."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return await executor.run(sort_plan, task)
        except Unavailable as exc:
            if attempt == ATTEMPTS:
                raise
            log.warning(
                "restore sort task %s/%s@%d failed (attempt %d): %s",
                sort_plan.worker_id,
                sort_plan.incarnation,
                task.first,
                attempt,
                exc,
            )
    raise AssertionError("unreachable")


async def _drop_scope(store: ObjectStore, scope: str) -> None:
    """Delete this restore's sorted log; one left behind (the store failing now) is garbage
    collection's to delete (``master/gc_plan.py``)."""
    try:
        keys = [o.key async for o in store.list(layout.restore_scope_prefix(scope))]
        await store.delete_many(keys)
    except TabletStoreError as exc:
        log.warning("restore %s: its sorted log is left to garbage collection: %s", scope, exc)


async def _loaded_cells(
    store: ObjectStore,
    catalog: Catalog,
    table: str,
    table_id: str,
    checkpoint: SnapshotManifest,
    instant: float,
) -> dict[str, list[Cell]]:
    """Checkpoint tablet id -> the cells after its cut of the bulk-load parts committed
    between the checkpoint (less the clock margin) and ``instant``, in each part's rows."""
    low = checkpoint.created_at - CLOCK_MARGIN
    parts = await list_load_parts(store, table_id)
    kvs = await catalog.coordinator.get_prefix(paths.bulk_loads_prefix(table_id))
    plan.check_loads(table, [LoadRecord.from_bytes(kv.value) for kv in kvs], parts, low, instant)
    cells: list[Cell] = []
    for part in plan.select_parts(parts, low, instant):
        for refs in part.sstables.values():
            for ref in refs:
                data = await store.get(ref.key)
                if data is None:
                    raise Corruption(
                        f"bulk-loaded SSTable {object_url(store.url, ref.key)} of load "
                        f"{part.load_id!r} does not exist (tabletstore verify lists what else "
                        "is missing)"
                    )
                got = await asyncio.to_thread(
                    read_sstable_bytes, data, name=ref.key, seq_base=ref.seq_base
                )
                cells.extend(
                    c
                    for c in got
                    if c.row >= part.start_row and (part.end_row is None or c.row < part.end_row)
                )
    return plan.route_cells(checkpoint.tablets, cells)


async def _stamp(
    store: ObjectStore, info: ObjectInfo, low: float, sem: asyncio.Semaphore
) -> plan.SegmentStamp:
    """When a listed segment was written: its header's stamp; for a fence, a version 1
    segment, or an object older than the span (``low`` less the clock margin: its stamp is
    older still), the object's time."""
    number = layout.parse_log_segment_key(info.key).seq
    if info.size == 0 or info.last_modified < low - CLOCK_MARGIN:
        return plan.SegmentStamp(number, info.size, info.last_modified)
    where = object_url(store.url, info.key)
    async with sem:
        found = await read_segment_header(store, info.key, info.size, where=where)
    if found is None:
        raise Corruption(f"{where} was deleted during the restore")
    header, _ = found
    written = header.written_at if header.written_at is not None else info.last_modified
    return plan.SegmentStamp(number, info.size, written)


async def _checkpoint_cells(
    store: ObjectStore, tablet: TabletSnapshot, cache: dict[str, list[Cell]], uses: Counter[str]
) -> list[Cell]:
    """Every cell of the tablet's checkpoint SSTables (an SSTable shared by several tablets is
    read once and kept until the last of them, counted in ``uses``)."""
    out: list[Cell] = []
    for refs in tablet.sstables.values():
        for ref in refs:
            if ref.key not in cache:
                data = await store.get(ref.key)
                if data is None:
                    raise Corruption(
                        f"checkpoint SSTable {object_url(store.url, ref.key)} does not exist "
                        "(tabletstore verify lists what else is missing)"
                    )
                cache[ref.key] = await asyncio.to_thread(
                    read_sstable_bytes, data, name=ref.key, seq_base=ref.seq_base
                )
            out.extend(cache[ref.key])
            uses[ref.key] -= 1
            if uses[ref.key] <= 0:
                del cache[ref.key]
    return out


async def _upload(
    store: ObjectStore,
    schema: TableSchema,
    table_id: str,
    tablet_id: str,
    group: str,
    cells: Sequence[Cell],
) -> SSTableRef:
    lg = schema.locality_groups[group]
    data, info = await asyncio.to_thread(
        write_sstable,
        cells,
        compression=lg.compression,
        block_size=lg.block_size,
        locality_group=group,
    )
    key = layout.sstable_key(table_id, tablet_id, group, uuid.uuid4().hex)
    info = await upload_sstable(store, key, data, info)
    return SSTableRef.of(key, len(data), info)
