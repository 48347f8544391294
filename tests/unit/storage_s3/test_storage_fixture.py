"""The shared ``object_store`` fixture gives an empty, working store for every backend."""

from __future__ import annotations

import pytest

from tabletstore.errors import PreconditionFailed
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.testing.store_conformance import collect


async def test_object_store_fixture_is_empty_and_create_only(object_store: ObjectStore) -> None:
    assert await collect(object_store, "") == []
    await object_store.create("tables/t/x.parquet", b"data")
    with pytest.raises(PreconditionFailed):
        await object_store.create("tables/t/x.parquet", b"other")
    assert await object_store.get("tables/t/x.parquet") == b"data"
