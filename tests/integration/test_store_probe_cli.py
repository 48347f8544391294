"""A master or worker refuses to start on an S3 server that ignores create-only PUTs, with one
line naming the endpoint (storage_s3/s3.py's open-time probe), instead of running unfenced."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.plugins.s3rver_server import CREDENTIALS


@pytest.mark.parametrize("verb", ["master", "worker"])
def test_process_refuses_a_store_without_conditional_create(
    verb: str, etcd_url: str, s3rver_server: str, s3rver_url: str
) -> None:
    env = {**os.environ, **CREDENTIALS, "AWS_DEFAULT_REGION": "us-east-1"}
    argv = [sys.executable, "-m", "tabletstore.cli.main", "--url", etcd_url, verb]
    argv += ["--store", s3rver_url, "--port", "0"]
    result = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert s3rver_server in result.stderr and "If-None-Match" in result.stderr, result.stderr
