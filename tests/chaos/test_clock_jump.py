"""A worker's wall clock stepped forward and back (the ``clock_jump`` fault): the worker takes
the steps up (its log says so), keeps its lease (leases read the monotonic clock, which a step
leaves alone) and serves on, and the checker finds nothing: no double-serving, and every cell
linearizable - the transactors' registers take the worker's own timestamps, so a put stamped
below an earlier one after the step back would show as a stale read."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tabletstore.testing.chaos.nemesis import CLOCK_STEP
from tabletstore.testing.chaos.runner import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_clock_jump_forward_and_back(tmp_path: Path) -> None:
    config = ChaosConfig(
        seconds=35.0,
        seed=3,
        directory=tmp_path,
        faults=("clock_jump",),
        lease_ttl=5.0,
        first_fault=3.0,
        gap=(60.0, 60.0),  # one jump
    )
    report = asyncio.run(run_chaos(config))
    print(report.summary())
    assert report.faults == {"clock_jump": 1}, report.summary()
    faults = json.loads(report.history_path.read_text())["faults"]
    (jump,) = [f for f in faults if f["kind"] == "clock_jump"]
    # The worker took up both steps and the return (its log), and was never stopped by them.
    log = (tmp_path / f"{jump['target']}.log").read_text()
    steps = [line for line in log.splitlines() if "wall clock stepped by" in line]
    assert [s.split("stepped by ")[1].split()[0] for s in steps] == [
        f"+{CLOCK_STEP:.3f}",
        f"-{2 * CLOCK_STEP:.3f}",
        f"+{CLOCK_STEP:.3f}",
    ], steps
    assert jump["detail"]["still_running"], report.summary()
    v = report.verdict
    assert v.operations.get("cas:ok", 0) + v.operations.get("put:ok", 0) > 0, report.summary()
    assert not v.lost and not v.unread, report.summary()
    assert not v.wrong_reads, report.summary()
    assert not v.double_serving, report.summary()
    assert not v.linearizability.violations, report.summary()
