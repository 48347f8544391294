"""The Coordinator over etcd 3.4: Chubby (§4) replaced by etcd leases, transactions and watches.

The client library is ``aetcd`` 1.0.0 (asyncio, gRPC). PyPI's ``etcd3`` 0.12.0 is not an
option: it fails to import with current protobuf ("Descriptors cannot be created
directly"). This is the only module that imports aetcd or grpc (import-linter checks it), and
:func:`_translated` is the one place their exceptions become tabletstore errors:

==========================================  ===========================================
aetcd / grpc                                 tabletstore
==========================================  ===========================================
ConnectionFailedError, UNAVAILABLE,          Unavailable("etcd unreachable at host:port")
ConnectionTimeoutError, DEADLINE_EXCEEDED,
WatchTimeoutError, connect wait timeout
"requested lease not found"                  Fenced (the lease this write relied on ended)
InvalidArgumentError ("duplicate key"...)    InvalidArgument
RevisionCompactedError                       NotFound (re-read, then watch from now)
UnauthenticatedError                         PermissionDenied
any other ClientError / RpcError             Unavailable (etcd-side trouble: retry)
==========================================  ===========================================

A transaction whose compares fail is a normal result (``succeeded=False``), never an error.

URL: ``etcd://host:port[,host:port...]/<namespace>``; every key is stored as
``<namespace>/<key>`` and returned without it (default namespace ``tabletstore``). With
several endpoints the first that answers is used; after an UNAVAILABLE error the next call
picks again, so a caller that retries on Unavailable fails over.

Leases: etcd grants whole seconds (the TTL is rounded up, and etcd raises it to its minimum,
about 1.5 election timeouts). Keep-alives are single LeaseKeepAlive round trips;
``last_renewed`` is read before each is sent (``lease.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator, Iterator, Sequence
from types import TracebackType
from typing import Any

import aetcd
import aetcd.exceptions
import aetcd.rtypes
import aetcd.utils
import grpc

from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination.base import (
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    DeleteResult,
    EventType,
    GetResult,
    KeyValue,
    Lease,
    Op,
    OpResult,
    Put,
    PutResult,
    TxnResult,
    WatchEvent,
    check_key,
    check_txn_ops,
)
from tabletstore.coordination.election import Election
from tabletstore.coordination.lease import LeaseBase
from tabletstore.errors import (
    Closed,
    Fenced,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    TabletStoreError,
    Unavailable,
)

__all__ = ["DEFAULT_NAMESPACE", "EtcdCoordinator", "EtcdLease", "parse_etcd_url"]

DEFAULT_NAMESPACE = "tabletstore"
#: Seconds any single etcd call may take before it is reported Unavailable.
DEFAULT_TIMEOUT = 5.0

_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


def parse_etcd_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://h:p[,h:p]/ns`` -> ([(host, port)...], namespace). InvalidArgument if malformed."""
    if not url.startswith("etcd://"):
        raise InvalidArgument(f"not an etcd URL: {url!r}")
    rest = url[len("etcd://") :]
    hosts, _, namespace = rest.partition("/")
    namespace = namespace.strip("/") or DEFAULT_NAMESPACE
    if "\x00" in namespace:
        raise InvalidArgument(f"bad etcd namespace in {url!r}")
    endpoints: list[tuple[str, int]] = []
    for part in hosts.split(","):
        host, sep, port = part.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise InvalidArgument(
                f"bad etcd endpoint {part!r} in {url!r}: expected etcd://host:port[,host:port]/namespace"
            )
        endpoints.append((host.strip("[]"), int(port)))
    return endpoints, namespace


def _endpoint_text(endpoint: tuple[str, int]) -> str:
    host, port = endpoint
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _rpc_code(exc: BaseException) -> grpc.StatusCode | None:
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, grpc.aio.AioRpcError):
            code: grpc.StatusCode = cause.code()
            return code
        cause = cause.__cause__
    return None


