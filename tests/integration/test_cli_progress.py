"""``import``, ``export``, ``flush`` and ``compact`` show a progress bar with a rate on a terminal
and print nothing extra when their output is not one.

Each verb runs as the user runs it (``python -m tabletstore.cli.main``, an embedded database in
the test's tmp dir), once with stderr on a pseudo-terminal (``os.openpty``: rich sees a real
tty) and once with stderr on a pipe.
"""

from __future__ import annotations

import csv
import fcntl
import os
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

ROWS = 3000


def command(url: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tabletstore.cli.main", "--url", url, *args]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "CI")}
    env.update(TERM="xterm-256color", COLUMNS="160", LINES="40")
    return env


def on_a_terminal(args: list[str]) -> tuple[int, str, str]:
    """Run with stderr on a pseudo-terminal: (exit status, stdout, what the terminal got)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    process = subprocess.Popen(
        args,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=environment(),
    )
    os.close(slave)
    seen = bytearray()
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer of the terminal has closed it (the verb exited)
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    assert process.stdout is not None
    out = process.stdout.read().decode()
    process.stdout.close()
    return process.wait(timeout=60), out, seen.decode(errors="replace")


def piped(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=60, env=environment())


@pytest.fixture
def database(tmp_path: Path) -> str:
    url = f"file://{tmp_path / 'db'}"
    source = tmp_path / "rows.csv"
    with open(source, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "f:a"])
        writer.writerows([f"r{i:06d}", "v" * 40] for i in range(ROWS))
    created = piped(command(url, "createtable", "t", "families=f", "splits=r001000,r002000"))
    assert created.returncode == 0, created.stderr
    return url


def test_long_verbs_show_progress_on_a_terminal(database: str, tmp_path: Path) -> None:
    source = str(tmp_path / "rows.csv")
    code, out, tty = on_a_terminal(command(database, "import", "t", source))
    assert code == 0 and f"imported {ROWS} rows" in out, tty
    assert "importing" in tty and f"{ROWS:,} rows" in tty and "/s" in tty, tty

    code, out, tty = on_a_terminal(command(database, "flush", "t"))
    assert code == 0, tty
    assert "flushing" in tty and "3/3 tablets" in tty and "tablets/s" in tty, tty

    code, out, tty = on_a_terminal(command(database, "compact", "t"))
    assert code == 0, tty
    assert "compacting" in tty and "3/3 tablets" in tty and "/s" in tty, tty

    code, out, tty = on_a_terminal(command(database, "export", "t", str(tmp_path / "out.csv")))
    assert code == 0, tty
    assert "exporting" in tty and f"{ROWS:,}/{ROWS:,} rows" in tty and "rows/s" in tty, tty
    assert f"exported {ROWS} rows" in tty  # the summary line, on stderr, stays


def test_long_verbs_print_no_progress_when_not_on_a_terminal(database: str, tmp_path: Path) -> None:
    done = piped(command(database, "import", "t", str(tmp_path / "rows.csv")))
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == f"imported {ROWS} rows ({ROWS} cells) into 't'\n"
    for verb in ("flush", "compact"):
        done = piped(command(database, verb, "t"))
        assert done.returncode == 0 and (done.stdout, done.stderr) == ("", ""), done.stderr
    out = tmp_path / "out.csv"
    done = piped(command(database, "export", "t", str(out)))
    assert done.returncode == 0 and done.stderr == f"exported {ROWS} rows of 't' to {out}\n"
    assert len(out.read_text().splitlines()) == ROWS + 1
    done = piped(command(database, "export", "t", "-"))
    assert done.returncode == 0 and done.stderr == ""
    assert len(done.stdout.splitlines()) == ROWS + 1
