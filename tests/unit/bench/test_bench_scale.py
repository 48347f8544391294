"""The scale benchmark (bench/scale.py) runs its quick sizes end to end, so it cannot rot;
asserts what it counted, never how fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.scale import main

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def test_scale_bench_quick_recovers_every_tablet_and_counts_the_paths(tmp_path: Path) -> None:
    out = tmp_path / "scale.json"
    assert main(["--quick", "--steady-seconds", "0.5", "--json", str(out)]) == 0
    results = json.loads(out.read_text())["results"]
    assert [r["workers"] for r in results] == [10, 100]
    for r in results:
        assert r["dead_worker"]["tablets_recovered"] > 0
        rack = r["rack_failure"]
        if rack["workers_killed"] > 1:  # the dead logs' owners spread over the survivors
            assert rack["most_taken_by_one_worker"] < rack["tablets_recovered"]
        assert r["clients"]["new_client"] == {"coordinator_reads": 1, "metadata_reads": 2}
        assert r["coordinator"]["watches"] == 0
        assert r["balancing"]["moves_to_converge"] > 0


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
