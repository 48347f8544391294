"""``python -m bench.changes`` runs end to end on a tiny size, so it cannot rot: a local
cluster of one worker process, 300 writes, a reader process following and one catching up,
then 300 more with a replicator process following into a second cluster; the table lands in
a page between its markers (``--docs``). Asserts what was read and reported, never how fast (the benchmark itself fails when the
follower did not read every write)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.changes import main
from tests.integration.cluster_harness import PROCESS_ENV

pytestmark = pytest.mark.timeout(300)


def test_bench_changes_reads_every_write_and_reports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in PROCESS_ENV.items():
        monkeypatch.setenv(k, v)
    out, md = tmp_path / "changes.json", tmp_path / "changes.md"
    page = tmp_path / "page.md"
    page.write_text(
        "before\n<!-- bench.changes: begin -->\nold\n<!-- bench.changes: end -->\nafter\n"
    )
    argv = [
        "--scale", "0.0003",  # 300 writes
        "--workers", "1",
        "--concurrency", "8",
        "--dir", str(tmp_path / "work"),
        "--json", str(out),
        "--markdown", str(md),
        "--docs", str(page),
    ]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(out.read_text())
    phases = {r["phase"]: r for r in doc["results"]}
    assert set(phases) == {"follow", "catch-up", "replicate"}
    for r in phases.values():
        assert r["changes"] == 300
        assert r["segments_fetched"] >= 1 and r["segments_per_change"] is not None
    for lagged in ("follow", "replicate"):
        assert phases[lagged]["lag_p50_ms"] > 0
        assert phases[lagged]["lag_p99_ms"] >= phases[lagged]["lag_p50_ms"]
    table = md.read_text()
    assert "| follow | 300 |" in table and "| catch-up | 300 |" in table
    assert "| replicate | 300 |" in table
    docs = page.read_text()
    assert docs.startswith("before\n<!-- bench.changes: begin -->\n| phase |")
    assert (
        "old" not in docs
        and table in docs
        and docs.endswith("<!-- bench.changes: end -->\nafter\n")
    )
