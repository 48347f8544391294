"""Reversed scans: a tablet's rows in descending key order, in bounded windows (§3, §5.3).

The paper's scans go forward: SSTables are sequences of blocks in key order and the merge of
the memtable and the SSTables (§5.3) yields cells in that order. A reversed scan (Cloud
Bigtable's ``ReadRowsRequest.reversed``) walks the same merged view backwards without a
backward merge: it cuts ``[start, end)`` into windows from the top down, scans each window
forward with the ordinary merge (deletions, GC, filters applied exactly as forward), and hands
the window's rows out in reverse. Windows are bounded so memory stays bounded: a window's lower
edge is the highest of

* the first row of an SSTable block below the window's top (the block index is in memory), and
* the row :data:`MEMTABLE_WINDOW_ROWS` rows below the top in each memtable,

so a window holds at most about one block of each SSTable and that many memtable rows.
Which rows a window holds does not matter for correctness, only its bounds: every row of
``[start, end)`` is in exactly one window, and windows are visited top down.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence

__all__ = ["MEMTABLE_WINDOW_ROWS", "next_window_start", "sorted_block_starts"]

#: Memtable rows in one window of a reversed scan (at most).
MEMTABLE_WINDOW_ROWS = 256

#: ``probe(upper, start)``: a memtable's row :data:`MEMTABLE_WINDOW_ROWS` rows below ``upper``
#: (exclusive; None = the end) and above ``start``, or None if it has fewer rows there.
MemtableProbe = Callable[[bytes | None, bytes], bytes | None]


def sorted_block_starts(first_rows: Iterable[bytes]) -> list[bytes]:
    """The SSTables' block first rows, sorted and unique: window edges to pick from."""
    return sorted(set(first_rows))


def next_window_start(
    upper: bytes | None,
    start: bytes,
    block_starts: Sequence[bytes],
    probes: Iterable[MemtableProbe],
) -> bytes:
    """The lower edge of the window ``[edge, upper)`` of a reversed scan of ``[start, ...)``:
    the highest candidate strictly between ``start`` and ``upper``, or ``start`` when there is
    none (the last window)."""
    best = start
    i = len(block_starts) if upper is None else bisect_left(block_starts, upper)
    if i > 0 and block_starts[i - 1] > best:
        best = block_starts[i - 1]
    for probe in probes:
        key = probe(upper, best)
        if key is not None and key > best:
            best = key
    return best
