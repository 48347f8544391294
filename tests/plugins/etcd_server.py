"""A real etcd server for the test session (Debian's etcd-server package).

``etcd_server`` starts one etcd on free 127.0.0.1 ports with a temporary data directory and
raft timings that allow 1-second leases, waits until it is healthy, yields its client
endpoint ``127.0.0.1:PORT`` and stops it (by pid) at the end of the session. If ``etcd`` is
not installed the fixture fails — it never skips — so a missing dependency is visible.

``etcd_url`` gives each test its own namespace: ``etcd://127.0.0.1:PORT/test-<uuid>``.

``restartable_etcd`` is a test's own etcd that it may stop and start again on the same ports
and data directory, to test riding out an etcd restart.
"""

from __future__ import annotations

import shutil
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tabletstore.cli.localstack import start_etcd, stop


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


class RestartableEtcd:
    """An etcd of one test's own that can be stopped and started again on the same ports and
    data directory (a restart: keys, revisions and leases survive). Only this pid is signalled."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.record, self.port = start_etcd(root / "data", log=root / "etcd.log", fast_leases=True)
        peer = next(a for a in self.record.argv if a.startswith("--listen-peer-urls="))
        self.ports = (self.port, int(peer.rsplit(":", 1)[1]))

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, namespace: str) -> str:
        return f"etcd://{self.endpoint}/{namespace}"

    def watchers(self) -> int:
        """How many watches etcd serves now (its ``etcd_debugging_mvcc_watcher_total``)."""
        with urllib.request.urlopen(f"http://{self.endpoint}/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith("etcd_debugging_mvcc_watcher_total "):
                return int(float(line.split()[1]))
        raise AssertionError("etcd's /metrics has no etcd_debugging_mvcc_watcher_total")

    def stop(self) -> None:
        stop(self.record)

    def start(self) -> None:
        self.record, _ = start_etcd(
            self.root / "data", log=self.root / "etcd.log", fast_leases=True, ports=self.ports
        )


@pytest.fixture
def restartable_etcd(tmp_path: Path) -> Iterator[RestartableEtcd]:
    """A private etcd the test may restart (see :class:`RestartableEtcd`)."""
    if shutil.which("etcd") is None:
        pytest.fail("etcd is not on PATH: install Debian's etcd-server package")
    server = RestartableEtcd(tmp_path / "etcd")
    try:
        yield server
    finally:
        server.stop()
