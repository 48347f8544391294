"""The event loop's lag and stall reports (ops/loop_lag.py), on a real loop held on purpose."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

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
    async with LoopLag(lags.append, interval=0.01, stall_seconds=0.05) as monitor:
        await until(lambda: len(lags) >= 1)
        _hold_the_loop(0.5)
        seen = len(lags)
        await until(lambda: len(lags) > seen)
        watchdog = monitor._watchdog
    assert monitor.reports == 1, caplog.text
    (record,) = [r for r in caplog.records if "event loop held" in r.getMessage()]
    assert "_hold_the_loop" in record.getMessage()
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
