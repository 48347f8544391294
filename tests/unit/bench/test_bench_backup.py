"""bench/backup.py runs end to end on a tiny table, so it cannot rot (what it did, never how
fast)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.backup import markdown, run


@pytest.mark.parametrize(("database", "boto"), [("s3", "copy"), ("file", "download_file")])
def test_backup_bench_runs_and_reports(tmp_path: Path, database: str, boto: str) -> None:
    rows = asyncio.run(run(0.2, tmp_path, 1, database))
    assert f"({boto}, 0.2 MB)" in rows[1][2]
    labels = [r[0] for r in rows]
    assert labels[0].startswith("backup to another bucket")
    assert labels[1].startswith("restore from that bucket") and "200 rows" in labels[1]
    assert [label.startswith("clone of a") for label in labels[2:]] == [True, True]
    assert "| operation | tabletstore |" in markdown(rows, 0.2, 1)
