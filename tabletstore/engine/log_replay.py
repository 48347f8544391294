"""Loading a tablet (§5.3 recovery): open its SSTables, replay its commit-log records past the
redo point into a fresh memtable, and list this worker's log in its record.

Replay gives the event loop back every :data:`YIELD_CELLS` cells (:func:`yielding`): its
sources (a run kept in memory, a cached read of a log) often never wait, and one tablet's
replay of tens of thousands of cells must not hold the loop, on which the worker's lease
keep-alive runs (a worker loading a dead worker's tablets would otherwise lose its own lease
to the load).

Replay may re-apply a record an SSTable holds already (the redo point lags behind writes that
were in flight at a freeze, :mod:`~tabletstore.engine.compaction_runner`). A put applied twice
collapses with itself; an aggregate part would be counted twice, so :class:`_FlushedRows`
skips the parts an SSTable holds.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from typing import TypeVar

from tabletstore.clock import Clock
from tabletstore.data.schema import TableSchema
from tabletstore.engine.memtable import MemTable
from tabletstore.engine.state import TabletState
from tabletstore.engine.tablet_core import LogSink, TabletCatalog
from tabletstore.engine.tablet_sstables import open_sstable
from tabletstore.keys import AGGREGATE_KINDS, Cell, CellKind
from tabletstore.metadata.record import TabletRecord
from tabletstore.sstable import SSTable
from tabletstore.sstable.block_cache import BlockCache, ScanCache
from tabletstore.storage_s3.base import ObjectStore

__all__ = ["YIELD_CELLS", "recover_state", "yielding"]

T = TypeVar("T")

#: Cells a replay hands on between two turns it gives the event loop (about a millisecond of
#: work on an idle core).
YIELD_CELLS = 1024


async def yielding(items: AsyncIterator[T], every: int = YIELD_CELLS) -> AsyncIterator[T]:
    """``items`` (a replay's cells), giving the event loop a turn after every ``every``."""
    n = 0
    async for item in items:
        yield item
        n += 1
        if n % every == 0:
            await asyncio.sleep(0)


async def recover_state(
    record: TabletRecord,
    schema: TableSchema,
    *,
    store: ObjectStore,
    log_sink: LogSink,
    catalog: TabletCatalog,
    replay: Callable[[TabletRecord], AsyncIterator[Cell]] | None,
    clock: Clock,
    block_cache: BlockCache | None,
    scan_cache: ScanCache | None,
    claimed: TabletRecord | None = None,
) -> TabletState:
    """Open a tablet's SSTables, replay its commit-log records past the redo point into a
    fresh memtable (§5.3 recovery), and record this worker's log in its record.

    ``claimed``: ``record`` as the load takes it (its epoch and location), not yet stored: the
    one update stores it with the log, conditional on ``record``'s epoch (a tablet never
    loaded, with no log to replay: worker/tablet_server.py)."""
    tables: dict[str, tuple[SSTable, ...]] = {}
    for group, refs in record.sstables.items():
        opened = await asyncio.gather(
            *(open_sstable(store, ref, block_cache, scan_cache) for ref in refs)
        )
        lg = schema.locality_groups.get(group)
        if lg is not None and lg.in_memory:
            await asyncio.gather(*(t.load_all() for t in opened))
        tables[group] = tuple(opened)
    memtable = MemTable()
    max_seq = max(
        [record.redo_seq, *(r.max_seq for refs in record.sstables.values() for r in refs)]
    )
    if replay is not None:
        batch: list[Cell] = []
        flushed = _FlushedRows(tables, record)
        async for cell in yielding(replay(record)):
            if cell.seq > record.redo_seq:
                if cell.kind in AGGREGATE_KINDS and await flushed.holds(cell):
                    continue
                batch.append(cell)
                max_seq = max(max_seq, cell.seq)
                if len(batch) >= YIELD_CELLS:
                    memtable.add(batch)
                    batch = []
        memtable.add(batch)
    log_sink.advance(max_seq)
    base = record if claimed is None else claimed
    logs = tuple(dict.fromkeys((*base.logs, log_sink.log_ref)))
    starts = dict(base.log_starts)
    if log_sink.log_ref not in base.logs:
        # Not serving yet: every write of this tablet to the log comes after this mark.
        starts[log_sink.log_ref] = log_sink.segment_mark()
    new_record = replace(base, logs=logs, log_starts=starts).with_event(
        clock.time(), "loaded", f"replayed {len(memtable)} cells"
    )
    if new_record != record:
        new_record = await catalog.update(record, new_record)
    return TabletState(new_record, memtable, (), tables)


class _FlushedRows:
    """Which replayed aggregate parts an SSTable holds already (:func:`recover_state`).

    Replay re-applies every record past the redo point, and the redo point may lag behind
    what the SSTables hold (writes in flight at a freeze). A put applied twice collapses with
    itself (same key), but an aggregate part would be counted twice, once in the SSTable's
    combined cell and once more from the log. A row's writes reach memtables in seq order
    (row lock), and memtables reach SSTables in order, so a part of row R and family F with
    seq ``s`` is in an SSTable (or was removed from one by a deletion or GC) exactly when
    some SSTable holds a cell of R in F, or a row deletion of R, with a seq >= ``s`` (bulk
    loads, whose fresh seqs bypass the memtable, are refused for aggregate families). Only
    parts with a seq between the redo point and the SSTables' largest seq can be there: the
    others are not looked up."""

    def __init__(self, tables: Mapping[str, tuple[SSTable, ...]], record: TabletRecord) -> None:
        self._tables = [t for group in tables.values() for t in group]
        self._top = max((r.max_seq for refs in record.sstables.values() for r in refs), default=0)
        self._rows: dict[tuple[bytes, str], int] = {}

    async def holds(self, cell: Cell) -> bool:
        if cell.seq > self._top:
            return False
        top = self._rows.get((cell.row, cell.family))
        if top is None:
            rows = await asyncio.gather(*(t.get_row(cell.row) for t in self._tables))
            top = max(
                (
                    c.seq
                    for cells in rows
                    for c in cells
                    if c.family == cell.family or c.kind == CellKind.DELETE_ROW
                ),
                default=-1,
            )
            self._rows[(cell.row, cell.family)] = top
        return cell.seq <= top
