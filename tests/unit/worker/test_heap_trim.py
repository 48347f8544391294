"""Giving freed heap memory back (worker/heap_trim.py): the decision, and real trims on glibc."""

from __future__ import annotations

import asyncio
import os
import random

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tabletstore.embedded import Database
from tabletstore.options import IN_PROCESS_LEASE, WorkerOptions
from tabletstore.worker import heap_trim
from tabletstore.worker.heap_trim import HeapTrimmer, heap_free_bytes, heap_stats, should_trim

glibc = pytest.mark.skipif(
    heap_trim._LIBC is None, reason="malloc_trim and mallinfo2 are glibc's (2.33 on)"
)


def test_should_trim_only_past_the_threshold_and_only_with_glibc() -> None:
    assert should_trim(65 << 20, 64 << 20)
    assert not should_trim(64 << 20, 64 << 20)
    assert not should_trim(0, 0)
    assert not should_trim(None, 0)


def test_a_trimmer_refuses_a_bad_interval_or_threshold() -> None:
    with pytest.raises(ValueError, match="positive interval"):
        HeapTrimmer(0, 1)
    with pytest.raises(ValueError, match="non-negative free bytes"):
        HeapTrimmer(1, -1)


def _scattered_garbage() -> None:
    """Frees 60 MB of 1000-byte values between live ones: free chunks inside the heap, which
    glibc keeps (only the heap's top is given back on free)."""
    values = [os.urandom(1) * 1000 for _ in range(100_000)]
    rnd = random.Random(1)
    for i in rnd.sample(range(len(values)), 60_000):
        values[i] = b""
    _scattered_garbage.keep = values  # type: ignore[attr-defined]


@glibc
def test_free_bytes_are_counted_and_a_trim_runs_past_the_threshold() -> None:
    _scattered_garbage()
    stats = heap_stats()
    assert stats is not None and stats.free > 10 << 20
    assert stats.in_use > 40 << 20  # the 40 MB of values still held, at least
    free = stats.free
    # Under the threshold: a reading, nothing done.
    reading, result = heap_trim._trim_if_needed(free + 1)
    assert result is None and reading is not None and reading.free == free
    reading, result = heap_trim._trim_if_needed(0)
    assert result is not None and result.free_before == free


@glibc
async def test_the_trimmer_trims_on_its_interval_until_cancelled() -> None:
    _scattered_garbage()
    trimmer = HeapTrimmer(0.01, 0)
    assert trimmer.available
    task = asyncio.create_task(trimmer.run())
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while trimmer.trims < 2:
        assert loop.time() < deadline, "no two trims within 30 s"
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_without_glibc_the_trimmer_does_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap_trim, "_LIBC", None)
    trimmer = HeapTrimmer(0.01, 0)
    assert not trimmer.available and heap_free_bytes() is None and heap_stats() is None
    await asyncio.wait_for(trimmer.run(), timeout=5)  # returns at once
    assert trimmer.trims == 0


@glibc
async def test_a_worker_trims_its_heap_and_stops_trimming_when_it_stops() -> None:
    options = WorkerOptions(lease=IN_PROCESS_LEASE, heap_trim_interval=0.01, heap_trim_free_bytes=0)
    db = await Database.open("memory://heap-trim", worker_options=options, instrument=True)
    try:
        trimmer = db.worker.heap_trimmer
        assert trimmer is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 30
        while trimmer.trims < 1:
            assert loop.time() < deadline, "the worker did not trim within 30 s"
            await asyncio.sleep(0.01)
        # Its last reading and its trims are the worker's metrics.
        families = {f.name: f for f in text_string_to_metric_families(await db.metrics_text())}
        assert families["tabletstore_heap_in_use_bytes"].samples[0].value > 0
        assert "tabletstore_heap_free_bytes" in families
        assert families["tabletstore_heap_trims"].samples[0].value >= 1
    finally:
        await db.close()
    trims = trimmer.trims
    await asyncio.sleep(0.05)
    assert trimmer.trims == trims, "trimming went on after the worker stopped"


async def test_a_worker_told_not_to_trim_has_no_trimmer() -> None:
    options = WorkerOptions(lease=IN_PROCESS_LEASE, heap_trim_interval=None)
    async with await Database.open("memory://no-heap-trim", worker_options=options) as db:
        assert db.worker.heap_trimmer is None
