"""Object storage: what tabletstore keeps where Bigtable kept GFS files (§4).

One :class:`ObjectStore` interface (``base.py``), three backends chosen by URL scheme, and
wrappers that stack over any of them (the SlateDB way)::

    open_store(url)  ->  RetryingObjectStore            retries, resolves ambiguous creates
                           └─ InstrumentedObjectStore     request / byte counters (optional)
                                └─ S3ObjectStore          s3://bucket/prefix?endpoint_url=...
                                   LocalObjectStore       file:///absolute/path
                                   MemoryObjectStore      memory://[name]

``layout.py`` owns every object key. Fault injection for tests lives in
``tabletstore.testing.faulty_store``; the conformance suite every backend passes in
``tabletstore.testing.store_conformance``.

The S3 backend is imported only when an ``s3://`` URL is opened, so aioboto3 is not loaded by
processes that never talk to S3.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from tabletstore.clock import Clock
from tabletstore.errors import InvalidArgument
from tabletstore.storage_s3.base import ObjectInfo, ObjectStore, Op, object_url
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore, OpStats, StoreStats
from tabletstore.storage_s3.local import LocalObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.storage_s3.retrying import RetryingObjectStore

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    "InstrumentedObjectStore",
    "LocalObjectStore",
    "MemoryObjectStore",
    "ObjectInfo",
    "ObjectStore",
    "Op",
    "OpStats",
    "RetryingObjectStore",
    "StoreStats",
    "check_store",
    "find_layer",
    "object_url",
    "open_store",
]

S = TypeVar("S")

SCHEMES = ("file", "s3", "memory")


def _open_backend(url: str, *, threaded_reads: bool = False) -> ObjectStore:
    if not isinstance(url, str) or "://" not in url:
        raise InvalidArgument(
            f"object store URL {url!r} must look like s3://bucket/prefix, file:///path or "
            "memory://name"
        )
    scheme = urlsplit(url).scheme
    if scheme == "file":
        return LocalObjectStore.from_url(url)
    if scheme == "memory":
        return MemoryObjectStore(url)
    if scheme == "s3":
        from tabletstore.storage_s3.s3 import S3ObjectStore

        return S3ObjectStore(url, threaded_reads=threaded_reads)
    raise InvalidArgument(
        f"unknown object store scheme {scheme!r} in {url!r}; use one of {', '.join(SCHEMES)}"
    )


def open_store(
    url: str,
    *,
    retry: bool = True,
    instrument: bool = False,
    clock: Clock | None = None,
    registry: CollectorRegistry | None = None,
    threaded_reads: bool = False,
) -> ObjectStore:
    """Open the store ``url`` names, wrapped as the module docstring draws.

    Nothing is contacted yet: call ``await store.check()`` (every store and wrapper here has
    it) to fail fast with one clear error naming the URL - a missing bucket (NotFound), bad
    credentials (PermissionDenied), an unreachable endpoint (Unavailable). ``registry`` also
    exports the instrumentation counters to prometheus (implies ``instrument``). Use
    :func:`find_layer` to reach the instrumented layer's ``stats()``. ``threaded_reads``:
    an S3 store reads large ranges in its own threads (s3.py; for bulk copies).
    """
    store: ObjectStore = _open_backend(url, threaded_reads=threaded_reads)
    if instrument or registry is not None:
        store = InstrumentedObjectStore(store, registry=registry)
    if retry:
        store = RetryingObjectStore(store, clock=clock)
    return store


async def check_store(store: ObjectStore) -> None:
    """Run ``store.check()`` (every store and wrapper here has one; the ObjectStore protocol
    does not require it): fail fast, naming the URL, on a store that cannot work."""
    check: Callable[[], Awaitable[None]] | None = getattr(store, "check", None)
    if check is not None:
        await check()


def find_layer(store: object, kind: type[S]) -> S | None:
    """The first layer of type ``kind`` in a stack of wrappers (each has ``.inner``)."""
    layer: object | None = store
    while layer is not None:
        if isinstance(layer, kind):
            return layer
        layer = getattr(layer, "inner", None)
    return None
