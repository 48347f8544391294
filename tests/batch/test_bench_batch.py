"""``python -m bench.batch`` runs end to end on a tiny table, so it cannot rot (it asserts
its own counts; nothing here looks at how fast)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_batch_benchmark_runs() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.batch",
            "--rows",
            "400",
            "--repeats",
            "1",
            "--load-repeats",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=ROOT,
        env={**os.environ},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for line in (
        "| bulk load / import |",
        "| tabletstore.batch, 1 process |",
        "on Dask, 2 workers",
    ):
        assert line in out.stdout
