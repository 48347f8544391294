"""The Coordinator over etcd 3.4: Chubby (§4) replaced by etcd leases, transactions and watches.

Size: over 800 lines because it is, by the import-linter contract, the only module that
imports aetcd and grpc: the client, its retry rules across restarts, TLS, etcd users and the
translation of every etcd exception must live here and nowhere else.

The client library is ``aetcd`` 1.0.0 (asyncio, gRPC; TLS and etcd users below). PyPI's
``etcd3`` 0.12.0 is synchronous and unmaintained, and its generated protobuf modules import
with current protobuf only in the slow pure-Python mode (or with protobuf downgraded). This is the
only module that imports aetcd or grpc (import-linter checks it), and :func:`_translated` is the one
place their exceptions become tabletstore errors:

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

Riding out a restart (etcd keeps keys, revisions and leases across one, and renews every lease
to its full TTL when the restarted member becomes leader):

* the gRPC channel reconnects quickly (reconnect back-off capped at 1 s instead of gRPC's
  2 minutes), gives a connection 5 s to finish its handshake, and pings an idle connection
  so a silently dead one is noticed;
* every call first waits for the channel to be connected, within ``retry_deadline`` (default
  10 s) from the call's start. A call that could not be sent is retried until that deadline,
  then raises Unavailable. A *read* (get, get_prefix, a transaction of gets only), a lease
  grant (an orphan lease holds no key and expires by itself), a revoke and a watch
  re-establishment are also retried after a failure in flight. A *write* (put, delete, a
  transaction with a put or delete) that failed after it may have reached etcd is not
  retried — it may have been applied, and replaying it could overwrite a newer value or fail
  its own compare — so it raises Unavailable;
* keep-alives are single round trips sent once the channel is connected; ``lease.py`` retries
  them until the lease's own deadline, measured from the last successful one;
* a watch that breaks is re-established from the revision after the last event it delivered,
  so no event is missed or delivered twice. A watch opened without ``start_revision`` reads
  the current revision first and watches from the next one, so it has a revision to resume
  from even before its first event. If etcd has compacted that revision away the watch
  raises NotFound ("history compacted"): the events in between are gone, so the consumer must
  re-read the keys and watch again (the election does exactly that).

URL: ``etcd://host:port[,host:port...]/<namespace>``; every key is stored as
``<namespace>/<key>`` and returned without it (default namespace ``tabletstore``). With
several endpoints the first that answers is used; after an UNAVAILABLE error the next call
picks again, so a caller that retries on Unavailable fails over.

TLS: ``etcd://host:port/ns?ca=CA.pem&cert=CERT.pem&key=KEY.pem`` talks to etcd over
TLS, verifying etcd's certificate against ``ca`` and presenting ``cert``/``key`` as the client
certificate (etcd's ``--client-cert-auth``). aetcd 1.0.0 only opens plaintext channels, so
:class:`_TlsClient` opens the secure one. The query travels with the URL, so every process
given the URL uses TLS to etcd.

Users: ``etcd://USER@host:port/ns?password_file=FILE`` authenticates to etcd as
etcd user USER with the password in FILE (its first line), so the password is not on a command
line; ``etcd://USER:PASSWORD@...`` works too, for programs (the password never appears in
``url`` or error messages). With etcd's authentication on (:func:`enable_auth`, which
``local-stack up --tls`` runs), each user has only its roles' key ranges: the cluster's
processes read and write the namespace, a read-only user may only read it, and a client with
no user gets PermissionDenied. etcd's token (simple token) is lost when etcd restarts or after
5 idle minutes: a request refused with "invalid auth token" was not applied, so the client is
dropped, the next attempt authenticates again, and the request is retried like one never sent.
A watch is created after a read on the same client (etcd cancels a watch whose token it does
not know in a reply that aetcd takes for a created watch, id -1), and one cancelled at
creation anyway drops the client and is created again.

Leases: etcd grants whole seconds (the TTL is rounded up, and etcd raises it to its minimum,
about 1.5 election timeouts). Keep-alives are single LeaseKeepAlive round trips;
``last_renewed`` is read before each is sent (``lease.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

import aetcd
import aetcd.exceptions
import aetcd.rpc
import aetcd.rtypes
import aetcd.utils
import aetcd.watcher
import grpc

from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination import paths
from tabletstore.coordination.base import (
    Compare,
    CompareOp,
    CompareTarget,
    Delete,
    DeleteResult,
    EventType,
    Get,
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
from tabletstore.security.tls import TlsConfig

__all__ = [
    "DEFAULT_NAMESPACE",
    "EtcdCoordinator",
    "EtcdGrant",
    "EtcdLease",
    "enable_auth",
    "parse_etcd_credentials",
    "parse_etcd_url",
    "redact_url",
]

log = logging.getLogger(__name__)
T = TypeVar("T")

DEFAULT_NAMESPACE = "tabletstore"
#: Seconds any single etcd call may take before it is reported Unavailable.
DEFAULT_TIMEOUT = 5.0
#: Seconds a call keeps retrying through unavailability (an etcd restart) before it gives up.
DEFAULT_RETRY_DEADLINE = 10.0
#: Pause between retries: doubles from the first to the last.
_BACKOFF = (0.05, 1.0)

#: gRPC channel options. gRPC's default reconnect back-off grows to 120 s, so a client that saw
#: a few seconds of refused connections could stay away for minutes after etcd is back. Pings
#: every 10 s (etcd refuses pings more frequent than 5 s) detect a connection that died
#: without a reset.
#:
#: ``min_reconnect_backoff_ms`` is not a back-off despite its name: gRPC gives each connection
#: attempt (TCP connect and the HTTP/2 handshake) the longer of it and the current back-off.
#: At 100 ms, with the back-off capped at 1 s, a handshake slower than about 1.2 s (a loaded
#: machine, a slow link) could never complete ("tcp handshaker shutdown") and every call
#: failed as unreachable. 5 s, the call timeout, lets such a connection finish; a refused
#: connection still fails at once and is retried within a second.
_CHANNEL_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 100,
    "grpc.min_reconnect_backoff_ms": int(DEFAULT_TIMEOUT * 1000),
    "grpc.max_reconnect_backoff_ms": 1000,
    "grpc.keepalive_time_ms": 10_000,
    "grpc.keepalive_timeout_ms": 5_000,
}

_UNAVAILABLE_CODES = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


_URL_PARAMETERS = ("ca", "cert", "key", "password_file")


def _parameters(url: str) -> dict[str, str]:
    """An etcd URL's query parameters (the last of each); InvalidArgument for unknown ones."""
    _, sep, query = url.partition("?")
    if not sep:
        return {}
    params = urllib.parse.parse_qs(query, strict_parsing=True)
    unknown = set(params) - set(_URL_PARAMETERS)
    if unknown:
        raise InvalidArgument(
            f"unknown etcd URL parameter(s) {sorted(unknown)} in {redact_url(url)!r}: "
            f"expected {', '.join(_URL_PARAMETERS)}"
        )
    return {name: values[-1] for name, values in params.items()}


