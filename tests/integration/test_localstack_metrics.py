"""``tabletstore local-stack up --workers 1 --metrics``: the status page's line and a Prometheus
scrape configuration whose every target serves ``/metrics``."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tabletstore.cli import localstack

pytestmark = [pytest.mark.slow, pytest.mark.unfaulted, pytest.mark.timeout(180)]


def get(url: str) -> tuple[str, bytes]:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200, url
        return response.headers["Content-Type"], response.read()


@pytest.fixture
def stack_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "stack"
    yield directory
    if (directory / localstack.STACK_FILE).exists():
        localstack.down(directory)  # a failed test must not leave servers running


def test_up_prints_the_status_page_and_a_scrape_configuration(stack_dir: Path) -> None:
    up = subprocess.run(
        [sys.executable, "-m", "tabletstore.cli.main", "local-stack", "up", "--workers", "1",
         "--metrics", "--dir", str(stack_dir)],
        capture_output=True, text=True, timeout=150, env=dict(os.environ),
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    page = re.findall(r"^status page: (http://127\.0\.0\.1:\d+/)$", up.stdout, re.M)
    assert len(page) == 1, up.stdout
    kind, body = get(page[0])
    assert kind.startswith("text/html") and b"tabletstore" in body and b"master" in body

    config = (stack_dir / "prometheus.yml").read_text()
    assert config in up.stdout
    targets = re.findall(r"targets: \['([\d.:]+)'\]", config)
    stack = localstack.load(stack_dir.resolve())
    served = [r for r in stack.processes if r.metrics_url is not None]
    assert sorted(r.role for r in served) == ["master", "worker-0"]
    assert len(targets) == len(served) + 1  # and etcd's own
    for target in targets:
        kind, body = get(f"http://{target}/metrics")
        assert kind.startswith("text/plain")
    for record in served:
        assert b"tabletstore_process_info" in get(f"{record.metrics_url}/metrics")[1]

    # `tabletstore status` points at the same page.
    assert stack.cluster_url is not None
    status = subprocess.run(
        [sys.executable, "-m", "tabletstore.cli.main", "--url", stack.cluster_url, "status"],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, **localstack.environment(stack)},
    )  # fmt: skip
    assert status.returncode == 0, status.stderr
    assert f"status page: {page[0]}" in status.stdout.splitlines(), status.stdout
