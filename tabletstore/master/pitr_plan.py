"""Point-in-time restore: the pure decisions (no I/O), for ``master/pitr_restore.py``.

A table with a history window can be rebuilt as of any instant T in it: the newest
checkpoint at or before T (:func:`choose_checkpoint`), plus every commit-log record of the
table written after that checkpoint's cut and acknowledged by T.

* **After the cut**: a record's cells belong to the checkpoint tablet whose range holds its
  row (records carry the table id and row, never a tablet, so splits, merges and moves after
  the checkpoint change nothing); the cells after the cut are those with a seq larger than
  that tablet's ``cut_seq``. This holds across workers: a tablet's cells are totally ordered
  by seq, because a worker that loads a tablet advances its sequence past every cell the
  tablet has (``engine/log_replay.py``), and a tablet split after the checkpoint keeps its
  worker's sequence.
* **By T**: the segments stamped at or before T (commit-log format version 2; a version 1
  segment's object time stands in). A write acknowledged before T is in such a segment, and
  every write in one began before T (``commitlog/format.py``). Segments stamped more than
  ``CLOCK_MARGIN`` before the checkpoint cannot hold a write after its cut and are not read.
* **Bulk loads** write no log: each tablet's committed part is recorded with its commit
  instant (metadata/load_part.py), and the parts committed between the checkpoint (less the
  clock margin) and T add their cells after the cut, routed by row as log cells are
  (:func:`select_parts`, :func:`route_cells`); a finished load whose parts are not all
  recorded is refused (:func:`check_loads`).
* **Whole logs only**: each log is read as recovery reads it: up to its first fence, a number
  missing within the in-flight window of its last segment ends it (nothing from there on was
  acknowledged), and a number missing further down is :class:`Corruption` — a restore never
  skips a segment (:func:`select_segments`).

The rebuilt tablet is the checkpoint's cells (those of its SSTables with a seq at or below
``cut_seq``, clipped to its rows) merged with those log cells, deduplicated
(:func:`merge_cells`): raw cells, deletions and aggregate parts included, so reads of the
restored table apply deletions, versions and aggregation exactly as the source's would have.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tabletstore.commitlog.format import IN_FLIGHT_WINDOW, LogRecord
from tabletstore.commitlog.runs import SortPlan, SortTask, TabletRange
from tabletstore.data.schema import TableSchema
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.keys import Cell, CellKind, cell_sort_key
from tabletstore.master.bulk_load import DONE, LoadRecord
from tabletstore.master.checkpoints import CLOCK_MARGIN, retention
from tabletstore.metadata.load_part import LoadPart
from tabletstore.metadata.record import LogRef, SSTableRef
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot

__all__ = [
    "SegmentStamp",
    "check_instant",
    "check_loads",
    "choose_checkpoint",
    "group_cells",
    "merge_cells",
    "route",
    "route_cells",
    "select_parts",
    "select_segments",
    "shareable",
    "sort_plan",
    "stacked",
    "utc",
]


def utc(t: float) -> str:
    """``2026-11-28T09:15:00.250Z``: an instant as the CLI takes and prints it."""
    frac = f"{t % 1:.3f}"[1:] if t % 1 else ""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + frac + "Z"


def check_instant(table: str, instant: float, now: float, window: float | None) -> None:
    """InvalidArgument unless ``instant`` is in ``table``'s history window at ``now``."""
    if window is None:
        raise InvalidArgument(
            f"table {table!r} keeps no history: set a window (tabletstore history {table} "
            "24h, or a database default: history --default 24h) to restore it as of an "
            "instant from then on"
        )
    if instant > now:
        raise InvalidArgument(
            f"{utc(instant)} is in the future (now is {utc(now)}); nothing to restore yet"
        )
    if instant < now - window:
        raise InvalidArgument(
            f"{utc(instant)} is outside the history window of table {table!r}: it keeps "
            f"{window:g} s, from {utc(now - window)} to now"
        )


