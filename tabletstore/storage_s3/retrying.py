"""Retries with backoff over any ObjectStore, and the resolution of ambiguous creates.

GFS hid transient failures from Bigtable (§4); S3 does not: requests are throttled (503
SlowDown), time out, or lose their connection. This wrapper retries what is safe to retry:

* Reads, listings and deletes are idempotent: they are retried on Unavailable and
  Indeterminate, up to ``max_attempts`` tries in all, sleeping a full-jitter exponential
  backoff between tries (``uniform(0, min(max_delay, base_delay * 2**n))``, AWS's
  recommendation). A listing that fails mid-way resumes after the last key it yielded.
* ``create`` is not idempotent: once a create-only PUT may have been sent, a retry can collide
  with our own first attempt. After an ambiguous failure (Unavailable or Indeterminate) the
  wrapper *resolves* it: a ``head`` (and, when the size matches, a ``get``) tells whether our
  bytes landed (success), other bytes are there (PreconditionFailed), or nothing is (create
  again). A retried create that meets PreconditionFailed after an ambiguous attempt is
  resolved the same way, because the object it collided with may be our own.

Throttling. A create the store refused for load (:class:`~tabletstore.storage_s3.base.Throttled`,
S3's 503 SlowDown) was certainly not applied: it needs no resolution and does not count against
``max_attempts``; it is sent again, with the same backoff, until the deadline below. Under a
storm that refuses half the requests, six tries fail together for one create in 64, and every
such failure stops a commit log (its worker must move to a new incarnation, writing METADATA
through the same storm); a deadline of tries fails one in millions.

Resolution has a deadline: ``resolve_within`` seconds (default :data:`RESOLVE_WITHIN`) from
the first attempt's failure. No try, backoff, ``head`` or ``get`` begins after it, and a
backoff ends at it; a request already sent is bounded by the inner store's own timeouts (an
S3 store's ``read_timeout``), so a create spends at most its first attempt, the deadline and
one request. Past the deadline it gives up with what it knows, as when its attempts run out:
Indeterminate if an attempt may have landed, else the last (Unavailable) failure. An
overloaded store whose ``head`` answers slower than its timeout would otherwise hold a create
for ``max_attempts`` tries of ``max_attempts`` heads each, minutes in which a commit log
acknowledges nothing; its caller handles an unknown outcome already (the commit-log writer
plugs the number with an empty fence and goes on under a new incarnation), and create-only
keys mean a late landing of the given-up object can only make it what the plug would have
found.

Contract for callers of ``create``: resolution compares content, so two writers that create
the same key with byte-identical data cannot be told apart, and the loser would be told it
won. Objects that fence (an empty log segment marking a recovered worker) must therefore carry
something unique to their writer (its id and incarnation).

Time and jitter come from the injected :class:`~tabletstore.clock.Clock`, so tests run with a
ManualClock (or zero delays) and never sleep.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, TypeVar

from tabletstore.clock import Clock, SystemClock
from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tabletstore.storage_s3.base import (
    ObjectInfo,
    ObjectStore,
    Throttled,
    copies_from,
    copying_layer,
    object_url,
    staging_layer,
)

if TYPE_CHECKING:
    from tabletstore.storage_s3.local import Staged, Staging

__all__ = ["RetryingObjectStore"]

T = TypeVar("T")

#: Errors after which an idempotent request is simply sent again.
_TRANSIENT = (Unavailable, Indeterminate)

#: Default seconds a create may spend resolving an ambiguous attempt (module docstring).
RESOLVE_WITHIN = 20.0


#: Inside the class, ``list`` names its method, not the builtin.
_Keys = list[str]


class RetryingObjectStore:
    """An ObjectStore that retries ``inner``'s transient failures (see the module docstring)."""

    def __init__(
        self,
        inner: ObjectStore,
        *,
        clock: Clock | None = None,
        max_attempts: int = 6,
        base_delay: float = 0.05,
        max_delay: float = 2.0,
        resolve_within: float = RESOLVE_WITHIN,
    ) -> None:
        if max_attempts < 1 or base_delay < 0 or max_delay < 0 or not resolve_within > 0:
            raise InvalidArgument(
                "RetryingObjectStore needs max_attempts >= 1, non-negative delays and "
                f"resolve_within > 0, got max_attempts={max_attempts} base_delay={base_delay} "
                f"max_delay={max_delay} resolve_within={resolve_within}"
            )
        self.inner = inner
        self.url = inner.url
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._max_attempts = max_attempts
        self._base_delay = base_delay
        self._max_delay = max_delay
        self._resolve_within = resolve_within
        #: Retries made so far (a try after the first), for tests and status pages.
        self.retries = 0

    def backoff(self, failures: int) -> float:
        """The full-jitter delay before the next try, after ``failures`` consecutive ones."""
        cap = min(self._max_delay, self._base_delay * (2 ** (failures - 1)))
        return self._clock.random().uniform(0.0, cap)

    async def _pause(self, failures: int, until: float | None = None) -> None:
        self.retries += 1
        delay = self.backoff(failures)
        if until is not None:
            delay = max(0.0, min(delay, until - self._clock.monotonic()))
        await self._clock.sleep(delay)

    def _past(self, until: float | None) -> bool:
        return until is not None and self._clock.monotonic() >= until

    async def _retry(
        self, call: Callable[[], Awaitable[T]], first: int = 1, until: float | None = None
    ) -> T:
        """Run ``call`` until it succeeds, fails permanently, or runs out of attempts
        (``first``: the number of this first call, after ``first - 1`` failed tries) or of
        time (no further try begins at or after the monotonic instant ``until``)."""
        failure: TabletStoreError | None = None
        for attempt in range(first, self._max_attempts + 1):
            if failure is not None:
                await self._pause(attempt - 1, until)
                if self._past(until):
                    raise failure
            try:
                return await call()
            except _TRANSIENT as exc:
                failure = exc
        assert failure is not None
        raise failure

    # Idempotent operations --------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        return await self._retry(lambda: self.inner.get(key))

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        # The first try without a closure and a frame more: every cold point read is one.
        try:
            return await self.inner.get_range(key, offset, length)
        except _TRANSIENT:
            if self._max_attempts == 1:
                raise
        await self._pause(1)
        return await self._retry(lambda: self.inner.get_range(key, offset, length), first=2)

    async def head(self, key: str) -> ObjectInfo | None:
        return await self._retry(lambda: self.inner.head(key))

    async def delete(self, key: str) -> None:
        await self._retry(lambda: self.inner.delete(key))

    async def delete_many(self, keys: Iterable[str]) -> None:
        batch = list(keys)  # Materialized once: each retry must see the same keys.
        await self._retry(lambda: self.inner.delete_many(batch))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        failures = 0
        resume = start_after
        while True:
            try:
                async for info in self.inner.list(prefix, start_after=resume):
                    resume = info.key
                    failures = 0  # Progress: the budget is for consecutive failures.
                    yield info
                return
            except _TRANSIENT:
                failures += 1
                if failures >= self._max_attempts:
                    raise
            await self._pause(failures)

    # Create ---------------------------------------------------------------------------------

    async def create(self, key: str, data: bytes) -> None:
        data = bytes(data)
        failure: TabletStoreError | None = None  # the last transient failure
        ambiguous = False  # an attempt failed in a way that may have stored our bytes
        maybe_applied = False  # ... and one said so (Indeterminate)
        until: float | None = None  # set by the first failure (module docstring)
        counted = 0  # failed tries that count against max_attempts (not the throttled)
        tries = 0
        while True:
            if tries:
                await self._pause(min(tries, 16), until)
                if self._past(until):
                    break
            tries += 1
            try:
                await self.inner.create(key, data)
                return
            except PreconditionFailed as collision:
                if not ambiguous:
                    raise  # Nothing of ours can have landed: someone else's object.
                try:
                    if await self._resolve(key, data, until):
                        return
                except _TRANSIENT as exc:
                    raise Indeterminate(
                        f"create of {object_url(self.url, key)}: it collided with an object "
                        f"that may be our own earlier attempt, and reading it failed ({exc})"
                    ) from collision
                raise
            except Throttled as exc:
                # Refused without being applied: nothing to resolve, and not a try spent.
                # Only the deadline bounds a throttled create (module docstring).
                failure = exc
                if until is None:
                    until = self._clock.monotonic() + self._resolve_within
                continue
            except _TRANSIENT as exc:
                failure = exc
                ambiguous = True
                maybe_applied = maybe_applied or isinstance(exc, Indeterminate)
                counted += 1
                if until is None:
                    until = self._clock.monotonic() + self._resolve_within
                try:
                    if await self._resolve(key, data, until):
                        return
                except _TRANSIENT:
                    pass  # Cannot tell yet; the next try (or its collision) will.
            if counted >= self._max_attempts or self._past(until):
                break
        assert failure is not None
        if maybe_applied and not isinstance(failure, Indeterminate):
            raise Indeterminate(
                f"create of {object_url(self.url, key)} may have been applied: an attempt's "
                f"outcome is unknown and the last one failed ({failure})"
            ) from failure
        raise failure

    async def _resolve(self, key: str, data: bytes, until: float | None) -> bool:
        """True if ``key`` holds exactly ``data``; False if it is absent.

        Raises PreconditionFailed if it holds other bytes, and Unavailable / Indeterminate if
        the store cannot be read (after this wrapper's own retries) before ``until``.
        """
        if self._past(until):
            raise Unavailable(f"no time left to read {object_url(self.url, key)}")
        info = await self._retry(lambda: self.inner.head(key), until=until)
        if info is None:
            return False
        if info.size == len(data):
            if self._past(until):
                raise Unavailable(f"no time left to read {object_url(self.url, key)}")
            stored = await self._retry(lambda: self.inner.get(key), until=until)
            if stored is None:
                return False  # Deleted since the head: nothing of ours is there now.
            if stored == data:
                return True
        raise PreconditionFailed(
            f"object {object_url(self.url, key)} already exists with other content"
        )

    # Server-side copies ---------------------------------------------------------------------
    # Retried as idempotent: a copy of an immutable object writes the same bytes each time.

    def copies_from(self, source: ObjectStore) -> bool:
        return copies_from(self.inner, source)

    async def copy_from(self, source: ObjectStore, key: str) -> str | None:
        layer = copying_layer(self.url, self.inner)
        return await self._retry(lambda: layer.copy_from(source, key))

    # Staged creates -------------------------------------------------------------------------
    # Forwarded as they are: they write a local directory, where a failure is not transient.

    async def stage_open(self, key: str) -> Staging:
        return await staging_layer(self.url, self.inner).stage_open(key)

    async def publish(self, staged: Sequence[Staged]) -> _Keys:
        return await staging_layer(self.url, self.inner).publish(staged)

    async def discard(self, staged: Iterable[Staged]) -> None:
        await staging_layer(self.url, self.inner).discard(staged)

    async def sweep_staged(self, prefixes: Iterable[str]) -> int:
        return await staging_layer(self.url, self.inner).sweep_staged(prefixes)

    # Lifecycle ------------------------------------------------------------------------------

    async def check(self) -> None:
        """The inner store's check, retried like a read."""
        check: Callable[[], Awaitable[None]] | None = getattr(self.inner, "check", None)
        if check is not None:
            await self._retry(check)

    async def close(self) -> None:
        await self.inner.close()
