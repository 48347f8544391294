"""The recovery benchmark (bench/recovery.py) runs end to end on a tiny log, so it cannot
rot; asserts what it measured about bytes, never how fast."""

from __future__ import annotations

import json
from pathlib import Path

from bench.recovery import main


def test_recovery_bench_reports_reads_per_method(tmp_path: Path) -> None:
    out = tmp_path / "recovery.json"
    argv = ["--log-mb", "0.3", "--tablets", "3", "--sorters", "1", "--json", str(out)]
    assert main(argv) == 0
    rows = {(r["method"], r["sorters"]): r for r in json.loads(out.read_text())["results"]}
    direct, sorted_ = rows[("direct replay", 0)], rows[("sorted", 1)]
    assert direct["log_read_ratio"] == 3.0  # every tablet reads the whole log
    assert sorted_["log_read_ratio"] == 1.0  # the sorter reads it once
    assert sorted_["read_ratio"] < 2.2  # plus each tablet's runs, about the log again
    assert sorted_["tasks"] >= 1 and sorted_["sort_seconds"] > 0
    # A sorter that replays the tablets it sorted reads the runs from its memory.
    owner = rows[("sorted, owner sorts", 1)]
    assert owner["log_read_ratio"] == 1.0 and owner["read_ratio"] < 1.2
    # A worker owning a log of several tasks sorts them in its process pool: read once.
    pool = rows[("sorted, owner sorts (pool processes)", 1)]
    assert pool["tasks"] > 1
    assert pool["log_read_ratio"] == 1.0 and pool["read_ratio"] < 1.2
