"""``python -m bench.attacks --quick`` runs end to end: a ``local-stack up --tls`` with a front
door, the idle baseline, and one short round of every attack, each with a row. Asserts what
became of the attacks' requests (refused, or taken and bounded), never how fast anything was.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.attacks import ATTACKS, PATHS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
#: The attacks every request of which must be refused (the others are taken and bounded).
REFUSED = {"1", "2", "4", "5", "8", "-"}


def test_the_attack_benchmark_produces_a_row_per_attack(tmp_path: Path) -> None:
    out = tmp_path / "attacks.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    # Its own process: the benchmark lowers its priority while it attacks.
    done = subprocess.run(
        [sys.executable, "-m", "bench.attacks", "--quick", "--json", str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert set(figures["idle"]["p99"]) == {f"{w} {o}" for w, o in PATHS}
    assert set(figures["idle"]["rss"]) == {"master", "worker-0", "front door"}
    rows = {row["finding"]: row for row in figures["attacks"]}
    assert set(rows) == {finding for finding, _, _ in ATTACKS}
    for finding, row in rows.items():
        assert row["verdict"] in ("ok", "over") or row["verdict"].startswith("over ("), row
        assert row["p99_ratio"] > 0 and row["rss_ratio"] > 0, row
        assert set(row["cpu"]) == {"master", "worker-0", "front door"}, row
        if finding == "0":  # the control: no attack
            assert row["outcome"] == "-", row
            continue
        assert row["refused"] + row["taken"] > 0, row
        if finding in REFUSED:
            assert row["outcome"] == "refused", row
    assert "| finding | attack |" in done.stdout