def _authority(url: str) -> tuple[str | None, str]:
    """(``user[:password]`` or None, ``host:port[,host:port]``) of an etcd URL."""
    hosts = url[len("etcd://") :].partition("?")[0].partition("/")[0]
    userinfo, at, hosts = hosts.rpartition("@")
    return (userinfo if at else None), hosts


def redact_url(url: str) -> str:
    """``url`` with an inline password replaced by ``***`` (for messages and logs)."""
    if not url.startswith("etcd://"):
        return url
    userinfo, _ = _authority(url)
    if userinfo is None or ":" not in userinfo:
        return url
    user = userinfo.partition(":")[0]
    return url.replace(f"etcd://{userinfo}@", f"etcd://{user}:***@", 1)


def parse_etcd_tls(url: str) -> TlsConfig | None:
    """The TLS files of an etcd URL's query (``?ca=&cert=&key=``), or None without one."""
    params = _parameters(url)
    if not {"ca", "cert", "key"} & set(params):
        return None
    return TlsConfig.of(params.get("ca"), params.get("cert"), params.get("key"))


def parse_etcd_credentials(url: str) -> tuple[str, str] | None:
    """The etcd user and password of an etcd URL (module docstring), or None without a user.
    InvalidArgument naming the problem (no password, both kinds, an unreadable file)."""
    userinfo, _ = _authority(url)
    password_file = _parameters(url).get("password_file")
    if userinfo is None:
        if password_file is not None:
            raise InvalidArgument(
                f"password_file needs a user in the etcd URL (etcd://USER@host:port/ns): "
                f"{redact_url(url)!r}"
            )
        return None
    user, sep, password = (urllib.parse.unquote(x) for x in userinfo.partition(":"))
    if not user:
        raise InvalidArgument(f"empty etcd user name in {redact_url(url)!r}")
    if sep and password_file is not None:
        raise InvalidArgument(
            f"give the etcd password inline or as password_file, not both: {redact_url(url)!r}"
        )
    if password_file is not None:
        try:
            lines = Path(password_file).read_text().splitlines()
        except OSError as exc:
            raise InvalidArgument(
                f"cannot read the etcd password_file {password_file!r}: {exc}"
            ) from exc
        password = lines[0] if lines else ""
    elif not sep:
        raise InvalidArgument(
            f"etcd user {user!r} has no password: add ?password_file=FILE to {redact_url(url)!r}"
        )
    if not password:
        raise InvalidArgument(f"empty etcd password for user {user!r}")
    return user, password


