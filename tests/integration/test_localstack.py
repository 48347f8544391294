"""``tabletstore local-stack up | status | down`` with real processes on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import boto3
import pytest

from tabletstore.cli import localstack
from tabletstore.coordination import open_coordinator
from tests.plugins.s3_server import DUMMY_ENV, boto3_client
from tests.plugins.s3rver_server import CREDENTIALS

# The local stack is started and stopped, never faulted: no lease timing in it.
pytestmark = [pytest.mark.slow, pytest.mark.unfaulted]


def cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a user runs it; ``env`` replaces the AWS settings of this environment."""
    base = {k: v for k, v in os.environ.items() if env is None or not k.startswith("AWS_")}
    return subprocess.run(
        [sys.executable, "-m", "tabletstore.cli.main", "local-stack", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**base, **(env or {})},
    )


def gone(pid: int) -> bool:
    """The pid no longer runs (absent, or a zombie waiting for init to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


@pytest.fixture
def stack_dir(tmp_path: Path):
    directory = tmp_path / "stack"
    yield directory
    if (directory / localstack.STACK_FILE).exists():
        localstack.down(directory)  # a failed test must not leave servers running


async def test_up_status_use_down(stack_dir: Path) -> None:
    up = cli("up", "--dir", str(stack_dir))
    assert up.returncode == 0, up.stderr
    stack = localstack.Stack.from_json((stack_dir / "stack.json").read_text())
    assert [p.role for p in stack.processes] == ["etcd", "s3"]
    assert stack.etcd_url in up.stdout and stack.s3_endpoint in up.stdout
    assert all(p.url.split("//")[1].startswith("127.0.0.1:") for p in stack.processes)

    status = cli("status", "--dir", str(stack_dir))
    assert status.returncode == 0, status.stderr
    for record in stack.processes:
        assert re.search(rf"^{record.role}\s+{record.pid}\s+yes\b", status.stdout, re.M), (
            status.stdout
        )

    coordinator = open_coordinator(stack.etcd_url)
    try:
        await coordinator.check()
        await coordinator.put("hello", b"etcd")
        kv = await coordinator.get("hello")
        assert kv is not None and kv.value == b"etcd"
    finally:
        await coordinator.close()

    s3 = boto3.client(
        "s3",
        endpoint_url=stack.s3_endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    s3.put_object(Bucket=stack.bucket, Key="k", Body=b"s3")
    assert s3.get_object(Bucket=stack.bucket, Key="k")["Body"].read() == b"s3"

    again = cli("up", "--dir", str(stack_dir))
    assert again.returncode != 0 and "already running" in again.stderr

    down = cli("down", "--dir", str(stack_dir))
    assert down.returncode == 0, down.stderr
    for record in stack.processes:
        assert gone(record.pid), record
    assert not (stack_dir / "stack.json").exists()
    # moto's objects are gone with it, so etcd's METADATA must go too (only --persist keeps).
    assert not (stack_dir / "etcd").exists()
    after = cli("status", "--dir", str(stack_dir))
    assert after.returncode != 0 and "no local stack" in after.stderr


def test_user_s3_url_creates_the_bucket_and_starts_only_etcd(
    stack_dir: Path, s3_server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in DUMMY_ENV.items():
        monkeypatch.setenv(name, value)
    s3 = boto3_client(s3_server)
    if localstack.BUCKET in {b["Name"] for b in s3.list_buckets()["Buckets"]}:
        s3.delete_bucket(Bucket=localstack.BUCKET)  # left by an earlier test of this session
    stack = localstack.up(stack_dir, s3_url=s3_server)
    try:
        assert [p.role for p in stack.processes] == ["etcd"]
        assert stack.s3_endpoint == s3_server and not stack.s3_managed
        assert stack.store_url == f"s3://{localstack.BUCKET}/data?endpoint_url={s3_server}"
        s3.head_bucket(Bucket=localstack.BUCKET)  # created by up
        port = stack.etcd_url.split(":")[2].split("/")[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as r:
            assert json.loads(r.read())["health"] == "true"
    finally:
        stopped = localstack.down(stack_dir)
    assert [p.role for p in stopped] == ["etcd"]
    assert gone(stack.processes[0].pid)


async def test_up_with_seaweedfs_serves_the_store_and_down_drops_it(stack_dir: Path) -> None:
    # The user's own keys in the environment: SeaweedFS would make them its only identity.
    keys = {"AWS_ACCESS_KEY_ID": "mine", "AWS_SECRET_ACCESS_KEY": "mine"}
    up = cli("up", "--dir", str(stack_dir), "--s3", "seaweedfs", env=keys)
    assert up.returncode == 0, up.stderr
    stack = localstack.Stack.from_json((stack_dir / "stack.json").read_text())
    assert [p.role for p in stack.processes] == ["etcd", "s3"]
    assert "weed" in stack.processes[1].argv[0] and stack.s3_managed
    assert stack.store_url == f"s3://{localstack.BUCKET}/data?endpoint_url={stack.s3_endpoint}"
    from tabletstore.storage_s3.s3 import S3ObjectStore

    store = S3ObjectStore(stack.store_url, access_key_id="any", secret_access_key="any")
    try:
        await store.check()  # the probe: create-only PUTs are honoured
        await store.create("hello", b"seaweedfs")
        assert await store.get("hello") == b"seaweedfs"
    finally:
        await store.close()
    down = cli("down", "--dir", str(stack_dir))
    assert down.returncode == 0, down.stderr
    assert all(gone(p.pid) for p in stack.processes)
    # Ephemeral like moto's: etcd's data goes (the next up empties SeaweedFS's directory).
    assert not (stack_dir / "etcd").exists()


def test_seaweedfs_with_persist_is_refused(stack_dir: Path) -> None:
    result = cli("up", "--dir", str(stack_dir), "--s3", "seaweedfs", "--persist")
    assert result.returncode == 1 and "--s3 seaweedfs" in result.stderr, result.stderr
    assert not (stack_dir / localstack.STACK_FILE).exists()


def _refused(stack_dir: Path, s3_url: str, env: dict[str, str]) -> str:
    """``up --s3-url`` fails with one line (no traceback), and starts nothing."""
    result = cli("up", "--dir", str(stack_dir), "--s3-url", s3_url, env=env)
    assert result.returncode == 1, result.stdout
    assert "Traceback" not in result.stderr
    assert not (stack_dir / localstack.STACK_FILE).exists()
    return result.stderr


def test_unreachable_s3_url_fails_at_once_naming_it(stack_dir: Path) -> None:
    message = _refused(stack_dir, "http://127.0.0.1:9", dict(DUMMY_ENV))
    assert "http://127.0.0.1:9" in message and "cannot reach" in message, message


def test_s3_url_without_credentials_says_so(stack_dir: Path, s3_server: str) -> None:
    env = {
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    message = _refused(stack_dir, s3_server, env)
    assert "no usable AWS credentials" in message and s3_server in message, message


def test_s3_url_ignoring_create_only_puts_is_refused(stack_dir: Path, s3rver_server: str) -> None:
    message = _refused(stack_dir, s3rver_server, dict(CREDENTIALS))
    assert s3rver_server in message and "If-None-Match" in message, message


def test_down_never_signals_a_pid_running_another_command(tmp_path: Path) -> None:
    """A recorded pid now running something else (pid reuse) is left alone."""
    other = subprocess.Popen(["sleep", "60"])
    try:
        real = localstack.ProcessRecord(
            role="etcd",
            pid=other.pid,
            argv=("/usr/bin/etcd", "--data-dir=/nowhere"),
            start_time=localstack._proc_start_time(other.pid) or 0,
            url="etcd://127.0.0.1:1/x",
            log=str(tmp_path / "log"),
        )
        assert not localstack.is_running(real)
        assert localstack.stop(real) is False
        assert other.poll() is None  # still running: not ours to stop
    finally:
        other.kill()
        other.wait()


def test_bad_s3_url_is_rejected(stack_dir: Path) -> None:
    result = cli("up", "--dir", str(stack_dir), "--s3-url", "ftp://x")
    assert result.returncode != 0 and "--s3-url" in result.stderr
    assert not (stack_dir / "stack.json").exists()
