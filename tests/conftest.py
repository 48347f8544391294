"""Shared fixtures. Server fixtures live in tests/plugins/ (one module per real server)."""

from __future__ import annotations

import importlib.util

import pytest

from tabletstore.storage_s3.memory import MemoryObjectStore

pytest_plugins = [
    name
    for name in ("tests.plugins.s3_server", "tests.plugins.etcd_server")
    if importlib.util.find_spec(name) is not None
]


@pytest.fixture
async def object_store():
    """An empty ObjectStore. Engine tests use this; it is parametrized over every backend
    (memory, file, S3 on moto's server) once those exist."""
    store = MemoryObjectStore()
    yield store
    await store.close()
