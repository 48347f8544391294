"""What one bulk load makes the master hold at once is bounded.

The master checks a load's files by reading each one whole (``batch/load_files.py``); four
400 MB local files once took it from 187 MB to 1.8 GB. Now a file over ``MAX_LOAD_FILE_BYTES``
is refused from the listing (``tests/unit/batch``), and the files being checked hold at most
``CHECK_BYTES`` together, ``CHECK_PARALLELISM`` files at a time, whatever their number: a
store whose objects are each half the budget has at most two of them fetched and not yet
released at any moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from tabletstore.batch import load_files as lf
from tabletstore.data.schema import TableSchema
from tabletstore.errors import InvalidArgument
from tabletstore.storage_s3.base import ObjectInfo

HALF = lf.CHECK_BYTES // 2


class _Store:
    """Objects of ``HALF`` bytes (as listed; each fetch returns a small stand-in that the
    check refuses, after the fetch) counting the bytes fetched and not yet released."""

    url = "s3://bucket/db"

    def __init__(self, n: int) -> None:
        self.n = n
        self.held = self.peak = 0

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        for i in range(self.n):
            yield ObjectInfo(f"{prefix}f{i:03d}", HALF, 0.0)

    async def get(self, key: str) -> bytes | None:
        self.held += HALF
        self.peak = max(self.peak, self.held)
        try:
            await asyncio.sleep(0.01)  # the others get their chance to fetch meanwhile
        finally:
            self.held -= HALF
        return b"not an sstable"


async def test_the_files_being_checked_hold_at_most_the_check_budget() -> None:
    store = _Store(12)
    with pytest.raises(InvalidArgument):
        await lf.inspect_sources(store, TableSchema(name="t"), prefix="staging/u/job/")  # type: ignore[arg-type]
    assert 0 < store.peak <= lf.CHECK_BYTES, store.peak
