"""Every ObjectStore backend and wrapper stack passes the same conformance suite."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tabletstore.clock import ManualClock
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.local import LocalObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.storage_s3.retrying import RetryingObjectStore
from tabletstore.storage_s3.s3 import S3ObjectStore
from tabletstore.testing.faulty_store import FaultyObjectStore
from tabletstore.testing.store_conformance import ObjectStoreConformance


def stacked(inner: ObjectStore) -> ObjectStore:
    """The production stack: retries over counters over the backend."""
    return RetryingObjectStore(InstrumentedObjectStore(inner), clock=ManualClock(), base_delay=0)


class TestMemoryStore(ObjectStoreConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[ObjectStore]:
        store = MemoryObjectStore()
        yield store
        await store.close()


class TestMemoryStoreStacked(ObjectStoreConformance):
    @pytest.fixture
    async def store(self) -> AsyncIterator[ObjectStore]:
        store = stacked(FaultyObjectStore(MemoryObjectStore()))
        yield store
        await store.close()


class TestLocalStore(ObjectStoreConformance):
    object_and_prefix_keys = False

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[ObjectStore]:
        store = LocalObjectStore(tmp_path / "store")
        yield store
        await store.close()


class TestLocalStoreStacked(ObjectStoreConformance):
    object_and_prefix_keys = False

    @pytest.fixture
    async def store(self, tmp_path: Path) -> AsyncIterator[ObjectStore]:
        store = open_store((tmp_path / "store").as_uri(), instrument=True, clock=ManualClock())
        yield store
        await store.close()


class TestS3Store(ObjectStoreConformance):
    @pytest.fixture
    async def store(self, s3_url: str) -> AsyncIterator[ObjectStore]:
        store = S3ObjectStore(s3_url)
        yield store
        await store.close()


class TestS3StoreStacked(ObjectStoreConformance):
    # TestS3Store already pages through >1,000 keys on moto (8 s of PUTs); here the stack only
    # needs to pass listings through, which test_retrying covers page by page.
    pagination_objects = 40

    @pytest.fixture
    async def store(self, s3_url: str) -> AsyncIterator[ObjectStore]:
        store = stacked(S3ObjectStore(s3_url))
        yield store
        await store.close()
