"""The backup verbs as an operator types them (real ``tabletstore`` processes on a ``file://``
database): backup create/list/describe, a backup kept in another location and restored from
there into another database, restore, clone; bad input is one line on stderr, exit 1, and
changes nothing. (The Python API's tests cover every refusal; here each kind of failure once.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.integration.test_cli_errors import fails, tabletstore

pytestmark = pytest.mark.timeout(900)


def ok(*args: str) -> str:
    done = tabletstore(*args)
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return done.stdout


def test_backup_restore_and_clone_from_the_command_line(tmp_path: Path) -> None:
    db = ("--url", f"file://{tmp_path / 'db'}")
    far = f"file://{tmp_path / 'far'}"
    ok(*db, "createtable", "t", "families=f", "splits=m")
    ok(*db, "set", "t", "a", "f:q=before")
    assert ok(*db, "backup", "create", "t", "--id", "b1", "--expire", "7d").strip() == "b1"
    ok(*db, "set", "t", "a", "f:q=after")
    described = ok(*db, "backup", "describe", "b1")
    assert "state       ready" in described and "tablet [b'm', end)" in described
    ok(*db, "restore", "--backup", "b1", "r")
    restored = ok(*db, "read", "r")
    assert '"before"' in restored and '"after"' not in restored
    fails(*db, "restore", "--backup", "b1", "r", expect="table 'r' already exists")
    fails(*db, "restore", "z", expect="--backup ID")
    ok(*db, "clone", "t", "c")
    assert '"after"' in ok(*db, "read", "c")

    ok(*db, "backup", "create", "t", "--id", "far1", "--to", far)
    assert "far1\tt\t" in ok(*db, "backup", "list", "--at", far)
    other = ("--url", f"file://{tmp_path / 'other'}")
    ok(*other, "restore", "--backup", "far1", "x", "--from", far)
    assert '"after"' in ok(*other, "read", "x")
