"""The ``tabletstore`` command as a user runs it.

Every verb runs through click's runner in this process (the same code as the console script,
minus a 1 s process start each), and the behaviour that depends on a real process -- argument
bytes from the OS, exit statuses and stderr of the installed script, the default ``--url`` in
the working directory -- runs the installed ``tabletstore`` script. One database directory is
shared by the module (each test uses its own tables).
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletstore.cli.main import main

_SCRIPT = Path(sys.executable).parent / "tabletstore"
if _SCRIPT.exists():
    COMMAND: list[str] = [str(_SCRIPT)]
elif shutil.which("tabletstore"):
    COMMAND = [str(shutil.which("tabletstore"))]
else:
    COMMAND = [sys.executable, "-m", "tabletstore.cli.main"]

ENV = {k: v for k, v in os.environ.items() if not k.startswith("TABLETSTORE_")}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('cli-db')}"


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def run(*args: str, url: str | None = None) -> Result:
    """The command in this process."""
    argv = [*(["--url", url] if url else []), *args]
    env: dict[str, str | None] = {"TABLETSTORE_URL": None, "TABLETSTORE_IDENTITY": None}
    r = CliRunner().invoke(main, argv, env=env, catch_exceptions=False)
    return Result(r.exit_code, r.stdout, r.stderr)


def run_process(
    *args: str | bytes, url: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """The installed console script in a new process."""
    argv: list[str | bytes] = [*COMMAND, *(["--url", url] if url else []), *args]
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        encoding="utf-8",
        errors="surrogateescape",
        timeout=120,
        env=ENV,
        cwd=cwd,
    )


def ok(*args: str, url: str) -> str:
    r = run(*args, url=url)
    assert r.returncode == 0, f"{args}: rc={r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def fails(*args: str, url: str | None, expect: str) -> None:
    """The command exits 1 with exactly one line on stderr, naming the problem."""
    r = run(*args, url=url)
    assert r.returncode == 1, (args, r.returncode, r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("tabletstore: "), lines
    assert expect in lines[0], lines


def test_table_and_family_admin(url: str) -> None:
    ok("createtable", "admin", "families=contents:maxversions=3,anchor", "splits=g,p", url=url)
    assert "admin" in ok("ls", url=url).split()
    ok("createfamily", "admin", "lang", url=url)
    ok("setgcpolicy", "admin", "anchor", "(maxage=1d", "or", "maxversions=2)", "and", "maxage=1h",
       url=url)  # fmt: skip
    ok("setgcpolicy", "admin", "lang", "maxage=30d", url=url)
    assert ok("ls", "admin", url=url).splitlines() == [
        "Family Name  GC Policy",
        "-----------  ---------",
        "anchor       ((age() > 1d || versions() > 2) && age() > 1h)",
        "contents     versions() > 3",
        "lang         age() > 30d",
    ]
    ok("setgcpolicy", "admin", "lang", "never", url=url)
    ok("deletefamily", "admin", "anchor", url=url)
    assert ok("ls", "admin", url=url).splitlines()[2:] == ["contents     versions() > 3", "lang"]
    ok("deletetable", "admin", url=url)
    assert "admin" not in ok("ls", url=url).split()


def test_set_lookup_read_count_and_deletes(url: str) -> None:
    ok("createtable", "data", "families=contents,anchor", "splits=com.d", url=url)
    ok("set", "data", "com.cnn.www", "contents:=<html>v1@3", "contents:=<html>v2@5",
       "anchor:cnnsi.com=CNN@9", "anchor:my.look.ca=CNN.com@8", url=url)  # fmt: skip
    ok("set", "data", "com.example", "contents:=x@y", "anchor:a=1", url=url)
    ok("set", "data", "org.other", "contents:=o@1", url=url)

    assert ok("lookup", "data", "com.cnn.www", url=url).splitlines() == [
        "-" * 40,
        "com.cnn.www",
        f"  {'anchor:cnnsi.com':<40} @ {_ts(9)}",
        '    "CNN"',
        f"  {'anchor:my.look.ca':<40} @ {_ts(8)}",
        '    "CNN.com"',
        f"  {'contents:':<40} @ {_ts(5)}",
        '    "<html>v2"',
        f"  {'contents:':<40} @ {_ts(3)}",
        '    "<html>v1"',
        "",
    ]
    # "@y" is not a timestamp, so it is part of the value (as in cbt).
    assert '"x@y"' in ok("lookup", "data", "com.example", url=url)
    assert ok("lookup", "data", "nosuch", url=url) == ""

    assert _keys(ok("read", "data", "keys-only=true", url=url)) == [
        "com.cnn.www",
        "com.example",
        "org.other",
    ]
    assert _keys(ok("read", "data", "prefix=com.", "keys-only=true", url=url)) == [
        "com.cnn.www",
        "com.example",
    ]
    assert _keys(
        ok("read", "data", "start=com.d", "end=org.z", "count=1", "keys-only=true", url=url)
    ) == ["com.example"]
    assert _keys(ok("read", "data", r"regex=.*\.other", "keys-only=true", url=url)) == ["org.other"]
    out = ok("lookup", "data", "com.cnn.www", "columns=contents:", "cells-per-column=1", url=url)
    assert "<html>v2" in out and "<html>v1" not in out and "anchor" not in out
    out = ok("read", "data", "columns=anchor:my.*,a", url=url)
    assert "anchor:my.look.ca" in out and "anchor:a" in out and "cnnsi" not in out

    assert ok("count", "data", url=url).strip() == "3"
    assert ok("count", "data", "prefix=com", url=url).strip() == "2"

    ok("deletecolumn", "data", "com.cnn.www", "anchor", "cnnsi.com", url=url)
    assert "cnnsi.com" not in ok("lookup", "data", "com.cnn.www", url=url)
    ok("deleterow", "data", "com.example", url=url)
    assert ok("lookup", "data", "com.example", url=url) == ""
    ok("flush", "data", url=url)
    ok("compact", "data", url=url)
    assert ok("count", "data", url=url).strip() == "2"
    assert "my.look.ca" in ok("lookup", "data", "com.cnn.www", url=url)


def test_binary_row_keys_and_values_pass_as_raw_argument_bytes(url: str) -> None:
    ok("createtable", "bin", "families=f", url=url)
    proc = run_process("set", "bin", b"k\x01\xff", b'f:q=\xfe"\\\n\xc3\xa9', url=url)
    assert proc.returncode == 0, proc.stderr
    proc = run_process("read", "bin", url=url)
    assert proc.returncode == 0, proc.stderr
    assert "k\\x01\\xff" in proc.stdout
    assert '"\\xfe\\"\\\\\\né"' in proc.stdout


def test_the_installed_script_fails_with_one_line_and_status_1(url: str) -> None:
    for args, expect in [
        (("lookup", "nosuch", "r"), "tabletstore: table 'nosuch' does not exist"),
        (("--url", "etcd://127.0.0.1:1/ns", "ls"), "tabletstore: etcd unreachable at 127.0.0.1:1"),
    ]:
        proc = run_process(*args, url=url if args[0] != "--url" else None)
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith(expect), proc.stderr


def test_import_export_round_trip(url: str, tmp_path: Path) -> None:
    rows = [
        ["row", "contents:html", "anchor:cnnsi.com", "anchor:a:b"],
        ["com.cnn.www", '<html>a, "quoted", with comma', "CNN", "x"],
        ["com.example", "multi\nline\r\nvalue", "", "ü日本 ✓"],
        ["org.only-anchor", "", "=1,2", ""],
    ]
    src = tmp_path / "in.csv"
    with open(src, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows(rows)
    for name in ("csv1", "csv2"):
        ok("createtable", name, "families=contents,anchor", url=url)
    assert "imported 3 rows (6 cells)" in ok("import", "csv1", str(src), "batch-size=2", url=url)
    out = ok("lookup", "csv1", "com.example", url=url)
    assert '"multi\\nline\\r\\nvalue"' in out and '"ü日本 ✓"' in out

    first, second = tmp_path / "out1.csv", tmp_path / "out2.csv"
    ok("export", "csv1", str(first), url=url)
    with open(first, encoding="utf-8", newline="") as f:
        exported = list(csv.reader(f))
    assert exported[0] == ["row", "anchor:a:b", "anchor:cnnsi.com", "contents:html"]
    by_key = {r[0]: dict(zip(exported[0][1:], r[1:], strict=True)) for r in exported[1:]}
    for row in rows[1:]:
        assert {k: v for k, v in by_key[row[0]].items() if v} == {
            k: v for k, v in zip(rows[0][1:], row[1:], strict=True) if v
        }
    ok("import", "csv2", str(first), url=url)
    ok("export", "csv2", str(second), url=url)
    assert first.read_bytes() == second.read_bytes()


def test_export_binary_needs_base64_and_base64_round_trips(url: str, tmp_path: Path) -> None:
    ok("createtable", "b64", "families=f", url=url)
    # Arguments as Python sees non-UTF-8 argv bytes: decoded with surrogateescape.
    ok("set", "b64", os.fsdecode(b"r\xff"), os.fsdecode(b"f:c=\x01\xfe"), "f:t=text", url=url)
    fails("export", "b64", str(tmp_path / "x.csv"), url=url, expect="encoding=base64")
    assert not (tmp_path / "x.csv").exists()
    dump = ok("export", "b64", "-", "encoding=base64", url=url)
    assert dump.splitlines() == ["row,f:c,f:t", "cv8=,Af4=,dGV4dA=="]
    (tmp_path / "b.csv").write_text(dump)
    ok("createtable", "b64b", "families=f", url=url)
    ok("import", "b64b", str(tmp_path / "b.csv"), "encoding=base64", url=url)
    assert ok("export", "b64b", "-", "encoding=base64", url=url) == dump


def test_import_cbt_header_and_value_encoded_timestamps(url: str, tmp_path: Path) -> None:
    ok("createtable", "cbtcsv", "families=fam1,fam2", url=url)
    src = tmp_path / "cbt.csv"
    src.write_text(",fam1,,fam2\n,c1,c2,c3\na,TRUE,,FALSE@1577862000000000\nb,,x,\n")
    ok("import", "cbtcsv", str(src), "timestamp=value-encoded", url=url)
    out = ok("lookup", "cbtcsv", "a", url=url)
    assert f"  {'fam2:c3':<40} @ {_ts(1577862000000000)}" in out and '"FALSE"' in out
    bare = tmp_path / "bare.csv"
    bare.write_text(",q1,q2\nr,1,2\n")
    ok("import", "cbtcsv", str(bare), "column-family=fam1", url=url)
    assert "fam1:q2" in ok("lookup", "cbtcsv", "r", url=url)


def test_import_reports_failed_rows_and_writes_the_rest(url: str, tmp_path: Path) -> None:
    ok("createtable", "partial", "families=f", url=url)
    src = tmp_path / "bad.csv"
    src.write_text("row,f:a\ngood1,1\nbad,1,extra\n,orphan\ngood2,2\n")
    proc = run("import", "partial", str(src), url=url)
    assert proc.returncode == 1
    assert "imported 2 rows" in proc.stdout
    err = proc.stderr.splitlines()
    assert any(":3:" in line and "fields" in line for line in err), err
    assert any(":4:" in line and "empty row key" in line for line in err), err
    assert err[-1] == f"tabletstore: 2 rows of {str(src)!r} not imported"
    assert "Traceback" not in proc.stderr
    assert ok("count", "partial", url=url).strip() == "2"


def test_errors_are_one_line_without_traceback(url: str, tmp_path: Path) -> None:
    fails("lookup", "nosuch", "r", url=url, expect="table 'nosuch' does not exist")
    fails("deletetable", "nosuch", url=url, expect="does not exist")
    ok("createtable", "errs", "families=f", url=url)
    fails("createtable", "errs", url=url, expect="already exists")
    fails("set", "errs", "r", "nocolon", url=url, expect="bad set arg")
    fails("set", "errs", "r", "g:c=v", url=url, expect="no column family 'g'")
    fails("read", "errs", "foo=bar", url=url, expect="unknown arg key 'foo'")
    fails("setgcpolicy", "errs", "f", "maxage=3x", url=url, expect="bad duration '3x'")
    fails("createfamily", "errs", "bad name", url=url, expect="column family name")
    fails("import", "errs", str(tmp_path / "missing.csv"), url=url, expect="no such file")
    fails("ls", url="etcd://127.0.0.1:1/ns", expect="etcd unreachable at 127.0.0.1:1")


def test_identity_is_checked_against_acls(url: str) -> None:
    from tabletstore import Acl, ColumnFamily, connect

    with connect(url) as db:
        db.create_table("acl", [ColumnFamily(name="f", acl=Acl(writers=["alice"]))])
    fails("set", "acl", "r", "f:c=v", url=url, expect="may not write")
    proc = run("--identity", "alice", "set", "acl", "r", "f:c=v", url=url)
    assert proc.returncode == 0, proc.stderr


def test_demo_runs_twice_on_the_default_directory(tmp_path: Path) -> None:
    for expected in ("→ 1", "→ 2"):
        proc = run_process("demo", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "com.cnn.www" in proc.stdout and "anchor:my.look.ca" in proc.stdout
        assert "CNN.com" in proc.stdout and "<html>CNN, first crawl" in proc.stdout
        assert expected in proc.stdout
    assert (tmp_path / "tabletstore-data").is_dir()


def _ts(micros: int) -> str:
    from tabletstore.cli.cbtsyntax import format_timestamp

    return format_timestamp(micros)


def _keys(out: str) -> list[str]:
    return out.splitlines()
