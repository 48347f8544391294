"""The ObjectStore interface: what tabletstore needs from GFS, served by S3 (§4).

Objects are immutable: they are created once (``create``, a conditional PUT with
``If-None-Match: *``) and deleted by garbage collection, never overwritten. Every
implementation (memory, local directory, S3) passes the same conformance suite,
``tabletstore.testing.store_conformance``.

Contracts every implementation keeps:

* ``get`` / ``get_range`` / ``head`` return ``None`` for a missing key.
* ``get_range(key, offset, length)`` returns at most ``length`` bytes starting at ``offset``
  (fewer at the end of the object; ``b""`` past it).
* ``create`` raises :class:`~tabletstore.errors.PreconditionFailed` when the key exists; when it
  returns, the object is durable and visible to every reader.
* ``list`` yields every object under the prefix in lexicographic key order, paginating under
  the hood; ``start_after`` resumes a listing.
* ``delete`` and ``delete_many`` are idempotent (deleting a missing key is not an error).
* Keys are ``/``-separated strings relative to the store's own root (bucket + prefix).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["ObjectInfo", "ObjectStore"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a listing or ``head`` says about one object."""

    key: str
    size: int
    #: Seconds since the epoch when the object was created (garbage collection's grace period).
    last_modified: float


@runtime_checkable
class ObjectStore(Protocol):
    """An async, immutable-object store."""

    #: The URL this store was opened from, for error messages (``s3://bucket/prefix``).
    url: str

    async def get(self, key: str) -> bytes | None:
        """The whole object, or None if it does not exist."""
        ...

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        """``length`` bytes from ``offset`` (fewer at the end), or None if it does not exist."""
        ...

    async def head(self, key: str) -> ObjectInfo | None:
        """Size and age of the object, or None if it does not exist."""
        ...

    async def create(self, key: str, data: bytes) -> None:
        """Create the object; PreconditionFailed if it exists. Durable when this returns."""
        ...

    def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in key order."""
        ...

    async def delete(self, key: str) -> None:
        """Delete the object if it exists."""
        ...

    async def delete_many(self, keys: Iterable[str]) -> None:
        """Delete every listed object that exists (batched where the backend allows)."""
        ...

    async def close(self) -> None:
        """Release connections. The store must not be used afterwards."""
        ...
