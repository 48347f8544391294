"""Where a newcomer falls, the CLI answers with one line and a non-zero exit, never a traceback:
the bigtable-api verb without its extra, a database directory that cannot
be used, a table that does not exist (every verb that takes one), an unreachable etcd, and a
master or worker whose bucket is missing, whose credentials are unusable or whose cluster was
never set up (they stop at once instead of retrying forever)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(240)


def tabletstore(
    *args: str, env: dict[str, str] | None = None, drop: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in drop}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "tabletstore.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=environment,
    )


def fails(*args: str, expect: str, **kw: object) -> str:
    done = tabletstore(*args, **kw)  # type: ignore[arg-type]
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("tabletstore: "), done.stderr
    assert expect in lines[0], lines[0]
    return lines[0]


def test_bigtable_api_without_its_extra_says_which_to_install(tmp_path: Path) -> None:
    # A stand-in for grpcio not being installed: importing it fails as a missing module does.
    fake = tmp_path / "no-grpc"
    fake.mkdir()
    (fake / "grpc.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'grpc'\", name='grpc')\n"
    )
    path = os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")])
    line = fails(
        "--url", f"file://{tmp_path / 'db'}", "bigtable-api", "--port", "0",
        env={"PYTHONPATH": path}, expect="pip install 'tabletstore[bigtable-api]'",
    )  # fmt: skip
    assert "'grpc'" in line


def test_a_database_directory_that_cannot_be_used(tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory\n")
    fails("--url", f"file://{a_file}", "ls", expect="cannot open the database at")
    fails("--url", f"file://{a_file}/below", "ls", expect="Not a directory")


def test_every_verb_on_a_table_that_does_not_exist(tmp_path: Path) -> None:
    url = f"file://{tmp_path / 'db'}"
    source = tmp_path / "rows.csv"
    source.write_text("row,f:a\nr1,v\n")
    for verb in (
        ("ls", "nosuch"),
        ("lookup", "nosuch", "r"),
        ("read", "nosuch"),
        ("count", "nosuch"),
        ("set", "nosuch", "r", "f:a=1"),
        ("deleterow", "nosuch", "r"),
        ("import", "nosuch", str(source)),
        ("export", "nosuch", str(tmp_path / "out.csv")),
        ("flush", "nosuch"),
        ("compact", "nosuch"),
        ("deletetable", "nosuch"),
        ("createfamily", "nosuch", "g"),
    ):
        fails("--url", url, *verb, expect="table 'nosuch' does not exist")


def test_an_unreachable_etcd() -> None:
    url = "etcd://127.0.0.1:1/ns"
    for verb in (("ls",), ("status",), ("gc", "--dry-run"), ("master",), ("worker",)):
        fails("--url", url, *verb, expect="etcd unreachable at 127.0.0.1:1")


@pytest.mark.slow
def test_cluster_processes_stop_at_once_on_an_unusable_store(
    etcd_url: str, s3_server: str, s3_bucket: str, tmp_path: Path
) -> None:
    missing = f"s3://no-such-bucket/data?endpoint_url={s3_server}&region=us-east-1"
    fails("--url", etcd_url, "master", "--store", missing, expect="does not exist")
    fails("--url", etcd_url, "worker", expect="no cluster is set up")
    fails("--url", etcd_url, "worker", "--store", missing, expect="does not exist")
    # No credentials anywhere botocore looks (environment, files, instance metadata).
    store = f"s3://{s3_bucket}/data?endpoint_url={s3_server}&region=us-east-1"
    no_credentials = {
        "HOME": str(tmp_path),
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    fails(
        "--url", etcd_url, "master", "--store", store,
        env=no_credentials,
        drop=("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"),
        expect="check the AWS credentials",
    )  # fmt: skip
    unreachable = "s3://b/data?endpoint_url=http://127.0.0.1:1&region=us-east-1"
    fails("--url", etcd_url, "master", "--store", unreachable, expect="cannot reach the S3")
