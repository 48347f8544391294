"""moto's S3 server on 127.0.0.1 for the whole test session, and a fresh bucket per test.

``s3_server`` yields the endpoint URL; ``s3_url`` creates a new bucket and yields
``s3://<bucket>/<prefix>?endpoint_url=...&region=us-east-1`` for it. moto is a test dependency:
if it is missing these fixtures fail (they never skip), because S3 is the production backend.

Dummy credentials are set in the environment only while a test using ``s3_url`` runs
(monkeypatch), so the developer's real AWS settings are never used against moto. botocore
caches a process's credentials after its first S3 client; every test uses the same dummy
values, so that is harmless.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterator
from typing import Any

import pytest

REGION = "us-east-1"
DUMMY_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": REGION,
}
_bucket_numbers = itertools.count()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[str]:
    """Start moto's ThreadedMotoServer on a free loopback port; yield its endpoint URL."""
    from moto.server import ThreadedMotoServer  # A missing moto is an error, not a skip.

    from tabletstore.cli.local_s3 import serialize_conditional_writes

    serialize_conditional_writes()  # create-only PUTs decided atomically, as S3 does
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@functools.cache
def boto3_client(endpoint: str) -> Any:
    """A synchronous boto3 S3 client for fixtures (bucket setup), with dummy credentials;
    one per endpoint for the session (creating a client costs milliseconds)."""
    import boto3

    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=REGION,
        aws_access_key_id=DUMMY_ENV["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=DUMMY_ENV["AWS_SECRET_ACCESS_KEY"],
    )


@pytest.fixture
def s3_bucket(s3_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new, empty bucket on the moto server (dummy credentials in the environment)."""
    for name, value in DUMMY_ENV.items():
        monkeypatch.setenv(name, value)
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    bucket = f"test-{os.getpid()}-{next(_bucket_numbers)}"
    boto3_client(s3_server).create_bucket(Bucket=bucket)
    return bucket


@pytest.fixture
def s3_url(s3_server: str, s3_bucket: str) -> str:
    """``s3://bucket/prefix?endpoint_url=...`` for a fresh bucket on the moto server."""
    return f"s3://{s3_bucket}/db?endpoint_url={s3_server}&region={REGION}"
