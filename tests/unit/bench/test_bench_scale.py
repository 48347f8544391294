"""The scale benchmark (bench/scale.py) runs its quick sizes end to end, so it cannot rot;
asserts what it counted, never how fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.scale import main

pytestmark = pytest.mark.timeout(600)


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