def parse_etcd_url(url: str) -> tuple[list[tuple[str, int]], str]:
    """``etcd://[user@]h:p[,h:p]/ns`` -> ([(host, port)...], namespace). InvalidArgument if
    malformed."""
    if not url.startswith("etcd://"):
        raise InvalidArgument(f"not an etcd URL: {url!r}")
    _, hosts = _authority(url)
    url = redact_url(url)
    rest = url[len("etcd://") :].partition("?")[0]
    namespace = rest.partition("/")[2]
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
    if _REAUTHENTICATE in text or _AUTH_OLD in text:
        return _AuthExpired(f"etcd at {endpoint}: {text}; authenticating again")
    if "authentication failed" in text or "user name is empty" in text:
        return PermissionDenied(
            f"etcd at {endpoint} refused the user: {text} (the URL's etcd://USER@ and "
            "password_file; see docs/operations/security.md)"
        )
    if _rpc_code(exc) == grpc.StatusCode.PERMISSION_DENIED or "permission denied" in text:
        return PermissionDenied(
            f"etcd at {endpoint}: {text} (the etcd user lacks a role for this key range)"
        )
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
#: etcd's answers to a token it no longer knows (restart, 5 idle minutes) or to one issued
#: before a change of users and roles: the request was not applied.
_REAUTHENTICATE = "invalid auth token"
_AUTH_OLD = "revision of auth store is old"


class _NotSent(Unavailable):
    """The call never left this process (no connection to etcd): safe to retry, write or not."""


class _AuthExpired(_NotSent):
    """etcd refused the call's token before applying it: authenticate again and retry."""


def _never_sent(error: Unavailable) -> bool:
    """True when ``error`` proves the request did not reach etcd: we gave up waiting for a
    connection, or gRPC failed it for want of one ("failed to connect to all addresses" is
    its fail-fast answer while the channel has no connection)."""
    if isinstance(error, _NotSent):
        return True
    cause: BaseException | None = error.__cause__
    while cause is not None:
        if isinstance(cause, grpc.aio.AioRpcError):
            details = cause.details() or ""
            return (
                cause.code() == grpc.StatusCode.UNAVAILABLE
                and "failed to connect to all addresses" in details
            )
        cause = cause.__cause__
    return False


