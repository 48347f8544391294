"""A tablet's side of a snapshot's cut (§8, ``tabletstore.batch``): hold writes briefly, take
the sequence-number mark that divides the tablet's cells into before and after the cut, and
write what its memtables held at the cut as SSTables for the snapshot alone."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from tabletstore.engine.memtable import MemTable
from tabletstore.engine.tablet_core import TabletCore
from tabletstore.engine.tablet_sstables import TabletSSTables
from tabletstore.errors import Unavailable
from tabletstore.keys import CellFields
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tabletstore.sstable import write_sstable

__all__ = ["SnapshotCut", "SnapshotCutter"]


@dataclass(frozen=True, slots=True)
class SnapshotCut:
    """One tablet's side of a snapshot's cut (:meth:`Tablet.hold_for_snapshot`)."""

    #: The tablet's record at the cut (its SSTables then).
    record: TabletRecord
    #: The largest seq of any cell of the tablet at the cut: larger ones are after it.
    mark: int
    #: The memtables at the cut, newest first (the first keeps taking writes, seq > mark).
    memtables: tuple[MemTable, ...]
    gate: asyncio.Event
    timer: asyncio.TimerHandle


class SnapshotCutter:
    """Takes and writes out one tablet's snapshot cuts (one at a time)."""

    def __init__(self, core: TabletCore, sstables: TabletSSTables) -> None:
        self._core = core
        self._sstables = sstables

    async def hold_for_snapshot(self, hold_seconds: float) -> SnapshotCut:
        """Take this tablet's side of a snapshot's cut (§8, ``tabletstore.batch``).

        Writes that have not taken a sequence number yet wait (they are not refused); writes
        already past that point finish. Then the tablet's cut is taken in one step with no
        await: its sequence-number high-water mark (every cell of the tablet with a larger
        seq is written after the cut: a tablet's cells are totally ordered by seq, as a
        tablet loaded elsewhere advances the new worker's sequence past them), its memtables
        and its SSTable stack. Writes stay held until :meth:`release_snapshot_hold` or until
        ``hold_seconds`` pass, whichever comes first (a coordinator that died mid-snapshot
        cannot stall the tablet); the caller learns from the release whether the hold lasted.
        """
        core = self._core
        core.check_open()
        if core.snapshot_gate is not None:
            raise Unavailable(
                f"tablet {core.record.tablet_id}: another snapshot is being taken; retry"
            )
        gate = asyncio.Event()
        core.snapshot_gate = gate
        timer = asyncio.get_running_loop().call_later(hold_seconds, self._open_gate, gate)
        try:
            async with asyncio.timeout(hold_seconds):
                await core.idle.wait()
            core.check_open()
        except TimeoutError as exc:
            timer.cancel()
            self._open_gate(gate)
            raise Unavailable(
                f"tablet {core.record.tablet_id}: writes in flight did not finish within "
                f"{hold_seconds} s of a snapshot's hold; retry"
            ) from exc
        except BaseException:
            timer.cancel()
            self._open_gate(gate)
            raise
        state = core.state
        memtables = (state.memtable, *state.frozen)
        rec = state.record
        mark = max(
            [
                rec.redo_seq,
                *(m.max_seq or 0 for m in memtables),
                *(r.max_seq for refs in rec.sstables.values() for r in refs),
            ]
        )
        # Aggregate parts written after the cut must not fold into parts before it.
        state.memtable.keep_parts_through(mark)
        return SnapshotCut(rec, mark, memtables, gate, timer)

    def _open_gate(self, gate: asyncio.Event) -> None:
        if self._core.snapshot_gate is gate:
            self._core.snapshot_gate = None
        gate.set()

    def release_snapshot_hold(self, cut: SnapshotCut) -> bool:
        """Let held writes go on; True if the hold lasted until now (it had not timed out)."""
        held = self._core.snapshot_gate is cut.gate
        cut.timer.cancel()
        self._open_gate(cut.gate)
        return held

    async def write_snapshot(self, cut: SnapshotCut) -> dict[str, tuple[SSTableRef, ...]]:
        """The SSTables that hold this tablet as of ``cut``, per locality group, newest first:
        its SSTables at the cut, plus new SSTables holding what its memtables held at the
        cut (cells with seq <= the mark), written for the snapshot alone (the tablet's own
        record does not change; a snapshot manifest pins them, §8).

        Why not minor-compact and read the record back: a merging compaction that runs
        between the cut and that read may have dropped a put masked by a deletion made after
        the cut, which the snapshot must still show. The SSTables named at the cut are
        immutable and stay in the bucket while the manifest names them (GC rule).
        """
        mark = cut.mark
        groups = self._sstables.split_by_group(cut.memtables)
        out: dict[str, tuple[SSTableRef, ...]] = {
            g: tuple(r) for g, r in cut.record.sstables.items()
        }
        for group, cells in groups.items():
            ref = await self._snapshot_sstable(group, [c for c in cells if c[4] <= mark])  # seq
            if ref is not None:
                out[group] = (ref, *out.get(group, ()))
        return {g: refs for g, refs in out.items() if refs}

    async def _snapshot_sstable(self, group: str, cells: list[CellFields]) -> SSTableRef | None:
        """Upload ``cells`` as an SSTable of ``group`` for a snapshot only (not opened, not in
        the tablet's record); None when there are none."""
        if not cells:
            return None
        lg = self._core.locality_group(group)
        data, info = write_sstable(
            cells, compression=lg.compression, block_size=lg.block_size, locality_group=group
        )
        return await self._sstables.upload(group, data, info)
