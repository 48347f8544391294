"""A real etcd server for the test session (Debian's etcd-server package).

``etcd_server`` starts one etcd on free 127.0.0.1 ports with a temporary data directory and
raft timings that allow 1-second leases, waits until it is healthy, yields its client
endpoint ``127.0.0.1:PORT`` and stops it (by pid) at the end of the session. If ``etcd`` is
not installed the fixture fails — it never skips — so a missing dependency is visible.

``etcd_url`` gives each test its own namespace: ``etcd://127.0.0.1:PORT/test-<uuid>``.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator

import pytest

from tabletstore.localstack import start_etcd, stop


@pytest.fixture(scope="session")
def etcd_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("etcd") is None:
        pytest.fail(
            "etcd is not on PATH: install Debian's etcd-server package "
            "(apt-get install etcd-server) to run the etcd tests"
        )
    root = tmp_path_factory.mktemp("etcd")
    record, port = start_etcd(root / "data", log=root / "etcd.log", fast_leases=True)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop(record)


@pytest.fixture
def etcd_url(etcd_server: str) -> str:
    return f"etcd://{etcd_server}/test-{uuid.uuid4().hex}"