def translate(exc: BaseException, endpoint: str) -> TabletStoreError:
    """The one mapping from aetcd/grpc exceptions to tabletstore errors (table above)."""
    text = str(exc) or type(exc).__name__
    if isinstance(exc, TabletStoreError):
        return exc
    if "requested lease not found" in text:
        return Fenced(f"etcd at {endpoint}: lease not found (expired or revoked)")
    if isinstance(exc, aetcd.RevisionCompactedError):
        return NotFound(
            f"etcd at {endpoint}: {text}; re-read the keys and watch from a newer revision"
        )
    if isinstance(exc, aetcd.InvalidArgumentError):
        return InvalidArgument(f"etcd at {endpoint} rejected the request: {text}")
    if isinstance(exc, aetcd.exceptions.UnauthenticatedError):
        return PermissionDenied(f"etcd at {endpoint}: {text}")
    code = _rpc_code(exc)
    if (
        isinstance(
            exc,
            aetcd.ConnectionFailedError
            | aetcd.ConnectionTimeoutError
            | aetcd.WatchTimeoutError
            | TimeoutError
            | OSError,
        )
        or code in _UNAVAILABLE_CODES
    ):
        return Unavailable(f"etcd unreachable at {endpoint}: {text}")
    return Unavailable(f"etcd at {endpoint} failed: {text}")


_TRANSLATED = (aetcd.ClientError, grpc.RpcError, TimeoutError, OSError)


