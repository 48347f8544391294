"""functions/etcd_tls.py: a function that opens the cluster's etcd writes the client
certificate its URL names into /tmp from Secrets Manager (moto), once."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from functions.etcd_tls import ENV_SECRET, ensure_etcd_tls

PEMS = {"ca": "-----CA-----", "cert": "-----CERT-----", "key": "-----KEY-----"}


def url(directory: Path) -> str:
    return (
        f"etcd://10.40.0.10:2379,10.40.16.10:2379/tabletstore?ca={directory}/ca.pem"
        f"&cert={directory}/client.pem&key={directory}/client.key"
    )


@mock_aws
def test_writes_the_certificate_the_url_names_once(tmp_path: Path) -> None:
    client = boto3.client("secretsmanager", region_name="us-east-1")
    arn = client.create_secret(Name="etcd-client", SecretString=json.dumps(PEMS))["ARN"]
    directory = tmp_path / "etcd-tls"
    assert ensure_etcd_tls(url(directory), env={ENV_SECRET: arn}, client=client)
    for name, field in (("ca.pem", "ca"), ("client.pem", "cert"), ("client.key", "key")):
        path = directory / name
        assert path.read_text() == PEMS[field] + "\n"
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    # A warm start keeps the files and asks Secrets Manager nothing.
    client.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    assert not ensure_etcd_tls(url(directory), env={ENV_SECRET: arn}, client=client)


def test_nothing_to_do_without_a_secret_or_without_files_in_the_url(tmp_path: Path) -> None:
    assert not ensure_etcd_tls(url(tmp_path / "x"), env={})
    assert not ensure_etcd_tls("etcd://127.0.0.1:2379/ns", env={ENV_SECRET: "arn"})
    assert not (tmp_path / "x").exists()


@mock_aws
def test_a_secret_without_a_field_is_a_clear_error(tmp_path: Path) -> None:
    client = boto3.client("secretsmanager", region_name="us-east-1")
    arn = client.create_secret(Name="bad", SecretString=json.dumps({"ca": "x"}))["ARN"]
    with pytest.raises(ValueError, match="has no cert, key"):
        ensure_etcd_tls(url(tmp_path / "t"), env={ENV_SECRET: arn}, client=client)
