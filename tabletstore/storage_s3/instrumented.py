"""Request and byte counters over any ObjectStore: what the database costs in S3 requests.

S3 bills per request, so the figure that matters for an LSM on object storage is "S3 requests
per 1,000 writes" (and per read). This wrapper counts every call it forwards by
:class:`~tabletstore.storage_s3.base.Op` kind, the way S3 would bill it whatever the backend:

* ``get`` -> GET, ``get_range`` -> GET_RANGE, ``head`` -> HEAD, ``create`` -> PUT,
  ``delete`` -> DELETE: one request each; a staged create (local.py) is one PUT per object
  when ``publish`` publishes it; a server-side copy (``copy_from``) is one PUT, as S3 bills
  CopyObject, and moves no bytes through this process;
* ``delete_many`` -> one DELETE per started batch of 1,000 keys (S3's DeleteObjects limit);
* ``list`` -> one LIST for the first page and one more each time a 1,001st, 2,001st... object
  is yielded (S3 pages hold 1,000 keys), so a listing abandoned early counts only the pages it
  needed.

Bytes are object bytes moved (read by GET / GET_RANGE, written by PUT) by successful calls.
Errors count calls that raised a tabletstore error. Put it *under* the retrying wrapper
(``Retrying(Instrumented(store))``, what ``open_store`` builds) so retries are counted as the
requests they are.

Counters are plain integers (one event loop, no await between read and update). If a
prometheus-client ``CollectorRegistry`` is passed, the same counts are also exported as
``tabletstore_object_store_{requests,bytes,errors}_total{op=...}`` (use one registry per
store, or a distinct ``metric_prefix``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, TypeVar

from tabletstore.errors import TabletStoreError
from tabletstore.storage_s3.base import (
    S3_BATCH,
    ObjectInfo,
    ObjectStore,
    Op,
    copies_from,
    copying_layer,
    staging_layer,
)

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from tabletstore.storage_s3.local import Staged, Staging

__all__ = ["InstrumentedObjectStore", "OpStats", "StoreStats"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class OpStats:
    """Counts for one kind of request."""

    requests: int = 0
    bytes: int = 0
    errors: int = 0

    def __add__(self, other: OpStats) -> OpStats:
        return OpStats(
            self.requests + other.requests, self.bytes + other.bytes, self.errors + other.errors
        )

    def __sub__(self, other: OpStats) -> OpStats:
        return OpStats(
            self.requests - other.requests, self.bytes - other.bytes, self.errors - other.errors
        )


@dataclass(frozen=True, slots=True)
class StoreStats:
    """A snapshot of every counter. ``after - before`` gives the cost of what ran between."""

    ops: Mapping[Op, OpStats] = field(default_factory=dict)

    def __getitem__(self, op: Op) -> OpStats:
        return self.ops.get(op, OpStats())

    @property
    def requests(self) -> int:
        """Requests of every kind."""
        return sum(stats.requests for stats in self.ops.values())

    @property
    def bytes_read(self) -> int:
        return self[Op.GET].bytes + self[Op.GET_RANGE].bytes

    @property
    def bytes_written(self) -> int:
        return self[Op.PUT].bytes

    def __sub__(self, other: StoreStats) -> StoreStats:
        return StoreStats({op: self[op] - other[op] for op in Op})

    def as_dict(self) -> dict[str, dict[str, int]]:
        """``{"GET": {"requests": 3, "bytes": 120, "errors": 0}, ...}`` for every kind."""
        return {
            op.value: {"requests": s.requests, "bytes": s.bytes, "errors": s.errors}
            for op in Op
            for s in (self[op],)
        }


_EXPORTED: Final = (
    ("requests", "Object store requests, by S3 request kind"),
    ("bytes", "Object bytes read or written, by S3 request kind"),
    ("errors", "Object store requests that failed, by S3 request kind"),
)


class _Exporter:
    """A prometheus collector of a store's totals, read when scraped:
    ``<prefix>_{requests,bytes,errors}_total{op=...}``."""

    def __init__(self, prefix: str, totals: dict[Op, list[int]]) -> None:
        self._prefix = prefix
        self._totals = totals

    def describe(self) -> list[Any]:
        return self._families()

    def collect(self) -> list[Any]:
        return self._families()

    def _families(self) -> list[Any]:
        from prometheus_client.core import CounterMetricFamily

        out = []
        for i, (what, doc) in enumerate(_EXPORTED):
            family = CounterMetricFamily(f"{self._prefix}_{what}", doc, labels=["op"])
            for op, counts in list(self._totals.items()):
                if counts[i]:
                    family.add_metric([op.value], counts[i])
            out.append(family)
        return out


#: Inside the class, ``list`` names its method, not the builtin.
_Keys = list[str]


class InstrumentedObjectStore:
    """An ObjectStore that counts what it forwards to ``inner`` (see the module docstring)."""

    def __init__(
        self,
        inner: ObjectStore,
        *,
        registry: CollectorRegistry | None = None,
        metric_prefix: str = "tabletstore_object_store",
    ) -> None:
        self.inner = inner
        self.url = inner.url
        #: Per kind: [requests, bytes, errors] since the last :meth:`reset`, and since the
        #: start (what prometheus exports: its counters never go down). Plain lists bumped
        #: in place: a point read counts twice, and a dataclass per count (or a prometheus
        #: counter's lock per increment) was several % of a cold read's CPU.
        self._counts: dict[Op, list[int]] = {}
        self._totals: dict[Op, list[int]] | None = None
        if registry is not None:
            self._totals = {}
            registry.register(_Exporter(metric_prefix, self._totals))

    def stats(self) -> StoreStats:
        """A snapshot of the counters."""
        return StoreStats({op: OpStats(*c) for op, c in self._counts.items()})

    def reset(self) -> None:
        """Zero the counters (prometheus counters only ever increase and are left alone)."""
        self._counts.clear()

    def _count(self, op: Op, *, requests: int = 0, nbytes: int = 0, errors: int = 0) -> None:
        for counts in (self._counts, self._totals):
            if counts is not None:
                c = counts.get(op)
                if c is None:
                    c = counts[op] = [0, 0, 0]
                c[0] += requests
                c[1] += nbytes
                c[2] += errors

    async def _call(self, op: Op, call: Awaitable[T], requests: int = 1) -> T:
        self._count(op, requests=requests)
        try:
            return await call
        except TabletStoreError:
            self._count(op, errors=1)
            raise

    # Reads ----------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        data = await self._call(Op.GET, self.inner.get(key))
        if data:
            self._count(Op.GET, nbytes=len(data))
        return data

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        # _call inlined: a frame less on every point read.
        self._count(Op.GET_RANGE, requests=1)
        try:
            data = await self.inner.get_range(key, offset, length)
        except TabletStoreError:
            self._count(Op.GET_RANGE, errors=1)
            raise
        if data:
            self._count(Op.GET_RANGE, nbytes=len(data))
        return data

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._call(Op.HEAD, self.inner.head(key))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        self._count(Op.LIST, requests=1)
        yielded = 0
        try:
            async for info in self.inner.list(prefix, start_after=start_after):
                if yielded and yielded % S3_BATCH == 0:
                    self._count(Op.LIST, requests=1)  # S3 fetched the next page for this one.
                yielded += 1
                yield info
        except TabletStoreError:
            self._count(Op.LIST, errors=1)
            raise

    # Writes ---------------------------------------------------------------------------------

    async def create(self, key: str, data: bytes) -> None:
        await self._call(Op.PUT, self.inner.create(key, data))
        self._count(Op.PUT, nbytes=len(data))

    async def delete(self, key: str) -> None:
        await self._call(Op.DELETE, self.inner.delete(key))

    async def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)
        if not batch:
            return
        requests = -(-len(batch) // S3_BATCH)
        await self._call(Op.DELETE, self.inner.delete_many(batch), requests=requests)

    # Server-side copies ---------------------------------------------------------------------

    def copies_from(self, source: ObjectStore) -> bool:
        return copies_from(self.inner, source)

    async def copy_from(self, source: ObjectStore, key: str) -> str | None:
        """One PUT (S3 bills a copy as one), no bytes: none pass through this process."""
        return await self._call(Op.PUT, copying_layer(self.url, self.inner).copy_from(source, key))

    # Staged creates -------------------------------------------------------------------------

    async def stage_open(self, key: str) -> Staging:
        return await staging_layer(self.url, self.inner).stage_open(key)

    async def publish(self, staged: Sequence[Staged]) -> _Keys:
        """Each object published counts as the PUT that creates it."""
        batch = list(staged)
        if not batch:
            return []
        existed = await self._call(
            Op.PUT, staging_layer(self.url, self.inner).publish(batch), requests=len(batch)
        )
        kept = set(existed)
        self._count(Op.PUT, nbytes=sum(s.size for s in batch if s.key not in kept))
        return existed

    async def discard(self, staged: Iterable[Staged]) -> None:
        await staging_layer(self.url, self.inner).discard(staged)

    async def sweep_staged(self, prefixes: Iterable[str]) -> int:
        return await staging_layer(self.url, self.inner).sweep_staged(prefixes)

    # Lifecycle ------------------------------------------------------------------------------

    async def check(self) -> None:
        check: Callable[[], Awaitable[None]] | None = getattr(self.inner, "check", None)
        if check is not None:
            await check()

    async def close(self) -> None:
        await self.inner.close()