class EtcdCoordinator:
    """:class:`~tabletstore.coordination.base.Coordinator` over an etcd 3.4 cluster."""

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        self._endpoints, self.namespace = parse_etcd_url(url)
        self.url = url
        self._clock = clock or SystemClock()
        self._timeout = timeout
        self._prefix = f"{self.namespace}/"
        self._client: aetcd.Client | None = None
        #: Clients dropped after an endpoint failed; closed by close().
        self._retired: list[aetcd.Client] = []
        self._endpoint = self._endpoints[0]
        self._closed = False
        self._watches: set[EtcdWatch] = set()
        self._connect_lock = asyncio.Lock()

    # -- connection and error translation

    @property
    def endpoint(self) -> str:
        """The endpoint in use (or to be tried first), as ``host:port``."""
        return _endpoint_text(self._endpoint)

    @contextlib.contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except _TRANSLATED as exc:
            error = translate(exc, self.endpoint)
            if isinstance(error, Unavailable) and len(self._endpoints) > 1:
                self._drop_client()
            raise error from exc

    def _drop_client(self) -> None:
        """Forget the client so the next call picks an endpoint again (its close is async:
        the orphaned channel is closed by :meth:`close` via ``_retired``)."""
        if self._client is not None:
            self._retired.append(self._client)
            self._client = None

    def _new_client(self, endpoint: tuple[str, int]) -> aetcd.Client:
        host, port = endpoint
        return aetcd.Client(host=host, port=port, timeout=self._timeout, connect_wait_timeout=3)

    async def _connected(self) -> aetcd.Client:
        if self._closed:
            raise Closed(f"coordinator {self.url} was closed")
        if self._client is not None:
            return self._client
        async with self._connect_lock:
            if self._client is None:
                self._client = await self._pick_endpoint()
            return self._client

    async def _pick_endpoint(self) -> aetcd.Client:
        if len(self._endpoints) == 1:
            self._endpoint = self._endpoints[0]
            return self._new_client(self._endpoint)
        failures: list[str] = []
        for endpoint in self._endpoints:
            client = self._new_client(endpoint)
            try:
                await client.get(b"\x00tabletstore-probe")
            except _TRANSLATED as exc:
                failures.append(f"{_endpoint_text(endpoint)} ({type(exc).__name__})")
                await client.close()
                continue
            self._endpoint = endpoint
            return client
        raise Unavailable(f"etcd unreachable at every endpoint: {', '.join(failures)}")

    # -- key encoding

    def _key(self, key: str) -> bytes:
        return (self._prefix + check_key(key)).encode()

    def _range_end(self, prefix: str) -> bytes:
        end: bytes = aetcd.utils.prefix_range_end((self._prefix + prefix).encode())
        return end

    def _kv(self, raw: Any) -> KeyValue:
        key = bytes(raw.key).decode()
        return KeyValue(
            key=key[len(self._prefix) :],
            value=bytes(raw.value),
            create_revision=int(raw.create_revision),
            mod_revision=int(raw.mod_revision),
            version=int(raw.version),
            lease_id=int(raw.lease),
        )

    # -- the Coordinator protocol

    async def check(self) -> None:
        client = await self._connected()
        with self._translated():
            await client.get((self._prefix + ".check").encode())

    async def grant_lease(self, ttl: float, *, safety_margin: float | None = None) -> Lease:
        if not ttl > 0:
            raise InvalidArgument(f"lease ttl must be positive, got {ttl}")
        client = await self._connected()
        sent_at = self._clock.monotonic()
        with self._translated():
            granted = await client.lease(math.ceil(ttl))
        return EtcdLease(self, int(granted.id), float(granted.ttl), sent_at, safety_margin)

    async def get(self, key: str) -> KeyValue | None:
        client = await self._connected()
        with self._translated():
            got = await client.get(self._key(key))
        return None if got is None else self._kv(got)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        client = await self._connected()
        with self._translated():
            got = await client.get_range(
                (self._prefix + prefix).encode(), self._range_end(prefix), sort_order="ascend"
            )
        return [self._kv(raw) for raw in got]

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        op = Put(key, value, lease.id if lease is not None else 0)
        client = await self._connected()
        with self._translated():
            response = await client.put(self._key(op.key), op.value, lease=op.lease_id or None)
        return int(response.header.revision)

    async def delete(self, key: str) -> bool:
        client = await self._connected()
        with self._translated():
            response = await client.delete(self._key(key))
        return response is not None

    async def delete_prefix(self, prefix: str) -> int:
        client = await self._connected()
        with self._translated():
            response = await client.delete_range(
                (self._prefix + prefix).encode(), self._range_end(prefix)
            )
        return int(response.deleted)

    async def txn(
        self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()
    ) -> TxnResult:
        check_txn_ops(on_success)
        check_txn_ops(on_failure)
        client = await self._connected()
        tx = client.transactions
        with self._translated():
            succeeded, responses = await client.transaction(
                compare=[self._compare(tx, c) for c in compares],
                success=[self._op(tx, op) for op in on_success],
                failure=[self._op(tx, op) for op in on_failure],
            )
        ops = on_success if succeeded else on_failure
        return TxnResult(
            bool(succeeded), tuple(self._result(o, r) for o, r in zip(ops, responses, strict=True))
        )

    def _compare(self, tx: Any, compare: Compare) -> Any:
        key = self._key(compare.key)
        target = {
            CompareTarget.VALUE: tx.value,
            CompareTarget.CREATE: tx.create,
            CompareTarget.MOD: tx.mod,
            CompareTarget.VERSION: tx.version,
        }[compare.target](key)
        operand = compare.operand
        if compare.op is CompareOp.EQUAL:
            return target == operand
        if compare.op is CompareOp.NOT_EQUAL:
            return target != operand
        if compare.op is CompareOp.LESS:
            return target < operand
        return target > operand

    def _op(self, tx: Any, op: Op) -> Any:
        if isinstance(op, Put):
            return tx.put(self._key(op.key), op.value, lease=op.lease_id)
        end = self._range_end(op.key) if op.prefix else None
        if isinstance(op, Delete):
            return tx.delete(self._key(op.key), range_end=end)
        return tx.get(self._key(op.key), range_end=end)

    def _result(self, op: Op, response: Any) -> OpResult:
        if isinstance(op, Put):
            return PutResult(int(response.response_put.header.revision))
        if isinstance(op, Delete):
            return DeleteResult(int(response.response_delete_range.deleted))
        # aetcd gives a range response as [(value, rtypes.Get)]; etcd sorts it by key.
        kvs = sorted((self._kv(get) for _, get in response), key=lambda kv: kv.key)
        return GetResult(tuple(kvs))

    def watch_prefix(self, prefix: str, *, start_revision: int | None = None) -> EtcdWatch:
        if start_revision is not None and start_revision < 1:
            raise InvalidArgument(f"start_revision must be >= 1, got {start_revision}")
        return EtcdWatch(self, prefix, start_revision)

    def election(self, name: str) -> Election:
        return Election(self, name)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for watch in list(self._watches):
            await watch.close()
        clients = [*self._retired, *([self._client] if self._client is not None else [])]
        self._retired = []
        self._client = None
        for client in clients:
            # Swallowed: closing a channel to a dead endpoint can fail; nothing is left to do.
            with contextlib.suppress(*_TRANSLATED):
                await client.close()

    # -- used by EtcdLease and EtcdWatch

    async def _lease_keep_alive(self, lease_id: int) -> bool:
        client = await self._connected()
        with self._translated():
            reply = await client.refresh_lease(lease_id)
        return reply is not None and int(reply.TTL) > 0

    async def _lease_revoke(self, lease_id: int) -> None:
        client = await self._connected()
        try:
            with self._translated():
                await client.revoke_lease(lease_id)
        except Fenced:
            pass  # Already gone at etcd: revoking is idempotent.


