"""The history verbs: ``createtable --history``, ``history T [window|off|default]`` (a
table's ``off`` stands against the database's default), ``ls T`` showing the window, and ``restore T --as-of INSTANT NEW`` with its one-line errors (exit 1, nothing
created)."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

from click.testing import CliRunner

from tabletstore.cli.main import main


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def test_history_and_restore_as_of_from_the_command_line(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    runner = CliRunner()

    def run(*args: str) -> tuple[int, str]:
        result = runner.invoke(main, ["--url", url, *args])
        return result.exit_code, result.output

    assert run("createtable", "t", "families=f", "--history", "2h")[0] == 0
    assert run("createtable", "plain", "families=f")[0] == 0
    assert run("history", "t") == (0, "t: history 2h\n")
    assert "History: 2h" in run("ls", "t")[1]
    assert run("history", "plain", "30m") == (0, "plain: history 30m\n")
    assert run("history", "plain", "default") == (0, "plain: history off\n")
    assert run("history", "--default") == (0, "default: history off\n")
    assert run("history", "--default", "1d") == (0, "default: history 1d\n")
    assert run("history", "plain") == (0, "plain: history 1d (the database's default)\n")
    # A table's own "off" stands against the database's default; "default" ends it.
    assert run("createtable", "quiet", "families=f", "--history", "off")[0] == 0
    opted_out = "quiet: history off (the table's own: the database's default does not apply)\n"
    assert run("history", "quiet") == (0, opted_out)
    assert "History: off" in run("ls", "quiet")[1]
    assert run("history", "plain", "off") == (0, opted_out.replace("quiet", "plain"))
    code, out = run("restore", "plain", "--as-of", _iso(time.time()), "x")
    assert code == 1 and "keeps no history" in out, out
    assert run("history", "plain", "default") == (
        0,
        "plain: history 1d (the database's default)\n",
    )
    assert run("history", "t") == (0, "t: history 2h\n")
    assert run("history", "--default", "off") == (0, "default: history off\n")
    assert run("history", "plain") == (0, "plain: history off\n")
    assert run("set", "t", "r1", "f:q=old")[0] == 0
    marker = time.time()
    assert run("set", "t", "r1", "f:q=new")[0] == 0
    assert run("set", "t", "r2", "f:q=later")[0] == 0
    code, out = run("restore", "t", "--as-of", _iso(marker), "back")
    assert code == 0, out
    assert out.startswith("restored t as of ") and "into back" in out
    rows = run("read", "back")[1]
    assert '"old"' in rows and '"new"' not in rows and "r2" not in rows
    code, out = run("clone", "t", "cl", "--as-of", _iso(marker))
    assert code == 0 and out.startswith("cloned t as of ") and "SSTables shared" in out, out
    assert run("read", "cl")[1] == rows.replace("back", "cl")
    assert run("set", "cl", "r3", "f:q=own")[0] == 0
    assert "r3" not in run("read", "t")[1]
    for args, message in [
        (("restore", "t", "--as-of", "2026-11-28T09:15:00", "x"), "no time zone"),
        (("restore", "t", "--as-of", "yesterday", "x"), "bad instant"),
        (("restore", "t", "--as-of", _iso(time.time() - 3 * 3600), "x"), "outside the history"),
        (("restore", "t", "--as-of", _iso(time.time()), "back"), "already exists"),
        (("clone", "t", "back", "--as-of", _iso(time.time())), "already exists"),
        (("clone", "t", "x", "--as-of", _iso(time.time() - 3 * 3600)), "outside the history"),
        (("restore", "plain", "--as-of", _iso(time.time()), "x"), "keeps no history"),
        (("history", "t", "soon"), "bad duration"),
        (("history", "--default", "soon"), "bad duration"),
        (("history", "--default", "1h", "2h"), "takes one window"),
        (("history",), "name a table"),
        (("history", "nosuch", "1h"), "nosuch"),
        (
            ("restore", "t", "--as-of", _iso(time.time()), "x", "--sort-executor", "workers"),
            "needs a cluster",
        ),
        (("restore", "--backup", "b", "x", "--sort-executor", "local"), "is for restore --as-of"),
    ]:
        code, out = run(*args)
        assert code == 1 and message in out, (args, out)
    assert run("ls")[1].split() == ["back", "cl", "plain", "quiet", "t"]