class _TlsClient(aetcd.Client):  # type: ignore[misc]
    """aetcd's client over a TLS channel (module docstring): the same stubs on a secure
    channel, authenticating as the URL's etcd user if it names one."""

    def __init__(self, tls: TlsConfig, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        ca, cert, key = tls.read()
        self._credentials = grpc.ssl_channel_credentials(ca, key, cert)

    async def connect(self) -> None:
        if self._connected.is_set():
            return
        if self._is_connecting:  # type: ignore[has-type]
            await asyncio.wait_for(self._connected.wait(), self._connect_wait_timeout)
            return
        try:
            self._is_connecting = True
            target = f"{self._host}:{self._port}"
            self.channel = grpc.aio.secure_channel(
                target, self._credentials, options=list(self._options.items())
            )
            if self._username is not None:
                reply = await aetcd.rpc.AuthStub(self.channel).Authenticate(
                    aetcd.rpc.AuthenticateRequest(name=self._username, password=self._password),
                    timeout=self._timeout,
                )
                self.metadata = (("token", reply.token),)
            self.kvstub = aetcd.rpc.KVStub(self.channel)
            self.clusterstub = aetcd.rpc.ClusterStub(self.channel)
            self.leasestub = aetcd.rpc.LeaseStub(self.channel)
            self.maintenancestub = aetcd.rpc.MaintenanceStub(self.channel)
            self._watcher = aetcd.watcher.Watcher(
                aetcd.rpc.WatchStub(self.channel), timeout=self._timeout, metadata=self.metadata
            )
            self._connected.set()
        finally:
            self._is_connecting = False


class EtcdCoordinator:
    """:class:`~tabletstore.coordination.base.Coordinator` over an etcd 3.4 cluster."""

    def __init__(
        self,
        url: str,
        *,
        clock: Clock | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry_deadline: float = DEFAULT_RETRY_DEADLINE,
    ) -> None:
        if not retry_deadline >= 0:
            raise InvalidArgument(f"retry_deadline must be >= 0 seconds, got {retry_deadline}")
        self._endpoints, self.namespace = parse_etcd_url(url)
        self._tls = parse_etcd_tls(url)
        self._credentials = parse_etcd_credentials(url)
        self.url = redact_url(url)
        self._clock = clock or SystemClock()
        self._timeout = timeout
        self._retry_deadline = retry_deadline
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
            if isinstance(error, _AuthExpired) or (
                isinstance(error, Unavailable) and len(self._endpoints) > 1
            ):
                self._drop_client()  # the next call connects (and authenticates) again
            raise error from exc

    def _drop_client(self) -> None:
        """Forget the client so the next call picks an endpoint again (its close is async:
        the orphaned channel is closed by :meth:`close` via ``_retired``)."""
        if self._client is not None:
            self._retired.append(self._client)
            self._client = None

    def _new_client(self, endpoint: tuple[str, int]) -> aetcd.Client:
        host, port = endpoint
        user, password = self._credentials or (None, None)
        kwargs: dict[str, Any] = {
            "host": host,
            "port": port,
            "timeout": self._timeout,
            "connect_wait_timeout": 3,
            "options": _CHANNEL_OPTIONS,
            "username": user,
            "password": password,
        }
        if self._tls is not None:
            return _TlsClient(self._tls, **kwargs)
        return aetcd.Client(**kwargs)

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

    async def _wait_connected(self, client: aetcd.Client, seconds: float) -> None:
        """Wait up to ``seconds`` for ``client``'s channel to be connected; _NotSent if not."""
        with self._translated():
            await client.connect()
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                await client.channel.channel_ready()
        except TimeoutError:
            error = _NotSent(f"etcd unreachable at {self.endpoint}: no connection")
            if len(self._endpoints) > 1:
                self._drop_client()
            raise error from None

    async def _retrying(self, call: Callable[[aetcd.Client], Awaitable[T]], *, write: bool) -> T:
        """Run ``call`` once connected, retrying Unavailable until the retry deadline: always
        when the request was never sent, and also after a failure in flight unless ``write``
        (see the module docstring)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._retry_deadline
        pause = _BACKOFF[0]
        while True:
            try:
                client = await self._connected()
                # Each wait is bounded by the call timeout so that with several endpoints a
                # dead one is dropped and the next call picks again.
                await self._wait_connected(client, min(self._timeout, deadline - loop.time()))
                with self._translated():
                    return await call(client)
            except Unavailable as exc:
                if write and not _never_sent(exc):
                    raise
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise
                log.debug("etcd call failed, retrying: %s", exc)
                await asyncio.sleep(min(pause, remaining))
                pause = min(pause * 2, _BACKOFF[1])

    async def _current_revision(self) -> int:
        """etcd's current revision (a read of a range that holds no key: NUL is not allowed
        in a key)."""

        async def call(client: aetcd.Client) -> Any:
            return await client.get_prefix((self._prefix + "\x00").encode(), keys_only=True)

        return int((await self._retrying(call, write=False)).header.revision)

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
            await client.get((self._prefix + paths.CHECK).encode())

    async def grant_lease(self, ttl: float, *, safety_margin: float | None = None) -> Lease:
        if not ttl > 0:
            raise InvalidArgument(f"lease ttl must be positive, got {ttl}")
        granted_ttl = math.ceil(ttl)
        sent_at = 0.0

        async def call(client: aetcd.Client) -> Any:
            nonlocal sent_at
            # Read before each attempt is sent: the lease cannot end before sent_at + ttl.
            sent_at = self._clock.monotonic()
            return await client.lease(granted_ttl)

        # Retried even after a failure in flight: a lease granted but never learnt of holds
        # no key and expires by itself.
        granted = await self._retrying(call, write=False)
        return EtcdLease(self, int(granted.id), float(granted.ttl), sent_at, safety_margin)

    async def get(self, key: str) -> KeyValue | None:
        raw_key = self._key(key)
        got = await self._retrying(lambda client: client.get(raw_key), write=False)
        return None if got is None else self._kv(got)

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        start, end = (self._prefix + prefix).encode(), self._range_end(prefix)
        got = await self._retrying(
            lambda client: client.get_range(start, end, sort_order="ascend"), write=False
        )
        return [self._kv(raw) for raw in got]

    async def revoke_lease(self, lease_id: int) -> None:
        await self._lease_revoke(lease_id)

    async def put(self, key: str, value: bytes, *, lease: Lease | None = None) -> int:
        op = Put(key, value, lease.id if lease is not None else 0)
        raw_key = self._key(op.key)
        response = await self._retrying(
            lambda client: client.put(raw_key, op.value, lease=op.lease_id or None), write=True
        )
        return int(response.header.revision)

    async def delete(self, key: str) -> bool:
        raw_key = self._key(key)
        response = await self._retrying(lambda client: client.delete(raw_key), write=True)
        return response is not None

    async def delete_prefix(self, prefix: str) -> int:
        start, end = (self._prefix + prefix).encode(), self._range_end(prefix)
        response = await self._retrying(lambda client: client.delete_range(start, end), write=True)
        return int(response.deleted)

    async def txn(
        self, compares: Sequence[Compare], on_success: Sequence[Op], on_failure: Sequence[Op] = ()
    ) -> TxnResult:
        check_txn_ops(on_success)
        check_txn_ops(on_failure)
        writes = any(not isinstance(op, Get) for op in (*on_success, *on_failure))

        async def call(client: aetcd.Client) -> Any:
            tx = client.transactions
            return await client.transaction(
                compare=[self._compare(tx, c) for c in compares],
                success=[self._op(tx, op) for op in on_success],
                failure=[self._op(tx, op) for op in on_failure],
            )

        succeeded, responses = await self._retrying(call, write=writes)
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

    async def _lease_connected(self, seconds: float) -> None:
        """Wait up to ``seconds`` for a connection, before a keep-alive's send time is read."""
        client = await self._connected()
        await self._wait_connected(client, min(self._timeout, seconds))

    async def _lease_keep_alive(self, lease_id: int) -> bool:
        """One keep-alive round trip (``lease.py`` retries; the send time is read there)."""
        client = await self._connected()
        with self._translated():
            reply = await client.refresh_lease(lease_id)
        return reply is not None and int(reply.TTL) > 0

    async def _lease_revoke(self, lease_id: int) -> None:
        try:
            await self._retrying(lambda client: client.revoke_lease(lease_id), write=False)
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

    async def _before_keep_alive(self, seconds: float) -> None:
        await self._coordinator._lease_connected(seconds)

    async def _send_keep_alive(self) -> bool:
        return await self._coordinator._lease_keep_alive(self.id)

    async def _send_revoke(self) -> None:
        await self._coordinator._lease_revoke(self.id)


