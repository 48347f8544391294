"""The event loop's lag and stall reports (ops/loop_lag.py) and the collector's pauses
(ops/gc_pauses.py), on a real loop held on purpose."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time

import pytest

from tabletstore.ops.gc_pauses import GcPauses
from tabletstore.ops.loop_lag import LoopLag
from tabletstore.ops.metrics import WorkerMetrics
from tests.tablet_harness import until


def _hold_the_loop(seconds: float) -> None:
    time.sleep(seconds)  # what a CPU-bound step left on the loop does to every other request


async def test_a_held_loop_shows_as_lag() -> None:
    lags: list[float] = []
    async with LoopLag(lags.append, interval=0.01):
        await until(lambda: len(lags) >= 3)
        _hold_the_loop(0.3)
        seen = len(lags)
        await until(lambda: len(lags) > seen)
    assert max(lags) >= 0.25, lags
    assert min(lags) < 0.25  # the other wake-ups were on time (or near it)


async def test_a_stall_is_reported_once_with_the_stack_that_held_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lags: list[float] = []
    caplog.set_level(logging.WARNING, logger="tabletstore.ops.loop_lag")
    # Every stall reported (report_every=0): a loaded machine may stall this process on
    # its own too, and the rate limit would then hide the stall held on purpose.
    async with LoopLag(lags.append, interval=0.01, stall_seconds=0.05, report_every=0.0) as monitor:
        await until(lambda: len(lags) >= 1)
        _hold_the_loop(0.5)
        seen = len(lags)
        await until(lambda: len(lags) > seen)
        watchdog = monitor._watchdog
    held = [r.getMessage() for r in caplog.records if "_hold_the_loop" in r.getMessage()]
    assert len(held) == 1, caplog.text  # once, however long it lasted
    assert held[0].startswith("event loop held for ")
    assert watchdog is not None and not watchdog.is_alive()


async def test_without_a_stall_threshold_there_is_no_watchdog(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lags: list[float] = []
    async with LoopLag(lags.append, interval=0.01) as monitor:
        _hold_the_loop(0.1)
        await until(lambda: len(lags) >= 1)
    assert monitor._watchdog is None and monitor.reports == 0
    assert "event loop held" not in caplog.text


async def test_a_workers_lag_is_on_its_metrics() -> None:
    metrics = WorkerMetrics("w-lag")
    async with LoopLag(metrics.loop_lag.observe, interval=0.01):
        _hold_the_loop(0.06)
        await asyncio.sleep(0.05)
    text = metrics.exposition().decode()
    assert 'tabletstore_event_loop_lag_seconds_bucket{le="0.001"}' in text
    count = next(
        float(line.split()[-1])
        for line in text.splitlines()
        if line.startswith("tabletstore_event_loop_lag_seconds_count")
    )
    assert count >= 1


def test_gc_pauses_are_timed_by_generation_while_installed() -> None:
    seen: list[tuple[int, float]] = []
    with GcPauses(lambda generation, seconds: seen.append((generation, seconds))) as pauses:
        gc.collect()
        gc.collect(0)
    assert seen[0][0] == 2 and seen[0][1] > 0
    assert seen[1][0] == 0 and pauses.collections == 2
    assert pauses.total == pytest.approx(seen[0][1] + seen[1][1])
    assert pauses.by_generation == {0: seen[1][1], 1: 0.0, 2: seen[0][1]}
    assert pauses.collecting is None
    gc.collect()
    assert len(seen) == 2, "removed with the block"


async def test_a_stall_report_says_how_much_of_it_the_collector_took(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="tabletstore.ops.loop_lag")
    lags: list[float] = []
    junk = [[i] for i in range(200_000)]  # tracked objects for each full collection to walk
    with GcPauses(lambda generation, seconds: None) as pauses:
        async with LoopLag(
            lags.append, interval=0.01, stall_seconds=0.05, gc_pauses=pauses, report_every=0.0
        ) as monitor:
            await until(lambda: len(lags) >= 1)
            # The loop held by full collections until the watchdog thread reports it (on a
            # loaded machine it may take more than the half second that used to be given).
            end = time.monotonic() + 60
            while monitor.reports == 0 and time.monotonic() < end:
                gc.collect()
            seen = len(lags)
            await until(lambda: len(lags) > seen)
            # What the report adds up (the watchdog's timing is the machine's: on a loaded
            # one the stall it reports may have begun before the first collection).
            monitor._gc_at_due = dict(pauses.by_generation)
            monitor._gc_at_due[2] -= 0.25
            monitor._gc_at_due[0] -= 0.01
            assert monitor._collected(time.monotonic()) == (
                "; garbage collection: 260 ms of it (250 ms in generation 2, 10 ms in generation 0)"
            )
            pauses.collecting = (1, time.monotonic() - 0.1)
            assert "garbage collection: 36" in monitor._collected(time.monotonic())
            assert re.search(r"1\d\d ms in generation 1", monitor._collected(time.monotonic()))
            pauses.collecting = None
    del junk
    assert monitor.reports >= 1, caplog.text
    message = next(r.getMessage() for r in caplog.records if "event loop held" in r.getMessage())
    assert re.search(r"garbage collection: \d+ ms of it \(\d+ ms in generation 2", message), message


def test_a_workers_gc_pauses_are_on_its_metrics() -> None:
    metrics = WorkerMetrics("w-gc")
    with GcPauses(metrics.observe_gc):
        gc.collect()
    text = metrics.exposition().decode()
    assert 'tabletstore_gc_pause_seconds_count{generation="2"} 1.0' in text
