"""The etcd members' snapshot script (infra/terraform/modules/etcd/etcd-snapshot.sh) and the
restore path docs/operations/cloud-deployment.md describes, run here: a real etcd, moto's S3,
the aws CLI and etcdctl.

A snapshot of a running etcd is uploaded under the member's prefix; restoring it with
``etcdctl snapshot restore`` into a new data directory and starting etcd there gives back
the keys (a member's restore, as the runbook does on each member).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import boto3
import pytest

from tabletstore.cli.localstack import free_port, start_etcd, stop

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "infra" / "terraform" / "modules" / "etcd" / "etcd-snapshot.sh"
CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def tool(name: str) -> str:
    """A CLI the test needs: scripts/test.sh installs the aws CLI in .tools/awscli, etcdctl from
    Debian's etcd-client. Missing is a failure, not a skip."""
    local = ROOT / ".tools" / "awscli" / "bin" / name
    found = str(local) if local.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: run scripts/test.sh")
    return found


def etcdctl(endpoint: str, *args: str) -> str:
    result = subprocess.run(
        [tool("etcdctl"), f"--endpoints=http://{endpoint}", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "ETCDCTL_API": "3"},
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def run_snapshot(
    endpoint: str, s3: str, destination: str, tmp: Path
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), destination],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            "PATH": os.environ["PATH"],
            **CREDENTIALS,
            "ETCDCTL": f"{tool('etcdctl')} --endpoints=http://{endpoint}",
            "AWS": f"{tool('aws')} --endpoint-url {s3}",
            "SNAPSHOT_DIR": str(tmp),
        },
    )


@pytest.mark.slow
@pytest.mark.no_cluster
def test_snapshot_uploads_to_the_bucket_and_restores(s3_server: str, tmp_path: Path) -> None:
    root = tmp_path / "etcd"
    record, port = start_etcd(root / "data", log=root / "etcd.log")
    endpoint = f"127.0.0.1:{port}"
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    bucket = f"snapshots-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=bucket)
    prefix = "etcd-snapshots/prod/etcd-0/"
    try:
        etcdctl(endpoint, "put", "tabletstore/root", "w-1")
        etcdctl(endpoint, "put", "tabletstore/schema/t", "families=a")
        work = tmp_path / "work"
        work.mkdir()
        result = run_snapshot(endpoint, s3_server, f"s3://{bucket}/{prefix}", work)
        assert result.returncode == 0, result.stderr
        assert f"uploaded s3://{bucket}/{prefix}" in result.stdout
        assert not list(work.iterdir()), "the local copy is removed after the upload"
    finally:
        stop(record)
    (key,) = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]]
    assert key.startswith(prefix) and "-rev" in key and key.endswith(".db")

    # The restore: download the latest snapshot, restore it as the member, start etcd on it.
    snapshot = tmp_path / "latest.db"
    s3.download_file(bucket, key, str(snapshot))
    client_port, peer_port = free_port(), free_port()
    restored = tmp_path / "restored"
    subprocess.run(
        [
            tool("etcdctl"),
            "snapshot",
            "restore",
            str(snapshot),
            f"--data-dir={restored / 'data'}",
            "--name=tabletstore",
            f"--initial-cluster=tabletstore=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            "--initial-cluster-token=tabletstore-restored",
        ],
        check=True,
        capture_output=True,
        env={**os.environ, "ETCDCTL_API": "3"},
        timeout=60,
    )
    record, port = start_etcd(
        restored / "data", log=restored / "etcd.log", ports=(client_port, peer_port)
    )
    try:
        keys = etcdctl(f"127.0.0.1:{port}", "get", "--prefix", "tabletstore/")
        assert keys.split() == ["tabletstore/root", "w-1", "tabletstore/schema/t", "families=a"]
    finally:
        stop(record)


def test_snapshot_refuses_a_destination_that_is_not_a_prefix(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPT), "s3://bucket/etcd-snapshots/prod/etcd-0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": os.environ["PATH"]},
    )
    assert result.returncode == 2
    assert "must be an s3://BUCKET/PREFIX/ ending in /" in result.stderr


def test_a_failed_upload_fails_the_script(tmp_path: Path, etcd_server: str) -> None:
    result = run_snapshot(etcd_server, "http://127.0.0.1:9", "s3://nowhere/x/", tmp_path)
    assert result.returncode != 0
    assert "uploaded" not in result.stdout