class EtcdWatch:
    """A watch on a key prefix (see ``base.Watch``); one aetcd watch underneath, re-established
    from the revision after the last delivered event when its stream breaks."""

    def __init__(
        self, coordinator: EtcdCoordinator, prefix: str, start_revision: int | None
    ) -> None:
        self._coordinator = coordinator
        self._prefix = prefix
        #: The revision to (re)start from: every event before it has been delivered.
        self._next_revision = start_revision
        self._watch: aetcd.rtypes.Watch | None = None
        self._events: AsyncIterator[Any] | None = None
        self._closed = False

    async def __aenter__(self) -> EtcdWatch:
        if self._watch is None and not self._closed:
            c = self._coordinator
            if self._next_revision is None:
                # Watching from the revision after a read (rather than from "now") gives a
                # revision to resume from even before the first event arrives.
                self._next_revision = await c._current_revision() + 1
            await self._establish()
            c._watches.add(self)
        return self

    async def _establish(self) -> None:
        c = self._coordinator
        start, end = (c._prefix + self._prefix).encode(), c._range_end(self._prefix)
        revision = self._next_revision

        async def call(client: aetcd.Client) -> aetcd.rtypes.Watch:
            if c._credentials is not None:
                # etcd refuses a watch whose token it does not know (it restarted) or whose
                # user may not read the range with a reply aetcd takes for a created watch,
                # which then never sees an event. A read on the same client first proves the
                # token (an expired one is renewed by _retrying) and the permission.
                await client.get(start)
            watch = await client.watch(start, range_end=end, start_revision=revision, prev_kv=True)
            if watch.watch_id is None or watch.watch_id < 0:
                # etcd cancelled it as it was created (watch id -1): never retried by aetcd.
                c._drop_client()
                raise _AuthExpired(
                    f"etcd at {c.endpoint} cancelled the watch on {self._prefix!r} as it was "
                    "created (an unknown token or a missing permission); connecting again"
                )
            return watch

        # Creating a watch changes nothing at etcd: retried like a read.
        watch = await c._retrying(call, write=False)
        self._watch, self._events = watch, aiter(watch)

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
        while True:
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
                failure: Unavailable = Unavailable(f"etcd watch stream at {c.endpoint} ended")
            except Unavailable as exc:
                if c._closed:
                    raise Closed(f"coordinator {c.url} was closed") from exc
                failure = exc
            else:
                kind = EventType.PUT if raw.kind == "PUT" else EventType.DELETE
                prev = c._kv(raw.prev_kv) if raw.prev_kv is not None else None
                event = WatchEvent(kind, c._kv(raw.kv), prev)
                # Every event of one revision comes in one response, queued ahead of any
                # stream error, so once one is delivered the rest of its revision follows.
                self._next_revision = event.revision + 1
                return event
            await self._resume(failure)

    async def _resume(self, failure: Unavailable) -> None:
        """Re-establish the watch from the next undelivered revision (retried within the
        coordinator's retry deadline); NotFound if etcd compacted that revision away."""
        log.info(
            "etcd watch on %r broke (%s); resuming from revision %s",
            self._prefix,
            failure,
            self._next_revision,
        )
        await self._cancel_stream()
        await self._establish()

    async def _cancel_stream(self) -> None:
        watch, self._watch, self._events = self._watch, None, None
        if watch is not None:
            # Swallowed: cancelling a watch on a dead connection fails; the stream is gone.
            with contextlib.suppress(*_TRANSLATED):
                await watch.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._coordinator._watches.discard(self)
        await self._cancel_stream()


