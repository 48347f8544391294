"""The change-stream verbs on an embedded database: ``createtable --changes``, ``changes T
[retention|off]`` and ``watch T --from --until`` printing each committed mutation once, with
their one-line errors (exit 1)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from click.testing import CliRunner

from tabletstore.cli.main import main


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def test_changes_and_watch_from_the_command_line(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, ["--url", url, *args])
        return result.exit_code, result.output

    assert run("createtable", "t", "families=f", "--changes", "2h")[0] == 0
    assert run("createtable", "plain", "families=f")[0] == 0
    assert run("changes", "t") == (0, "t: changes 2h\n")
    assert run("changes", "plain", "30m") == (0, "plain: changes 30m\n")
    assert run("changes", "plain", "off") == (0, "plain: changes off\n")
    start = time.time()
    assert run("set", "t", "r1", "f:q=one")[0] == 0
    assert run("set", "t", "r2", "f:q=two")[0] == 0
    assert run("deleterow", "t", "r1")[0] == 0
    code, out = run("watch", "t", "--from", _iso(start - 1), "--until", _iso(time.time()))
    assert code == 0, out
    lines = [line for line in out.splitlines() if " r1 " in line or " r2 " in line]
    assert len(lines) == 3, out
    assert "one" in lines[0] and " r1 " in lines[0]
    assert "two" in out and sum(" r1 " in line for line in lines) == 2
    for args, message in [
        (("changes", "t", "soon"), "bad duration"),
        (("watch", "plain", "--until", _iso(time.time())), "no change"),
        (("watch", "t", "--from", _iso(time.time() - 5 * 3600)), "retention"),
    ]:
        code, out = run(*args)
        assert code == 1 and message in out, (args, out)
