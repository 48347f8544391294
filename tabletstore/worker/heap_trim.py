"""Giving a worker's freed heap memory back to the operating system (glibc's ``malloc_trim``).

A tablet server's memory is bounded by its settings: the memtables (§5.3), the block cache
(§6), the compactions' inputs and outputs. But CPython allocates every object above 512 bytes
(a 1000-byte value, a row of cells) with the C allocator, and glibc keeps what is freed in its
arenas: it returns memory to the system only from the top of a heap, so a compaction's peak
of short-lived values, freed under longer-lived ones, stays in the process's resident set. A
worker's RSS then follows the largest it ever held, not what it holds. ``malloc_trim(0)``
releases every whole free page inside the arenas (``madvise(MADV_DONTNEED)``); it takes
each arena's lock while it walks it, so it runs on a thread and only when enough is free.

:class:`HeapTrimmer` checks every ``interval`` seconds, on a thread, how many bytes glibc holds
free (``mallinfo2``) and trims when they exceed ``free_bytes``. On a C library without these
calls (musl, macOS) it does nothing. The decision is :func:`should_trim`, pure. Each check's
reading (:class:`HeapStats`: bytes in use and free) is kept for the worker's ``/metrics``,
where it tells an RSS of live objects from one of free fragments: ``mallinfo2`` walks every
free chunk of every arena under its lock, so it is read on the trimmer's thread, not at
scrape time.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
from dataclasses import dataclass
from typing import Final

__all__ = ["HeapStats", "HeapTrimmer", "TrimResult", "heap_free_bytes", "heap_stats", "should_trim"]

log = logging.getLogger(__name__)

_MALLINFO2_FIELDS: Final = (
    "arena",
    "ordblks",
    "smblks",
    "hblks",
    "hblkhd",
    "usmblks",
    "fsmblks",
    "uordblks",
    "fordblks",
    "keepcost",
)


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in _MALLINFO2_FIELDS]


def _glibc() -> ctypes.CDLL | None:
    """glibc, when this process runs on it and it has ``mallinfo2`` (2.33 on) and
    ``malloc_trim``; else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        mallinfo2 = libc.mallinfo2
        libc.malloc_trim  # noqa: B018 -- present, or AttributeError
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _Mallinfo2
    mallinfo2.argtypes = []
    libc.malloc_trim.restype = ctypes.c_int
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return libc


_LIBC: Final = _glibc()


@dataclass(frozen=True, slots=True)
class HeapStats:
    """One reading of glibc's heap."""

    #: Bytes allocated and not freed: in the arenas (``uordblks``) and in chunks mapped on
    #: their own (``hblkhd``, allocations of 128 KiB and more).
    in_use: int
    #: Bytes free inside the arenas (``fordblks``): resident until trimmed, unless the pages
    #: were never touched or were given back already.
    free: int


def heap_stats() -> HeapStats | None:
    """glibc's heap now (``mallinfo2``); None without glibc."""
    if _LIBC is None:
        return None
    info = _LIBC.mallinfo2()
    return HeapStats(in_use=int(info.uordblks) + int(info.hblkhd), free=int(info.fordblks))


def heap_free_bytes() -> int | None:
    """Bytes glibc holds free in its arenas (``mallinfo2().fordblks``); None without glibc."""
    stats = heap_stats()
    return None if stats is None else stats.free


def should_trim(free_bytes: int | None, threshold: int) -> bool:
    """Whether to trim: glibc is there and holds more than ``threshold`` bytes free."""
    return free_bytes is not None and free_bytes > threshold


@dataclass(frozen=True, slots=True)
class TrimResult:
    """One trim: the free bytes glibc held before and after it."""

    free_before: int
    free_after: int

    @property
    def released(self) -> int:
        return max(0, self.free_before - self.free_after)


def _trim_if_needed(threshold: int) -> tuple[HeapStats | None, TrimResult | None]:
    """On a thread: the heap's reading, and a trim when more than ``threshold`` bytes are
    free (None when not)."""
    stats = heap_stats()
    if _LIBC is None or stats is None or not should_trim(stats.free, threshold):
        return stats, None
    _LIBC.malloc_trim(0)
    after = heap_free_bytes()
    return stats, TrimResult(stats.free, stats.free if after is None else after)


class HeapTrimmer:
    """Trims the heap every ``interval`` seconds when more than ``free_bytes`` are free
    (``WorkerOptions.heap_trim_interval``, ``heap_trim_free_bytes``)."""

    def __init__(self, interval: float, free_bytes: int) -> None:
        if interval <= 0 or free_bytes < 0:
            raise ValueError(
                f"heap trimming needs a positive interval and non-negative free bytes, got "
                f"{interval} s and {free_bytes} bytes"
            )
        self.interval = interval
        self.free_bytes = free_bytes
        #: Trims made, and the free bytes they released in all.
        self.trims = 0
        self.released = 0
        #: The last check's reading (before its trim, if it trimmed); None before the first.
        self.last: HeapStats | None = None

    @property
    def available(self) -> bool:
        """Whether this process can trim (glibc)."""
        return _LIBC is not None

    async def run(self) -> None:
        """Check and trim until cancelled; nothing at all without glibc."""
        if _LIBC is None:
            return
        while True:  # the first check at once: its reading is the metrics' from the start
            self.last, result = await asyncio.to_thread(_trim_if_needed, self.free_bytes)
            if result is not None:
                self.trims += 1
                self.released += result.released
                log.debug(
                    "heap trimmed: %d MB free before, %d MB after",
                    result.free_before >> 20,
                    result.free_after >> 20,
                )
            await asyncio.sleep(self.interval)
