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
* A request the store refused for load, certainly without applying it (S3's 503 SlowDown),
  raises :class:`Throttled`, an Unavailable: a wrapper may retry it, a create included,
  without wondering whether an earlier try landed.
* ``offset`` and ``length`` are non-negative; a negative one is ``InvalidArgument``, as is an
  empty key.

Staged creates (:class:`StagingStore`) are what a local directory adds for a copy of many
objects (storage_s3/local.py): written invisibly, then published together. Every wrapper
forwards them (counting, retrying or injecting faults as it does for ``create``), so a copy
through a stack of wrappers goes through each of them; :func:`staging_layer` names a store
that has none.

Server-side copies (:class:`CopyingStore`) are what S3 adds for a copy between two buckets of
one endpoint (storage_s3/s3.py): the server copies the object (CopyObject) and returns its
SHA-256, the bytes never pass through this process. Every wrapper forwards them too
(:func:`copying_layer`); :meth:`CopyingStore.copies_from` says whether a source qualifies.

The helpers below (:class:`Op`, :func:`object_url`, :func:`check_key`, :func:`check_range`) are
shared by every implementation and wrapper so their errors read the same.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tabletstore.errors import InvalidArgument, Unavailable, Unimplemented

if TYPE_CHECKING:
    from tabletstore.storage_s3.local import Staged, Staging

__all__ = [
    "S3_BATCH",
    "CopyingStore",
    "ObjectInfo",
    "ObjectStore",
    "Op",
    "StagingStore",
    "Throttled",
    "check_key",
    "check_range",
    "copies_from",
    "copying_layer",
    "object_url",
    "staging_layer",
]


class Throttled(Unavailable):
    """The store refused the request for load (S3's 503 SlowDown) and did not apply it: back
    off and send it again. On the wire it travels as its ancestor, Unavailable."""


class Op(StrEnum):
    """The kinds of request a store makes, named after the S3 request each one costs.

    Instrumentation counts them and fault injection targets them. ``LIST`` is one page of a
    listing (S3 returns at most 1,000 keys a page); ``DELETE`` is one request, which for
    ``delete_many`` covers up to 1,000 keys (S3's DeleteObjects batch).
    """

    GET = "GET"
    GET_RANGE = "GET_RANGE"
    HEAD = "HEAD"
    PUT = "PUT"
    LIST = "LIST"
    DELETE = "DELETE"


#: Keys per LIST page and per DeleteObjects request on S3; the instrumented wrapper uses it to
#: count requests the way S3 would bill them, whatever the backend.
S3_BATCH = 1000


def object_url(url: str, key: str) -> str:
    """The full name of ``key`` in the store opened from ``url``, for error messages."""
    base, sep, query = url.partition("?")
    joined = f"{base.rstrip('/')}/{key}"
    return f"{joined}{sep}{query}" if sep else joined


def check_key(url: str, key: str) -> None:
    """Raise InvalidArgument unless ``key`` is a non-empty string."""
    if not isinstance(key, str) or not key:
        raise InvalidArgument(f"object key must be a non-empty string, got {key!r} ({url})")


def check_range(url: str, key: str, offset: int, length: int) -> None:
    """Raise InvalidArgument for a negative offset or length."""
    if offset < 0 or length < 0:
        raise InvalidArgument(
            f"byte range must be non-negative, got offset={offset} length={length} "
            f"for {object_url(url, key)}"
        )


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


@runtime_checkable
class StagingStore(ObjectStore, Protocol):
    """A store with staged creates (storage_s3/local.py): objects written invisibly, then
    published together."""

    async def stage_open(self, key: str) -> Staging:
        """A temporary file for the object ``key``, invisible until published."""
        ...

    async def publish(self, staged: Sequence[Staged]) -> list[str]:
        """Make every staged object durable and visible; returns the keys that existed."""
        ...

    async def discard(self, staged: Iterable[Staged]) -> None:
        """Remove the temporary files of staged objects."""
        ...

    async def sweep_staged(self, prefixes: Iterable[str]) -> int:
        """Remove what copies that no longer run staged under ``prefixes``' directories."""
        ...


def staging_layer(url: str, inner: object) -> StagingStore:
    """``inner`` (a wrapper's inner store) as a :class:`StagingStore`; Unimplemented naming
    ``url`` if it has no staged creates."""
    if not isinstance(inner, StagingStore):
        raise Unimplemented(f"{url} has no staged creates (a local directory has)")
    return inner


@runtime_checkable
class CopyingStore(ObjectStore, Protocol):
    """A store that copies objects of another store into itself server-side (storage_s3/s3.py):
    the bytes never pass through this process."""

    def copies_from(self, source: ObjectStore) -> bool:
        """Whether :meth:`copy_from` can copy from ``source`` (a store, or a stack of wrappers
        over one, on the same server and credentials as this one)."""
        ...

    async def copy_from(self, source: ObjectStore, key: str) -> str | None:
        """Copy ``source``'s object ``key`` to the same key here (replacing an object there:
        callers copy immutable objects whose key names one content). Returns the object's
        checksum as the server computed it (``sha256:<hex>``), None if the server gives none.
        NotFound if ``source`` has no such object."""
        ...


def copying_layer(url: str, inner: object) -> CopyingStore:
    """``inner`` (a wrapper's inner store) as a :class:`CopyingStore`; Unimplemented naming
    ``url`` if it has no server-side copies."""
    if not isinstance(inner, CopyingStore):
        raise Unimplemented(f"{url} has no server-side copies (an S3 bucket has)")
    return inner


def copies_from(inner: object, source: ObjectStore) -> bool:
    """A wrapper's :meth:`CopyingStore.copies_from`: its inner store's answer (False if that
    has no server-side copies)."""
    return isinstance(inner, CopyingStore) and inner.copies_from(source)
