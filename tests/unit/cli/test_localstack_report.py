"""What ``tabletstore local-stack up`` prints: the one URL to connect with comes first, as a
command, and every other URL is labelled with what it is for (a newcomer used the wrong one of
the two ``etcd://`` URLs)."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord, Stack
from tabletstore.cli.localstack_cmds import up_report
from tabletstore.cli.main import main

CLUSTER = "etcd://tabletstore-reader@127.0.0.1:2379/cluster?password_file=/d/tls/etcd-users/r"
STACK = Stack(
    dir="/d",
    etcd_url="etcd://127.0.0.1:2379/tabletstore",
    s3_endpoint="http://127.0.0.1:5000",
    bucket="tabletstore",
    s3_managed=True,
    processes=(
        ProcessRecord("etcd", 101, ("etcd",), 1, "etcd://127.0.0.1:2379/tabletstore", "/d/e.log"),
        ProcessRecord("master", 103, ("tabletstore",), 1, "127.0.0.1:4000", "/d/m.log"),
    ),
    cluster_url=CLUSTER,
    store_url="s3://tabletstore/data?endpoint_url=http://127.0.0.1:5000",
)


def test_the_cluster_url_to_use_comes_first_as_one_command() -> None:
    lines = up_report(STACK)
    connect = [line for line in lines if line.startswith("connect with:")]
    assert connect == [f"connect with: tabletstore --url {shlex.quote(CLUSTER)} ls"]
    assert lines.index(connect[0]) == 1  # right after "local stack is up"
    # The other etcd:// URL is labelled as something else than the cluster.
    etcd = next(i for i, line in enumerate(lines) if line.split()[-1] == STACK.etcd_url)
    assert "not the cluster" in lines[etcd + 1]
    cluster = next(i for i, line in enumerate(lines) if line.strip().startswith("cluster URL:"))
    assert lines[cluster].split()[-1] == CLUSTER and "the database" in lines[cluster + 1]


def test_without_a_cluster_nothing_claims_to_be_one() -> None:
    lines = up_report(dataclasses.replace(STACK, cluster_url=None))
    assert not any(line.startswith("connect with:") for line in lines)
    assert any("--workers N starts one" in line for line in lines)
    assert not any("not the cluster" in line for line in lines)


def test_up_prints_the_report_then_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(
        localstack, "up", lambda *a, **kw: dataclasses.replace(STACK, dir=str(tmp_path))
    )
    result = CliRunner().invoke(main, ["local-stack", "up", "--dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    out = result.output.splitlines()
    assert out[1].startswith("connect with: tabletstore --url ")
    assert out.index("environment:") > 1
    assert f"  export TABLETSTORE_URL={shlex.quote(CLUSTER)}" in out
