"""A short chaos run with a replica (``python -m bench.chaos --replicate``): a second cluster
follows the chaos table through ``tabletstore replicate`` while the nemesis kills the
source's workers and its master; after the writers stop, every source change was applied to
the replica exactly once and the replica equals the source cell for cell.

The check itself is tested on hand-made streams in tests/unit/testing/test_chaos_replica.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tabletstore.testing.chaos.runner import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SEED = 34
#: Seed 34's schedule in 45 s: the master killed at 5 s, a worker at 18 s and another at
#: 32 s, each followed by writes the replica must apply.
SECONDS = 45.0


def test_a_replica_follows_through_source_kills(tmp_path: Path) -> None:
    config = ChaosConfig(
        seconds=SECONDS,
        seed=SEED,
        directory=tmp_path,
        faults=("kill_worker", "kill_master"),
        first_fault=5.0,
        gap=(10.0, 15.0),
        writers=4,
        readers=1,
        transactors=2,
        replicate=True,
    )
    report = asyncio.run(run_chaos(config))
    print(report.summary())
    assert report.faults.get("kill_worker"), report.summary()
    replica = report.replica
    assert replica is not None, report.summary()
    assert replica.incomplete is None, report.summary()
    assert replica.applied > 0 and replica.source_cells > 0, report.summary()
    assert not replica.lost and not replica.repeated and not replica.foreign, report.summary()
    assert not replica.differing, report.summary()
    assert not report.verdict.lost and not report.verdict.unread, report.summary()
    assert "replica equals source: yes" in report.summary()
