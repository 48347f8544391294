"""s3rver (an independent S3 implementation in Node.js, from the npm registry) on 127.0.0.1.

The conformance suite runs against it as a second S3 server beside moto (docs/operations/cluster.md,
"S3 implementations"), and the fencing probe is tested against it because it ignores
``If-None-Match: *``. ``scripts/test.sh`` installs it into ``.tools/npm`` (project-local); a
missing binary is a test failure, not a skip, as for every real server here.

``s3rver_server`` yields the endpoint URL; ``s3rver_url`` creates a fresh bucket and yields
``s3://<bucket>/db?endpoint_url=...&region=us-east-1``. s3rver accepts only its own access key
pair (S3RVER / S3RVER): give stores :data:`STORE_KEYS`.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.plugins.s3_server import REGION

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / ".tools" / "npm" / "node_modules" / ".bin" / "s3rver"
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "S3RVER", "AWS_SECRET_ACCESS_KEY": "S3RVER"}
#: S3ObjectStore keyword arguments with s3rver's keys. Pass them: botocore keeps the first
#: credentials a process resolves from the environment (moto's dummies, in a whole run).
STORE_KEYS = {"access_key_id": "S3RVER", "secret_access_key": "S3RVER"}
_LISTENING = re.compile(rb"listening on 127\.0\.0\.1:(\d+)")
_buckets = itertools.count()


@pytest.fixture(scope="session")
def s3rver_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start s3rver on a free loopback port (it prints the port it bound); yield its URL."""
    if not BINARY.exists():
        pytest.fail(f"s3rver is not installed at {BINARY}: run scripts/test.sh (npm install)")
    data = tmp_path_factory.mktemp("s3rver")
    log = data / "s3rver.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(BINARY), "-d", str(data / "buckets"), "-a", "127.0.0.1", "-p", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            # s3rver signs continuation tokens with a cipher OpenSSL 3 keeps in its legacy
            # provider; without it every paginated listing is an InternalError.
            env={**os.environ, "NODE_OPTIONS": "--openssl-legacy-provider"},
        )
    try:
        deadline = time.monotonic() + 30
        while not (match := _LISTENING.search(log.read_bytes())):
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"s3rver did not start: {log.read_text(errors='replace')}")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{int(match.group(1))}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture
def s3rver_url(s3rver_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A fresh bucket on s3rver, its credentials in the environment."""
    import boto3

    for name, value in CREDENTIALS.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    bucket = f"s3rver-{os.getpid()}-{next(_buckets)}"
    boto3.client(
        "s3",
        endpoint_url=s3rver_server,
        region_name=REGION,
        aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    ).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/db?endpoint_url={s3rver_server}&region={REGION}"