class EtcdLease(LeaseBase):
    def __init__(
        self,
        coordinator: EtcdCoordinator,
        lease_id: int,
        ttl: float,
        sent_at: float,
        margin: float | None,
    ) -> None:
        super().__init__(
            lease_id, ttl, granted_at=sent_at, clock=coordinator._clock, safety_margin=margin
        )
        self._coordinator = coordinator

    async def _send_keep_alive(self) -> bool:
        return await self._coordinator._lease_keep_alive(self.id)

    async def _send_revoke(self) -> None:
        await self._coordinator._lease_revoke(self.id)


class EtcdWatch:
    """A watch on a key prefix (see ``base.Watch``); one aetcd watch underneath."""

    def __init__(
        self, coordinator: EtcdCoordinator, prefix: str, start_revision: int | None
    ) -> None:
        self._coordinator = coordinator
        self._prefix = prefix
        self._start_revision = start_revision
        self._watch: aetcd.rtypes.Watch | None = None
        self._events: AsyncIterator[Any] | None = None
        self._closed = False

    async def __aenter__(self) -> EtcdWatch:
        if self._watch is None and not self._closed:
            c = self._coordinator
            client = await c._connected()
            with c._translated():
                self._watch = await client.watch(
                    (c._prefix + self._prefix).encode(),
                    range_end=c._range_end(self._prefix),
                    start_revision=self._start_revision,
                    prev_kv=True,
                )
            self._events = aiter(self._watch)
            c._watches.add(self)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    def __aiter__(self) -> AsyncIterator[WatchEvent]:
        return self

    async def __anext__(self) -> WatchEvent:
        await self.__aenter__()
        c = self._coordinator
        if self._closed or self._events is None:
            raise StopAsyncIteration
        try:
            with c._translated():
                raw = await anext(self._events)
        except StopAsyncIteration:
            if c._closed:
                raise Closed(f"coordinator {c.url} was closed") from None
            if self._closed:
                raise
            raise Unavailable(f"etcd watch stream at {c.endpoint} ended") from None
        kind = EventType.PUT if raw.kind == "PUT" else EventType.DELETE
        prev = c._kv(raw.prev_kv) if raw.prev_kv is not None else None
        return WatchEvent(kind, c._kv(raw.kv), prev)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._coordinator._watches.discard(self)
        if self._watch is not None:
            # Swallowed: cancelling a watch on a dead connection fails; the stream is gone.
            with contextlib.suppress(*_TRANSLATED):
                await self._watch.cancel()
