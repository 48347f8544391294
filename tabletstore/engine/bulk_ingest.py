"""A tablet's side of a bulk load (§8): cells loaded as new SSTables, and SSTables staged by
the master adopted as they are, added to the tablet's record in one update, once per load;
then the committed part recorded for point-in-time restores (metadata/load_part.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

import numpy as np
import pyarrow as pa

from tabletstore.engine.tablet_core import TabletCore
from tabletstore.engine.tablet_sstables import TabletSSTables
from tabletstore.errors import NotServing, TabletStoreError
from tabletstore.metadata.load_part import LoadPart, write_load_part
from tabletstore.metadata.record import BulkLoadMark, SSTableRef, uncovered
from tabletstore.sstable import SSTable
from tabletstore.sstable.writer import write_sstable_table

__all__ = ["BulkIngest"]

log = logging.getLogger(__name__)


class BulkIngest:
    """Adds bulk-loaded SSTables to one tablet."""

    def __init__(
        self, core: TabletCore, sstables: TabletSSTables, notify_compacted: Callable[[], None]
    ) -> None:
        self._core = core
        self._sstables = sstables
        self._notify_compacted = notify_compacted

    async def bulk_load(
        self,
        groups: Mapping[str, pa.Table],
        marks: tuple[BulkLoadMark, ...] = (),
        adopt: Sequence[tuple[str, SSTableRef]] = (),
    ) -> int:
        """Add bulk-loaded cells (§8; Arrow tables of the SSTable schema, sorted, puts only,
        in this tablet's range, families of its schema) as new SSTables, one per locality
        group, and the SSTables ``adopt`` names ((group, reference), objects of this table
        holding only puts of rows in this tablet's range, every stored seq 0: staged by the
        master, batch/load_files.py step 2) as they are, in one record update: all of them or
        none. Returns the cells added.

        ``marks`` name the load and the rows these cells are; the same record update adds
        them, so the load is applied once: if the record already marks any of those rows
        as loaded by it (a concurrent or repeated call), nothing is added (0), or NotServing
        when only part of them are (the master looks again at what is left).

        The cells' seqs are replaced by fresh ones from the worker's sequence (an adopted
        SSTable's by the ``seq_base`` of its reference: one fresh seq for all its cells,
        which are distinct cells), so loaded cells behave exactly like writes made now:
        newer than every cell already in the tablet (a later delete masks them, an earlier
        one does not)."""
        core = self._core
        core.check_writable()
        written_cells = int(sum(t.num_rows for t in groups.values()))
        total = written_cells + sum(ref.cells for _, ref in adopt)
        if not total and not marks:
            return 0
        async with core.compaction_lock:
            core.check_writable()
            if marks and self._marked(marks):
                return 0
            seqs_needed = written_cells + len(adopt)
            first = core.log.allocate(seqs_needed) if seqs_needed else 0
            added: list[tuple[str, SSTableRef, SSTable]] = []
            for group, staged in adopt:
                base, first = first, first + 1
                ref = replace(
                    staged,
                    seq_base=base,
                    min_seq=staged.min_seq + base,
                    max_seq=staged.max_seq + base,
                )
                added.append((group, ref, await self._sstables.open(group, ref)))
            for group, cells in sorted(groups.items()):
                n = cells.num_rows
                if not n:
                    continue
                # Distinct (row, family, qualifier, ts) per cell (checked by the loader), so
                # any seq order keeps the cells sorted.
                seqs = pa.array(np.arange(first, first + n, dtype=np.int64))
                first += n
                renumbered = cells.set_column(4, "seq", seqs)
                lg = core.schema.locality_groups.get(group)
                # Encoding releases the GIL: off the event loop (tablets load in parallel).
                data, info = await asyncio.to_thread(
                    write_sstable_table,
                    renumbered,
                    compression=lg.compression if lg is not None else "zstd",
                    block_size=lg.block_size if lg is not None else 64 * 1024,
                    locality_group=group,
                )
                ref, table = await self._sstables.store(group, data, info)
                added.append((group, ref, table))
            async with core.state_lock:
                state = core.state
                record = state.record
                new_sstables = dict(record.sstables)
                opened = dict(state.sstables)
                for group, ref, table in added:
                    new_sstables[group] = (ref, *new_sstables.get(group, ()))
                    opened[group] = (table, *opened.get(group, ()))
                detail = f"{total} cells" + (f" of load {marks[0].load_id}" if marks else "")
                new_record = (
                    replace(record, sstables=new_sstables)
                    .with_bulk_loads(marks)
                    .with_event(core.clock.time(), "bulk load", detail)
                )
                stored = await core.catalog.update(record, new_record)
                committed_at = core.clock.time()
                core.state = replace(state, record=stored, sstables=opened)
            await self._record_part(marks, added, total, committed_at)
        self._notify_compacted()
        return total

    async def _record_part(
        self,
        marks: tuple[BulkLoadMark, ...],
        added: Sequence[tuple[str, SSTableRef, SSTable]],
        total: int,
        committed_at: float,
    ) -> None:
        """Record the committed part for point-in-time restores (metadata/load_part.py). The
        load is committed whatever happens here: a failure is logged, and a restore past this
        instant refuses to rebuild without the part (it compares the load's cells)."""
        record = self._core.record
        sstables: dict[str, tuple[SSTableRef, ...]] = {}
        for group, ref, _ in added:
            sstables[group] = (*sstables.get(group, ()), ref)
        starts = [m.start_row for m in marks] or [record.start_row]
        ends = [m.end_row for m in marks] or [record.end_row]
        part = LoadPart(
            load_id=marks[0].load_id if marks else "",
            table_id=record.table_id,
            tablet_id=record.tablet_id,
            start_row=min(starts),
            end_row=None if None in ends else max(e for e in ends if e is not None),
            committed_at=committed_at,
            cells=total,
            sstables=sstables,
        )
        try:
            await write_load_part(self._core.store, part)
        except TabletStoreError as exc:
            log.error(
                "bulk load %s into tablet %s/%s committed, but its part was not recorded for "
                "point-in-time restores: %s",
                part.load_id,
                record.table_id,
                record.tablet_id,
                exc,
            )

    def _marked(self, marks: tuple[BulkLoadMark, ...]) -> bool:
        """Whether the record marks all the rows of ``marks`` as loaded (True), none of them
        (False), or some (NotServing: the caller's view is stale)."""
        record = self._core.record
        have = record.bulk_loads
        fresh = [uncovered(have, m.load_id, m.start_row, m.end_row) for m in marks]
        if all(f == [(m.start_row, m.end_row)] for f, m in zip(fresh, marks, strict=True)):
            return False
        if all(not f for f in fresh):
            return True
        raise NotServing(
            f"tablet {record.tablet_id}: load {marks[0].load_id} is partly in it already"
        )