# -- etcd's own users and roles


@dataclass(frozen=True, slots=True)
class EtcdGrant:
    """An etcd user with one role of its own: ``permission`` on ``keys`` under each of
    ``namespaces`` (``<namespace>/``, the keys an EtcdCoordinator of that namespace uses).
    ``keys`` are coordinator keys (``coordination.paths``): one ending in ``/`` is every key
    under it, any other that key alone; the default ``("",)`` is the whole namespace."""

    user: str
    password: str
    permission: Literal["read", "readwrite"]
    namespaces: tuple[str, ...]
    keys: tuple[str, ...] = ("",)


def _grant_range(namespace: str, key: str) -> tuple[bytes, bytes]:
    """The etcd key range (key, range_end) of coordinator ``key`` in ``namespace``: a prefix
    range for ``""`` or a key ending in ``/``, else the one key (an empty range_end)."""
    full = f"{namespace.strip('/')}/{key}".encode()
    if key == "" or key.endswith("/"):
        return full, aetcd.utils.prefix_range_end(full)
    return full, b""


async def enable_auth(url: str, *, root_password: str, grants: Sequence[EtcdGrant]) -> None:
    """Create etcd's ``root`` user (``root_password``; etcd requires it) and, for each grant,
    a user and a role ``<user>`` with its permission on its keys in its namespaces; then turn
    etcd's authentication on. From then on every etcd client must name a user (module
    docstring). ``url`` reaches etcd before authentication is on (its TLS files, no user)."""
    coordinator = EtcdCoordinator(url)
    try:
        client = await coordinator._connected()
        await coordinator._wait_connected(client, coordinator._timeout)
        stub = aetcd.rpc.AuthStub(client.channel)
        timeout = coordinator._timeout
        rpc = aetcd.rpc
        with coordinator._translated():
            await stub.UserAdd(
                rpc.AuthUserAddRequest(name="root", password=root_password), timeout=timeout
            )
            await stub.UserGrantRole(
                rpc.AuthUserGrantRoleRequest(user="root", role="root"), timeout=timeout
            )
            for grant in grants:
                kind = (
                    rpc.Permission.READWRITE
                    if grant.permission == "readwrite"
                    else rpc.Permission.READ
                )
                await stub.RoleAdd(rpc.AuthRoleAddRequest(name=grant.user), timeout=timeout)
                for namespace in grant.namespaces:
                    for key in grant.keys:
                        start, end = _grant_range(namespace, key)
                        permission = rpc.Permission(permType=kind, key=start, range_end=end)
                        await stub.RoleGrantPermission(
                            rpc.AuthRoleGrantPermissionRequest(name=grant.user, perm=permission),
                            timeout=timeout,
                        )
                await stub.UserAdd(
                    rpc.AuthUserAddRequest(name=grant.user, password=grant.password),
                    timeout=timeout,
                )
                await stub.UserGrantRole(
                    rpc.AuthUserGrantRoleRequest(user=grant.user, role=grant.user), timeout=timeout
                )
            await stub.AuthEnable(rpc.AuthEnableRequest(), timeout=timeout)
    finally:
        await coordinator.close()
