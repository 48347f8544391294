"""Shared fixtures. Server fixtures live in tests/plugins/ (one module per real server)."""

from __future__ import annotations

import importlib.util

import pytest

from tabletstore.storage_s3.memory import MemoryObjectStore

pytest_plugins = [
    name
    for name in (
        "tests.plugins.s3_server",
        "tests.plugins.s3rver_server",
        "tests.plugins.seaweedfs_server",
        "tests.plugins.etcd_server",
    )
    if importlib.util.find_spec(name) is not None
]


@pytest.fixture(params=["memory", "file", "s3"])
async def object_store(request, tmp_path):
    """An empty ObjectStore, once per backend: memory, a local directory (tmp_path) and S3 on
    moto's server (a fresh bucket per test, one cached aioboto3 session, the client closed
    after the test). Engine tests use this."""
    if request.param == "memory":
        store = MemoryObjectStore()
    elif request.param == "file":
        from tabletstore.storage_s3.local import LocalObjectStore

        store = LocalObjectStore(tmp_path / "objects")
    else:
        from tabletstore.storage_s3.s3 import S3ObjectStore

        store = S3ObjectStore(request.getfixturevalue("s3_url"))
    yield store
    await store.close()


@pytest.hookimpl(tryfirst=True)  # before xdist's, which names each test's group from its marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Order and group the tests for scripts/test.sh's workers (pytest-xdist, ``--dist
    loadgroup``, which hands each group, or each test outside a group, to the next idle worker:
    the groups largest first, then the single tests in collection order):

    * the tests marked ``slow`` first (a stable sort keeps their order): a minutes-long test
      that starts last is the whole run's tail, while started first it runs beside the short
      ones on the other workers;
    * the tests marked ``slow`` form one group, run one after another on one worker: each
      starts a cluster of processes for minutes, and two or three of them at once on two
      cores starve each other's leases (three at once failed tests that pass alone);
    * except the slow tests also marked ``no_cluster`` (Terraform against moto, etcd's
      snapshot script, the scale benchmark's in-process simulations): they hold no lease, so
      they form a second group that runs beside the first, which is the whole run's critical
      path (the longer the first group, the longer the run);
    * and except the slow end-to-end runs of the benchmarks (``test_bench_*`` modules) and the
      slow tests marked ``unfaulted`` (a cluster no test fault touches: no kill, pause or
      partition, so nothing in them waits for a lease to expire or to be kept through a
      fault): they check what the run did, never a lease's timing, so they form a third group,
      one at a time beside the first group: the other workers would otherwise run out of
      tests minutes before the first group ends, leaving it alone on the machine;
    * the other tests of one module that share a module-scoped fixture (a cluster of processes, a
      front door, a Spark session) form one group, so that fixture is set up once on one
      worker instead of once on every worker that gets one of its tests."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        if item.get_closest_marker("slow") is not None:
            item.add_marker(pytest.mark.xdist_group(_slow_group(item)))
        elif _uses_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))


def _slow_group(item: pytest.Item) -> str:
    if item.get_closest_marker("no_cluster") is not None:
        return "slow-no-cluster"
    if item.path.name.startswith("test_bench_") or item.get_closest_marker("unfaulted"):
        return "slow-steady"
    return "slow"


def _uses_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # not a test function (a doctest, say)
        return False
    return any(
        getattr(fixture, "scope", None) in ("module", "class")
        for fixtures in info.name2fixturedefs.values()
        for fixture in fixtures
    )
