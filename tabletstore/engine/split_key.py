"""Tablet splits: the pure planner (§5, §5.2).

"As a table grows, it is automatically split into multiple tablets, each approximately 100-200
MB in size by default" (§5). "Tablet splits are treated specially since they are initiated by a
tablet server. The tablet server commits the split by recording information for the new tablet
in the METADATA table. When the split has committed, it notifies the master." (§5.2)

This module decides, from plain values, *whether* a tablet splits (:func:`should_split`),
*where* (:func:`choose_split_key`) and *what the two children's records are*
(:func:`split_records`). The worker (:mod:`tabletstore.worker.splits`) gathers the inputs and
executes the split; the tablet (:meth:`tabletstore.engine.tablet.Tablet.splitting`) stops writes
and flushes.

The children share their parent's SSTables, as in the paper: each child's record lists every
SSTable of the parent, reads already clip to the child's row range, and a child's compactions
write out only its own rows (:func:`tabletstore.engine.compaction.merge_sstables` clips). Until a
child's first major compaction its size counts the shared SSTables fully, so a child that
still references an SSTable reaching outside its range never splits again
(:func:`owns_its_sstables`): that bounds split frequency to one split per major compaction,
which the worker schedules right after every split.

Where to split. The split key is the first row of a block (an SSTable block index entry), so a
row is never divided: rows below the key go left, the key's row and those above it go right.
Among those candidates the one closest to halving the bytes of the tablet's blocks is chosen,
and never one that leaves a side with no row at all. When the block index has no such key --
a tablet of one or two blocks, as with a split size near the block size -- the worker reads
the rows of the widest block (:func:`widest_block`) and splits at the middle one
(:func:`middle_row`).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from tabletstore.metadata.record import TabletRecord

__all__ = [
    "BlockSpan",
    "choose_split_key",
    "middle_row",
    "owns_its_sstables",
    "should_split",
    "split_records",
    "widest_block",
]


@dataclass(frozen=True, slots=True)
class BlockSpan:
    """One SSTable block as the split planner sees it: its rows and its bytes."""

    first_row: bytes
    last_row: bytes
    length: int


def owns_its_sstables(record: TabletRecord) -> bool:
    """Whether every SSTable of ``record`` holds only rows of its range -- false for a child
    of a split still sharing its parent's SSTables (its size then overstates its data)."""
    for refs in record.sstables.values():
        for ref in refs:
            if ref.first_row < record.start_row:
                return False
            if record.end_row is not None and ref.last_row >= record.end_row:
                return False
    return True


def should_split(record: TabletRecord, split_bytes: int) -> bool:
    """A tablet splits once its SSTables pass ``split_bytes`` -- unless it still shares SSTables
    with its sibling (see the module docstring: its size is not yet its own)."""
    return record.size >= split_bytes and owns_its_sstables(record)


def _overlaps(span: BlockSpan, start_row: bytes, end_row: bytes | None) -> bool:
    return span.last_row >= start_row and (end_row is None or span.first_row < end_row)


def choose_split_key(
    start_row: bytes, end_row: bytes | None, blocks: Iterable[BlockSpan]
) -> bytes | None:
    """The row at which to split ``[start_row, end_row)``, or None when no key leaves rows on
    both sides (an empty tablet, or one whose data is a single row).

    Only blocks overlapping the range count (a shared SSTable's other rows do not); a block
    straddling the key counts on the side of its first row.
    """
    spans = sorted(
        (b for b in blocks if _overlaps(b, start_row, end_row)), key=lambda b: b.first_row
    )
    if not spans:
        return None
    # A row known to be in the range: a block's first row, or for a block straddling
    # ``start_row`` its last row (its rows in between are unknown).
    lowest = min(b.first_row if b.first_row >= start_row else b.last_row for b in spans)
    candidates = sorted(
        {
            b.first_row
            for b in spans
            # > lowest: some row stays left. A block's first row is a row that exists and is
            # inside the range (< end_row), so the right side has at least that row.
            if b.first_row > lowest and (end_row is None or b.first_row < end_row)
        }
    )
    if not candidates:
        return None
    firsts = [b.first_row for b in spans]
    prefix = [0]
    for b in spans:
        prefix.append(prefix[-1] + b.length)
    total = prefix[-1]

    def imbalance(key: bytes) -> int:
        left = prefix[bisect.bisect_left(firsts, key)]  # blocks starting below the key
        return abs(2 * left - total)

    return min(candidates, key=lambda k: (imbalance(k), k))


def widest_block(
    start_row: bytes, end_row: bytes | None, blocks: Iterable[BlockSpan]
) -> BlockSpan | None:
    """The biggest block overlapping the range that holds more than one row: where to look for
    a split key inside a block when :func:`choose_split_key` finds none between blocks."""
    spans = [b for b in blocks if _overlaps(b, start_row, end_row) and b.first_row < b.last_row]
    return max(spans, key=lambda b: (b.length, b.first_row), default=None)


def middle_row(rows: Sequence[bytes], start_row: bytes) -> bytes | None:
    """The middle of ``rows`` (sorted row keys of the tablet), or None when no key leaves a row
    on each side."""
    if len(rows) < 2:
        return None
    key = rows[len(rows) // 2]
    return key if key > rows[0] and key > start_row else None


def split_records(
    parent: TabletRecord,
    key: bytes,
    *,
    left_id: str,
    right_id: str,
    left_epoch: int,
    right_epoch: int,
    location: str | None,
    at: float,
) -> tuple[TabletRecord, TabletRecord]:
    """The two children of ``parent`` split at ``key``: ``[start, key)`` and ``[key, end)``.

    Both reference all of the parent's SSTables (reads and compactions clip to their range)
    and inherit its redo point and logs -- empty after :meth:`Tablet.splitting` flushed the
    parent, so whoever loads a child replays and fences nothing. The right child keeps the
    parent's end row, i.e. its METADATA row (``Catalog.replace_tablets``).
    """
    if not parent.contains(key) or key == parent.start_row:
        raise ValueError(
            f"split key {key[:64]!r} does not leave rows on both sides of tablet "
            f"{parent.tablet_id} [{parent.start_row[:64]!r}, {parent.end_row!r})"
        )
    detail = f"from {parent.tablet_id} at {key[:64]!r}"
    base = replace(parent, location=location, events=parent.events)
    left = replace(base, tablet_id=left_id, end_row=key, epoch=left_epoch)
    right = replace(base, tablet_id=right_id, start_row=key, epoch=right_epoch)
    return left.with_event(at, "split", detail), right.with_event(at, "split", detail)