def choose_checkpoint(
    table: str,
    manifests: Sequence[SnapshotManifest],
    instant: float,
    now: float,
    window: float,
) -> SnapshotManifest:
    """The newest checkpoint at or before ``instant`` whose log is still retained (it was
    taken after the log's retention began); InvalidArgument naming the earliest restorable
    instant when there is none."""
    kept_from = now - retention(window) + CLOCK_MARGIN
    usable = [m for m in manifests if m.created_at >= kept_from and not m.expired(now)]
    before = [m for m in usable if m.created_at <= instant]
    if before:
        return max(before, key=lambda m: (m.created_at, m.snapshot_id))
    if usable:
        earliest = min(m.created_at for m in usable)
        raise InvalidArgument(
            f"table {table!r} has no checkpoint at or before {utc(instant)}: the earliest "
            f"instant it can be restored to is {utc(earliest)}"
        )
    raise InvalidArgument(
        f"table {table!r} has no checkpoint yet: the master takes one within minutes of "
        "the history window being set; try again then"
    )


@dataclass(frozen=True, slots=True)
class SegmentStamp:
    """One listed segment: its number, size (0: a fence) and when it was written (its header's
    stamp, or its object's time for format version 1)."""

    number: int
    size: int
    written_at: float


def select_segments(
    ref: LogRef, segments: Sequence[SegmentStamp], low: float, high: float
) -> list[list[int]]:
    """The segments of log ``ref`` written in ``[low, high]``, as runs of consecutive numbers
    (ascending), read as recovery reads a log (module docstring)."""
    ordered = sorted(segments, key=lambda s: s.number)
    if not ordered:
        return []
    last = ordered[-1].number
    present = {s.number for s in ordered}
    first = ordered[0].number
    end = last + 1
    fence = next((s.number for s in ordered if s.size == 0), None)
    if fence is not None:
        end = fence
    for n in range(first, end):
        if n not in present:
            if n > last - IN_FLIGHT_WINDOW:
                end = n  # a PUT that failed in flight: the log ends here
                break
            raise Corruption(
                f"commit log {ref.worker_id}/{ref.incarnation}: segment {n} is missing below "
                f"segment {last}; a restore never skips a segment"
            )
    runs: list[list[int]] = []
    for s in ordered:
        if s.number >= end:
            break
        if not low <= s.written_at <= high:
            continue
        if runs and runs[-1][-1] == s.number - 1:
            runs[-1].append(s.number)
        else:
            runs.append([s.number])
    return runs


def sort_plan(
    ref: LogRef,
    runs: Sequence[Sequence[int]],
    sizes: Mapping[int, int],
    ranges: Sequence[TabletRange],
    *,
    task_bytes: int,
    task_segments: int,
    scope: str,
) -> SortPlan | None:
    """The sort plan of the segments of log ``ref`` a restore replays (``runs``, from
    :func:`select_segments`; ``sizes``: segment number -> bytes), partitioned over the
    checkpoint's tablet ``ranges``, in tasks of about ``task_bytes`` and at most
    ``task_segments`` segments that never span two runs, as ``commitlog.sorting.plan_sort``
    cuts a recovery's; under the restore's ``scope``. None when there is nothing to sort.
    ``fence`` is the number past the last selected segment: the log is not fenced (its
    writer may be alive), and the restore reads no segment from there on."""
    if task_bytes < 1 or task_segments < 1:
        raise InvalidArgument(
            f"task_bytes and task_segments must be >= 1, got {task_bytes}, {task_segments}"
        )
    tasks: list[SortTask] = []
    for run in runs:
        first, size = run[0], 0
        for n in run:
            size += sizes[n]
            if size >= task_bytes or n + 1 - first >= task_segments:
                tasks.append(SortTask(first, n + 1, size))
                first, size = n + 1, 0
        if first <= run[-1]:
            tasks.append(SortTask(first, run[-1] + 1, size))
    if not tasks:
        return None
    ordered = tuple(sorted(set(ranges), key=lambda t: (t.table_id, t.start_row, t.tablet_id)))
    return SortPlan(ref.worker_id, ref.incarnation, tasks[-1].stop, tuple(tasks), ordered, scope)


def route(
    tablets: Sequence[TabletSnapshot], table_id: str, records: Iterable[LogRecord]
) -> dict[str, list[Cell]]:
    """The cells of ``records`` of table ``table_id`` after the cut of the checkpoint tablet
    holding their row: tablet id -> cells (in record order)."""
    ordered = sorted(tablets, key=lambda t: t.start_row)
    starts = [t.start_row for t in ordered]
    out: dict[str, list[Cell]] = {t.tablet_id: [] for t in ordered}
    for record in records:
        if record.table_id != table_id:
            continue
        i = bisect.bisect_right(starts, record.row) - 1
        if i < 0:
            continue  # the checkpoint's tablets tile the table: unreachable
        tablet = ordered[i]
        cells = out[tablet.tablet_id]
        cells.extend(c for c in record.cells if c.seq > tablet.cut_seq)
    return out


