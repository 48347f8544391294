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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the tests marked ``slow`` first (a stable sort keeps their order): with several
    workers (scripts/test.sh runs pytest-xdist) a minutes-long test that starts last is the
    whole run's tail."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
