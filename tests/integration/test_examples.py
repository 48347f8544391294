"""Every runnable example in examples/ runs as a user would run it, and says what it shows."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
ENV = {k: v for k, v in os.environ.items() if not k.startswith("TABLETSTORE_")}

EXPECTED = {
    "webtable.py": [
        "anchor:cnnsi.com     t9   'CNN'",
        "anchor:my.look.ca    t8   'CNN.com'",
        "com.cnn.www/world",
        "keeps versions [7, 6, 5]",
    ],
    "figure2_write.py": [
        "before  anchors of com.cnn.www: {'www.abc.com': 'CNN'}",
        "after   anchors of com.cnn.www: {'www.c-span.org': 'CNN'}",
    ],
    "figure3_read.py": [
        "com.cnn.www anchor:cnnsi.com 9 CNN\n",
        "com.cnn.www anchor:cnnsi.com 4 CNN News\n",
        "com.cnn.www anchor:my.look.ca 8 CNN.com\n",
    ],
    "batch_anchor_count.py": [
        "com.cnn.www           74 anchors",
        "matches the anchors written before the snapshot",
    ],
    "async_counters.py": [
        "stats:views = 100",
        "stats:log = b'alice;bob;carol;'",
        "1 acquired it",
    ],
}


def run(name: str, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLES / name), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=ENV,
    )
    assert proc.returncode == 0, f"{name}: {proc.stderr}"
    return proc.stdout


def test_every_example_is_tested() -> None:
    assert sorted(p.name for p in EXAMPLES.glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_runs_on_a_temporary_directory(name: str) -> None:
    out = run(name)
    for line in EXPECTED[name]:
        assert line in out, out


def test_examples_share_one_database_when_given_a_url(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'db'}"
    run("figure2_write.py", "--url", url)
    out = run("figure3_read.py", "--url", url)
    assert "com.cnn.www anchor:www.c-span.org" in out  # written by the Figure 2 example
    assert "www.abc.com" not in out  # deleted by it
    run("async_counters.py", "--url", url)
    assert "stats:views = 100" in run("async_counters.py", "--url", url)
