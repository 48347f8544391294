"""A chaos cluster for a test: moto's credentials in the environment while it runs, and every
process stopped afterwards."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tabletstore.testing.chaos.chaos_cluster import ENV, ChaosCluster


@pytest.fixture
def start_cluster(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., ChaosCluster]]:
    """``start_cluster(**ChaosCluster options)``: a started cluster under ``tmp_path``."""
    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    started: list[ChaosCluster] = []

    def start(**options: Any) -> ChaosCluster:
        cluster = ChaosCluster(tmp_path / f"cluster-{len(started)}", **options)
        started.append(cluster)
        cluster.start()
        return cluster

    yield start
    for cluster in started:
        cluster.close()
