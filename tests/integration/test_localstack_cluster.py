"""``tabletstore local-stack up --workers 3``, then the cbt-style CLI against the cluster.

Everything runs as the user would run it: each step is a separate ``python -m tabletstore.cli.main``
process. ``down`` must leave no process behind.
"""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tabletstore.cli import localstack
from tabletstore.testing.processes import gone

# 25 CLI processes one after another: under the parallel suite on 2 cores each waits for CPU.
# The stack is never faulted (no lease timing): it runs beside the faulted clusters.
pytestmark = [pytest.mark.slow, pytest.mark.unfaulted, pytest.mark.timeout(480)]


def tabletstore(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tabletstore.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def stack_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "stack"
    yield directory
    if (directory / localstack.STACK_FILE).exists():
        localstack.down(directory)  # a failed test must not leave servers running


def test_local_stack_with_workers_serves_the_cli(stack_dir: Path, tmp_path: Path) -> None:
    up = tabletstore("local-stack", "up", "--workers", "3", "--dir", str(stack_dir))
    assert up.returncode == 0, up.stderr
    match = re.search(r"cluster URL:\s+(etcd://\S+)", up.stdout)
    assert match, up.stdout
    url = match.group(1)
    stack = localstack.load(stack_dir.resolve())
    assert stack.cluster_url == url
    roles = [p.role for p in stack.processes]
    assert roles == ["etcd", "s3", "master", "worker-0", "worker-1", "worker-2"]

    status = tabletstore("local-stack", "status", "--dir", str(stack_dir))
    assert status.returncode == 0, status.stderr
    for record in stack.processes:
        assert re.search(rf"^{record.role}\s+{record.pid}\s+yes\s", status.stdout, re.M), (
            status.stdout
        )

    # The data verbs need only the cluster URL: no S3 credentials in the client's environment.
    def ok(*args: str) -> str:
        proc = tabletstore("--url", url, *args)
        assert proc.returncode == 0, f"{args}: {proc.stderr}"
        return proc.stdout

    ok("createtable", "web", "families=contents,anchor:maxversions=2", "splits=com.d,com.m,org")
    assert ok("ls").split() == ["web"]
    assert "anchor" in ok("ls", "web")
    ok("set", "web", "com.cnn.www", "contents:html=<html>cnn", "anchor:cnnsi.com=CNN")
    ok("set", "web", "com.example", "contents:html=<html>example")
    ok("set", "web", "org.wikipedia", "contents:html=<html>wiki", "anchor:x.org=W")
    assert '"<html>cnn"' in ok("lookup", "web", "com.cnn.www")
    assert ok("lookup", "web", "com.nothing") == ""

    src = tmp_path / "pages.csv"
    with open(src, "w", encoding="utf-8", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["row", "contents:html", "anchor:ref"])
        for i in range(60):  # rows in every one of the 4 tablets
            prefix = ("com.a", "com.g", "com.p", "org.z")[i % 4]
            writer.writerow([f"{prefix}{i:03d}", f"<html>{i}", f"r{i}"])
    assert "imported 60 rows (120 cells)" in ok("import", "web", str(src), "batch-size=7")

    assert ok("count", "web").strip() == "63"
    assert ok("count", "web", "prefix=org").strip() == "16"
    listing = ok("read", "web", "start=com.d", "end=com.z", "keys-only=true")
    keys = listing.split()  # keys-only prints one row key per line
    assert keys == sorted(keys) and "com.example" in keys and "com.cnn.www" not in keys

    ok("flush", "web")
    ok("compact", "web")
    assert ok("count", "web").strip() == "63"
    assert '"<html>wiki"' in ok("lookup", "web", "org.wikipedia")
    ok("deletetable", "web")
    assert ok("ls").split() == []

    down = tabletstore("local-stack", "down", "--dir", str(stack_dir))
    assert down.returncode == 0, down.stderr
    for record in stack.processes:
        assert gone(record.pid), f"{record.role} (pid {record.pid}) still runs after down"
    assert not (stack_dir / localstack.STACK_FILE).exists()


def test_persist_keeps_the_data_across_down_and_up(stack_dir: Path) -> None:
    """``--persist``: a row written before ``down`` is read after the next ``up``, served by
    new processes from the same etcd data and object directory."""

    def up() -> tuple[str, localstack.Stack]:
        result = tabletstore(
            "local-stack", "up", "--persist", "--workers", "1", "--dir", str(stack_dir)
        )
        assert result.returncode == 0, result.stderr
        assert "kept across down/up" in result.stdout
        stack = localstack.load(stack_dir.resolve())
        assert [p.role for p in stack.processes] == ["etcd", "master", "worker-0"]
        assert stack.store_url == (stack_dir.resolve() / "objects").as_uri()
        assert stack.cluster_url is not None
        return stack.cluster_url, stack

    def ok(url: str, *args: str) -> str:
        proc = tabletstore("--url", url, *args)
        assert proc.returncode == 0, f"{args}: {proc.stderr}"
        return proc.stdout

    url, first = up()
    ok(url, "createtable", "t", "families=f")
    ok(url, "set", "t", "row1", "f:c=kept")
    assert tabletstore("local-stack", "down", "--dir", str(stack_dir)).returncode == 0
    for record in first.processes:
        assert gone(record.pid)

    url_again, second = up()
    try:
        assert url_again == url  # etcd came back on its recorded ports
        assert not {p.pid for p in first.processes} & {p.pid for p in second.processes}
        assert '"kept"' in ok(url, "lookup", "t", "row1")
    finally:
        assert tabletstore("local-stack", "down", "--dir", str(stack_dir)).returncode == 0
    assert (stack_dir / "etcd").exists() and (stack_dir / "objects").exists()
