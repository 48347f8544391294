"""bench/backup.py runs end to end on a tiny table, so it cannot rot (what it did, never how
fast)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bench.backup import BEGIN, END, PITR_BEGIN, PITR_END, main, markdown, run


@pytest.mark.parametrize(("database", "boto"), [("s3", "copy"), ("file", "download_file")])
def test_backup_bench_runs_and_reports(tmp_path: Path, database: str, boto: str) -> None:
    rows = asyncio.run(run(0.2, tmp_path, 1, database))
    assert f"({boto}, 0.2 MB)" in rows[1][2]
    labels = [r[0] for r in rows]
    assert labels[0].startswith("backup to another bucket")
    assert labels[1].startswith("restore from that bucket") and "200 rows" in labels[1]
    assert [label.startswith("clone of a") for label in labels[2:]] == [True, True]
    assert "| operation | tabletstore |" in markdown(rows, 0.2, 1)


def test_docs_puts_the_table_between_its_markers(tmp_path: Path) -> None:
    """``--docs PAGE`` replaces what is between the backup markers and nothing else (the
    point-in-time table's block stays); a page without them is refused before the run."""
    page = tmp_path / "page.md"
    pitr = f"{PITR_BEGIN}\nold pitr table\n{PITR_END}\n"
    page.write_text(f"# head\n{BEGIN}\nold table\n{END}\nprose\n{pitr}")
    main(["--mb", "0.2", "--repeats", "1", "--docs", str(page)])
    text = page.read_text()
    assert text.startswith(f"# head\n{BEGIN}\n| operation | tabletstore |")
    assert "old table" not in text and text.endswith(f"{END}\nprose\n{pitr}")
    bare = tmp_path / "bare.md"
    bare.write_text("# no markers\n")
    with pytest.raises(SystemExit):
        main(["--mb", "0.2", "--repeats", "1", "--docs", str(bare)])
    assert bare.read_text() == "# no markers\n"
