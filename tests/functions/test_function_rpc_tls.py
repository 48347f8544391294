"""functions/rpc_tls.py: a function that reaches the workers writes its RPC certificate from
Secrets Manager (moto) where TABLETSTORE_TLS_CA/_CERT/_KEY name it, and uses it."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from functions.rpc_tls import ENV_TLS_SECRET, rpc_tls
from tabletstore.errors import InvalidArgument
from tabletstore.security import ca


def env_for(directory: Path, secret: str) -> dict[str, str]:
    return {
        ENV_TLS_SECRET: secret,
        "TABLETSTORE_TLS_CA": str(directory / "ca.pem"),
        "TABLETSTORE_TLS_CERT": str(directory / "cert.pem"),
        "TABLETSTORE_TLS_KEY": str(directory / "key.pem"),
    }


@mock_aws
def test_writes_the_role_certificate_and_answers_its_tls(tmp_path: Path) -> None:
    ca.init_ca(tmp_path / "ca")
    ca.issue(tmp_path / "ca", "compaction", role="function")
    pems = {
        "ca": (tmp_path / "ca" / "ca.pem").read_text(),
        "cert": (tmp_path / "ca" / "compaction.pem").read_text(),
        "key": (tmp_path / "ca" / "compaction.key").read_text(),
    }
    client = boto3.client("secretsmanager", region_name="us-east-1")
    arn = client.create_secret(Name="tls-function", SecretString=json.dumps(pems))["ARN"]
    directory = tmp_path / "tls"
    tls = rpc_tls(env_for(directory, arn), client=client)
    assert tls is not None and tls.principal() is not None
    assert (tls.principal().name, tls.principal().role) == ("compaction", "function")
    for name in ("ca.pem", "cert.pem", "key.pem"):
        assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600
    # A warm start keeps the files and asks Secrets Manager nothing.
    client.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    assert rpc_tls(env_for(directory, arn), client=client) == tls


def test_without_a_secret_the_variables_alone_decide(tmp_path: Path) -> None:
    assert rpc_tls({}) is None
    with pytest.raises(InvalidArgument, match="TLS CA file"):
        rpc_tls({"TABLETSTORE_TLS_CA": str(tmp_path / "missing.pem")})
    with pytest.raises(InvalidArgument, match="TABLETSTORE_TLS_KEY is not"):
        rpc_tls({ENV_TLS_SECRET: "arn", "TABLETSTORE_TLS_CA": "a", "TABLETSTORE_TLS_CERT": "b"})
