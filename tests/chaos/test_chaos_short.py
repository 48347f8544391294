"""The short chaos run: about a minute of writers and readers on real processes
while every kind of fault is injected on a fixed seed; the checker must find nothing, and
``verify`` must find the bucket whole.

What the harness does and checks is in ``tabletstore/testing/chaos``; the long run is
``python -m bench.chaos --minutes N --seed S``.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tabletstore.testing.chaos.nemesis import PROCESS_FAULTS
from tabletstore.testing.chaos.runner import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

SEED = 11
#: Eight faults, one of each kind, 6 to 9 s apart (seed 11: the last, kill_master, at 53 s):
#: the schedule fits in the workload's time.
SECONDS = 60.0


def test_short_chaos_run_loses_nothing(tmp_path: Path) -> None:
    config = ChaosConfig(
        seconds=SECONDS,
        seed=SEED,
        directory=tmp_path,
        # The partitions have their own test (test_partitions.py), and the etcd-member faults
        # need three members (test_etcd_members.py).
        faults=PROCESS_FAULTS,
        first_fault=3.0,
        gap=(6.0, 9.0),
    )
    report = asyncio.run(run_chaos(config))
    print(report.summary())
    assert report.faults, f"no fault was applied: {report.nemesis_errors}"
    # The sort faults ran against the sorted recovery: a sorter died mid-task, a
    # task ran twice; a duplicate finding other bytes would be a Corruption error here. (A
    # sort fault whose victim's log was not sorted in time -- a victim with one tablet, or
    # METADATA still being recovered -- is reported as a nemesis error, not applied.)
    assert not [e for e in report.nemesis_errors if "Corruption" in e], report.nemesis_errors
    assert {"kill_sorter", "sort_twice"} & set(report.faults), report.summary()
    v = report.verdict
    assert not v.lost and not v.unread, report.summary()
    assert not v.wrong_reads, report.summary()
    assert not v.double_serving, report.summary()
    # The healed cluster's bucket verifies whole (tabletstore verify): nothing lost or damaged.
    assert report.verify is not None and report.verify.ok, report.summary()