def select_parts(parts: Sequence[LoadPart], low: float, high: float) -> list[LoadPart]:
    """The bulk-load parts committed in ``[low, high]`` (metadata/load_part.py): a load
    acknowledged by the instant ``high`` is in, one committed after it is not, whole parts."""
    return [p for p in parts if low <= p.committed_at <= high]


def check_loads(
    table: str, loads: Sequence[LoadRecord], parts: Sequence[LoadPart], low: float, high: float
) -> None:
    """Corruption naming the first finished load begun in ``[low, high]`` whose recorded parts
    hold fewer cells than it loaded: a part went unrecorded (its worker died between the
    commit and the record), and a restore without it would silently lack cells."""
    held: dict[str, int] = {}
    for p in parts:
        held[p.load_id] = held.get(p.load_id, 0) + p.cells
    for rec in loads:
        if rec.state != DONE or not low <= rec.started_at <= high:
            continue
        if held.get(rec.load_id, 0) < rec.cells:
            raise Corruption(
                f"bulk load {rec.load_id!r} into table {table!r} loaded {rec.cells} cells, but "
                f"only {held.get(rec.load_id, 0)} are recorded for restores (a worker died as it "
                "recorded a part); restore to an instant before it or after the next checkpoint"
            )


def route_cells(tablets: Sequence[TabletSnapshot], cells: Iterable[Cell]) -> dict[str, list[Cell]]:
    """``cells`` (of one table) after the cut of the checkpoint tablet holding their row:
    tablet id -> cells."""
    ordered = sorted(tablets, key=lambda t: t.start_row)
    starts = [t.start_row for t in ordered]
    out: dict[str, list[Cell]] = {t.tablet_id: [] for t in ordered}
    for c in cells:
        i = bisect.bisect_right(starts, c.row) - 1
        if i >= 0 and c.seq > ordered[i].cut_seq:
            out[ordered[i].tablet_id].append(c)
    return out


def merge_cells(
    tablet: TabletSnapshot, checkpoint: Iterable[Cell], logged: Iterable[Cell]
) -> list[Cell]:
    """The rebuilt tablet's cells in the one sort order: the checkpoint's cells at or before
    its cut and in its rows, and the logged cells after it, each distinct cell once (a
    record replayed into another log, or two SSTables sharing a cell, counts once)."""
    kept = {
        c
        for c in checkpoint
        if c.seq <= tablet.cut_seq
        and c.row >= tablet.start_row
        and (tablet.end_row is None or c.row < tablet.end_row)
    }
    kept.update(c for c in logged if c.seq > tablet.cut_seq)
    return sorted(kept, key=cell_sort_key)


def shareable(tablet: TabletSnapshot) -> bool:
    """Whether a clone's tablet can name ``tablet``'s checkpoint SSTables as they are: every
    cell they hold is at or before its cut (``max_seq`` includes a bulk load's ``seq_base``).
    Cells of other rows in them are fine: a tablet reads only its own rows of a shared SSTable,
    as split daughters do."""
    return all(r.max_seq <= tablet.cut_seq for refs in tablet.sstables.values() for r in refs)


def stacked(
    tablet: TabletSnapshot, tail: dict[str, SSTableRef]
) -> dict[str, tuple[SSTableRef, ...]]:
    """A clone tablet's SSTables per locality group, newest first: the SSTable ``tail`` holds
    for the group (its cells all after the cut), then the checkpoint's as they are."""
    groups = dict.fromkeys([*tail, *tablet.sstables])
    return {g: (*((tail[g],) if g in tail else ()), *tablet.sstables.get(g, ())) for g in groups}


def group_cells(cells: Iterable[Cell], schema: TableSchema) -> dict[str, list[Cell]]:
    """Sorted cells by locality group, as a minor compaction splits a memtable
    (``engine/tablet_sstables.py``): row deletions go to every group, cells of a family the
    schema no longer has to none."""
    groups: dict[str, list[Cell]] = {}
    everywhere = list(schema.locality_groups)
    for c in cells:
        if c.kind == CellKind.DELETE_ROW:
            for g in everywhere:
                groups.setdefault(g, []).append(c)
            continue
        fam = schema.families.get(c.family)
        if fam is not None:
            groups.setdefault(fam.locality_group, []).append(c)
    return groups
