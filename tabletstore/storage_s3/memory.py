"""An in-memory ObjectStore, for unit tests and ``memory://`` databases.

It keeps the same contracts as the S3 and local-directory stores (the conformance suite runs
against all three). Stores opened with the same ``memory://name`` URL in one process share
their objects, so a "restarted" embedded database sees what it wrote.

Every method runs without awaiting between its check and its change, so on one event loop a
create is atomic: of two concurrent creates of one key exactly one wins.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from sortedcontainers import SortedDict

from tabletstore.clock import wall_time
from tabletstore.errors import Closed, PreconditionFailed
from tabletstore.storage_s3.base import ObjectInfo, check_key, check_range, object_url

__all__ = ["MemoryObjectStore"]

#: key -> (bytes, created_at); one per shared ``memory://name`` URL.
_SHARED: dict[str, SortedDict] = {}


class MemoryObjectStore:
    """Objects in a sorted dict: key -> (bytes, created_at)."""

    def __init__(self, url: str = "memory://", *, shared: bool = True) -> None:
        self.url = url
        if shared and url != "memory://":
            self._objects = _SHARED.setdefault(url, SortedDict())
        else:
            self._objects = SortedDict()
        self._closed = False

    def _check(self) -> None:
        if self._closed:
            raise Closed(f"object store {self.url} is closed")

    async def check(self) -> None:
        """Nothing can be missing in memory; only a closed store fails."""
        self._check()

    async def get(self, key: str) -> bytes | None:
        self._check()
        check_key(self.url, key)
        entry = self._objects.get(key)
        return None if entry is None else bytes(entry[0])

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        self._check()
        check_key(self.url, key)
        check_range(self.url, key, offset, length)
        entry = self._objects.get(key)
        if entry is None:
            return None
        return bytes(entry[0][offset : offset + length])

    async def head(self, key: str) -> ObjectInfo | None:
        self._check()
        check_key(self.url, key)
        entry = self._objects.get(key)
        if entry is None:
            return None
        return ObjectInfo(key=key, size=len(entry[0]), last_modified=entry[1])

    async def create(self, key: str, data: bytes) -> None:
        self._check()
        check_key(self.url, key)
        if key in self._objects:
            raise PreconditionFailed(f"object {object_url(self.url, key)} already exists")
        self._objects[key] = (bytes(data), wall_time())

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        self._check()
        start = prefix if start_after is None or start_after < prefix else start_after
        # Snapshot the matching keys first: the caller may create or delete while iterating.
        keys: list[str] = []
        for key in self._objects.irange(minimum=start):
            if not key.startswith(prefix):
                break
            if start_after is not None and key <= start_after:
                continue
            keys.append(key)
        for key in keys:
            entry = self._objects.get(key)
            if entry is not None:
                yield ObjectInfo(key=key, size=len(entry[0]), last_modified=entry[1])

    async def delete(self, key: str) -> None:
        self._check()
        check_key(self.url, key)
        self._objects.pop(key, None)

    async def delete_many(self, keys: Iterable[str]) -> None:
        self._check()
        keys = list(keys)
        for key in keys:
            check_key(self.url, key)
        for key in keys:
            self._objects.pop(key, None)

    async def close(self) -> None:
        self._closed = True
