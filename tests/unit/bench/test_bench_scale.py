"""The scale benchmark (bench/scale.py) runs its quick sizes end to end, so it cannot rot;
asserts what it counted, never how fast."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from bench.scale import main

# In-process simulations (no tabletstore process, no lease on the clock): beside the
# Terraform tests, off the sequential group of the clusters (tests/conftest.py).
pytestmark = [pytest.mark.slow, pytest.mark.no_cluster, pytest.mark.timeout(1200)]


def test_scale_bench_quick_recovers_every_tablet_and_counts_the_paths(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    package = logging.getLogger("tabletstore")
    level = package.level
    assert main(["--quick", "--steady-seconds", "0.5", "--json", str(out)]) == 0
    # Quiet for its run only: later tests in this process read the package's warnings.
    assert package.level == level
    results = json.loads(out.read_text())["results"]
    assert [r["workers"] for r in results] == [10, 100]
    for r in results:
        assert r["dead_worker"]["tablets_recovered"] > 0
        rack = r["rack_failure"]
        if rack["workers_killed"] > 1:  # the dead logs' owners spread over the survivors
            assert rack["most_taken_by_one_worker"] < rack["tablets_recovered"]
        assert r["clients"]["new_client"] == {"coordinator_reads": 1, "metadata_reads": 2}
        # Workers open no watches; the master one per prefix its rounds depend on.
        assert r["coordinator"]["worker_watches"] == 0
        assert r["coordinator"]["master_watches"] == 3
        assert r["balancing"]["moves_to_converge"] > 0
        # A load reads its tablet's one METADATA row (was every row of its table: 100).
        assert r["initial"]["loads"] >= r["tablets"]
        assert r["initial"]["worker_metadata_rows_read"] <= 2 * r["initial"]["loads"]
        # The leader's steady rounds read no claim and no METADATA row.
        assert r["steady_round"]["master_keys_read"] == 0
        assert r["steady_round"]["metadata_reads"] == 0
        # The balancer asks the workers side by side.
        assert r["balancing"]["status_polls_in_flight_max"] > 1


async def test_an_assignment_round_plans_every_user_table_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One plan for the root, one for METADATA, one for every user tablet of every table: a plan
    per table re-weighed every tablet known so far (O(tables x tablets) per round)."""
    from bench.scale import SimCluster
    from tabletstore.master import assignment

    cluster = SimCluster(10, 500)  # 5 tables
    try:
        await cluster.add_workers(10)
        await cluster.master.assign()
        await cluster.create_tables()
        plans = 0
        plan = assignment.plan

        def counting(*args: object, **kwargs: object) -> list[assignment.Assignment]:
            nonlocal plans
            plans += 1
            return plan(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(assignment, "plan", counting)
        await cluster.assign_until_served()
        rounds = plans
        plans = 0
        await cluster.master.assign()
        assert plans == 3, f"{plans} plans in one round ({rounds} in the first rounds)"
    finally:
        await cluster.close()


async def test_a_steady_periodic_round_reads_no_claim_and_no_metadata_row() -> None:
    """The leader's periodic round (``assign(if_changed=True)``) with nothing changed since a
    round that found every tablet served reads nothing: it was a range read of every claim
    and a scan of every METADATA row, O(tablets) every second. A claim deleted (a worker's
    lease revoked) makes the next one run and place the tablets."""
    from bench.scale import SimCluster
    from tabletstore.coordination import paths
    from tabletstore.metadata import rows as mt

    cluster = SimCluster(10, 500)
    try:
        await cluster.add_workers(10)
        await cluster.master.assign()
        await cluster.create_tables()
        await cluster.assign_until_served()
        await cluster.master.assign(if_changed=True)  # opens the watches: a full round
        keys, md_reads = cluster.master_counts["keys read"], cluster.metadata.reads
        for _ in range(5):
            assert await cluster.master.assign(if_changed=True) == 0
        assert cluster.master_counts["keys read"] == keys
        assert cluster.metadata.reads == md_reads
        assert cluster.master.changes.skipped == 5
        # A worker dies: the next periodic round places its tablets.
        victim = next(
            w
            for wid, w in cluster.workers.items()
            if wid
            not in {
                kv.value.decode()
                for kv in cluster.shared.state.range(paths.claims_prefix(mt.METADATA_TABLE_ID))
            }
        )
        held = cluster.placement()[victim.worker_id]
        await victim.crash()
        assert victim.lease is not None
        await cluster.master_coord.revoke_lease(victim.lease.id)
        del cluster.workers[victim.worker_id]
        await asyncio.sleep(0)  # the watch takes the deletions
        placed = 0
        for _ in range(5):
            placed += await cluster.master.assign(if_changed=True)
        assert held > 0 and placed == held
        assert cluster.served() == cluster.total_tablets
    finally:
        await cluster.close()


def test_balancing_100_workers_plus_10_converges_in_tens_of_rounds() -> None:
    """At 2 moves a round, adding 10 empty workers to 100 took 418 rounds (23 minutes at the
    default cooldown); moves per round now grow with the cluster."""
    from bench.scale import converge
    from tabletstore.master import assignment
    from tabletstore.options import MasterOptions

    old = [f"w{i:03d}" for i in range(100)]
    new = [f"n{i:02d}" for i in range(10)]
    loads = [
        assignment.TabletLoad(f"t{i // 100}", f"x{i:05d}", old[i % 100], size=64 << 20)
        for i in range(10_000)
    ]
    moves, rounds = converge(old + new, loads, options=MasterOptions())
    assert moves > 0 and rounds <= 100, f"{moves} moves in {rounds} rounds"
