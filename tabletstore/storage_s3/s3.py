"""S3 (and S3-compatible servers: MinIO, moto) as the ObjectStore: GFS's replacement (§4).

This is the only module that imports aioboto3 / botocore (an import-linter contract checks it),
and :func:`translate_error` is the only place their exceptions become tabletstore errors.

URL: ``s3://bucket[/prefix][?param=value&...]``. Parameters (all optional):

* ``endpoint_url`` - e.g. ``http://127.0.0.1:9000`` for MinIO or moto's server;
* ``region`` - the signing region;
* ``profile`` - a profile from the shared AWS config files;
* ``addressing_style`` - ``path``, ``virtual`` or ``auto`` (default ``path`` when
  ``endpoint_url`` is given, since local servers have no per-bucket host names, else ``auto``);
* ``connect_timeout`` / ``read_timeout`` - seconds (defaults 5 and 30).

Everything else comes from the standard AWS settings that botocore reads itself: credentials
(``AWS_ACCESS_KEY_ID``... , profiles, instance roles), ``AWS_REGION`` / ``AWS_DEFAULT_REGION``,
and ``AWS_ENDPOINT_URL`` / ``AWS_ENDPOINT_URL_S3``. An unknown parameter is InvalidArgument.

Cost: one aioboto3 ``Session`` per process (per profile) and one client per store, created on
first use and reused for every request (its connection pool keeps connections open); creating
a client per request costs milliseconds of setup and a new TCP connection each time. botocore's
own retries are switched off: :class:`~tabletstore.storage_s3.retrying.RetryingObjectStore`
retries, and resolves ambiguous creates, above this store.

Threaded ranged reads (``S3ObjectStore(url, threaded_reads=True)``, what a copy of a backup
out of a backup location opens): a ranged GET of at least :data:`THREADED_READ_BYTES` goes
through a blocking botocore client in the store's own threads, as boto3's managed transfers
do, instead of the event loop: on a busy machine one event loop reading many large parts gets
one thread's share of the CPU, where a transfer's threads get one each. Same contract and
errors as :meth:`S3ObjectStore.get_range`.

Server-side copies (:meth:`S3ObjectStore.copy_from`, what a copy of a backup between two
buckets of one endpoint uses): one CopyObject per object, asking the server for the copy's
SHA-256 (``x-amz-checksum-algorithm: SHA256``; a single CopyObject's checksum is the whole
object's, as AWS, MinIO and moto compute it), so the bytes never pass through this process
and the copy is still checked against a recorded checksum. The source must be on the same
endpoint, region and credentials (:meth:`S3ObjectStore.copies_from`): the request is signed
for the destination and reads the source with the same identity. A CopyObject is not
create-only; callers copy immutable objects, whose key names one content.

Create-only PUTs use ``If-None-Match: *`` (S3 since 2024-08, MinIO, and moto's server all
answer a collision with 412 PreconditionFailed; verified against moto 5.2 in the conformance
suite). Fencing rests on that answer (docs/architecture/design.md §6: a deposed writer's commit-log
segment or fence must not replace another's), and some S3 look-alikes ignore the header and
overwrite (s3rver 3.7 does: README "S3 implementations"). So :meth:`S3ObjectStore.check`, which
every process runs when it opens its store, also creates one probe object twice: a server that
accepts the second PUT is refused with :class:`~tabletstore.errors.Unimplemented` naming the
endpoint, instead of letting the cluster run unfenced.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import threading
import uuid
from collections.abc import AsyncIterator, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import aioboto3
import aiohttp
import boto3
import botocore.config
import botocore.exceptions
from aiobotocore.config import AioConfig

from tabletstore.errors import (
    Closed,
    Indeterminate,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
    Unimplemented,
)
from tabletstore.storage_s3 import find_layer, layout
from tabletstore.storage_s3.base import (
    S3_BATCH,
    ObjectInfo,
    Throttled,
    check_key,
    check_range,
    object_url,
)

__all__ = ["THREADED_READ_BYTES", "S3Location", "S3ObjectStore", "parse_s3_url", "translate_error"]

#: With ``threaded_reads``, ranged GETs at least this large run in the store's threads.
THREADED_READ_BYTES = 1 << 20

_PARAMS = frozenset(
    {"endpoint_url", "region", "profile", "addressing_style", "connect_timeout", "read_timeout"}
)
_SESSIONS: dict[str | None, aioboto3.Session] = {}
_BLOCKING_SESSIONS: dict[str | None, boto3.session.Session] = {}
#: Blocking clients by their settings, shared by the stores of a process (botocore clients
#: are thread-safe): creating one costs tens of milliseconds, once per process.
_BLOCKING_CLIENTS: dict[tuple[Any, ...], Any] = {}
_BLOCKING_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class S3Location:
    """A parsed ``s3://`` URL."""

    url: str
    bucket: str
    #: Empty, or ends with '/': prepended to every key.
    prefix: str
    endpoint_url: str | None = None
    region: str | None = None
    profile: str | None = None
    addressing_style: str = "auto"
    connect_timeout: float = 5.0
    read_timeout: float = 30.0


def _seconds(url: str, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise InvalidArgument(f"{name} in {url!r} must be a positive number of seconds")
    return value


def parse_s3_url(url: str) -> S3Location:
    """Parse ``s3://bucket/prefix?...``; InvalidArgument naming the URL if it is malformed."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise InvalidArgument(f"not an s3://bucket[/prefix] URL: {url!r}")
    if parts.fragment:
        raise InvalidArgument(f"s3 URL {url!r} may not have a #fragment")
    params = dict(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False))
    unknown = set(params) - _PARAMS
    if unknown:
        raise InvalidArgument(
            f"unknown parameter(s) {sorted(unknown)} in {url!r}; known: {sorted(_PARAMS)}"
        )
    path = parts.path.strip("/")
    style = params.get("addressing_style", "path" if "endpoint_url" in params else "auto")
    if style not in ("auto", "path", "virtual"):
        raise InvalidArgument(f"addressing_style in {url!r} must be auto, path or virtual")
    return S3Location(
        url=url,
        bucket=parts.netloc,
        prefix=f"{path}/" if path else "",
        endpoint_url=params.get("endpoint_url") or None,
        region=params.get("region") or None,
        profile=params.get("profile") or None,
        addressing_style=style,
        connect_timeout=_seconds(url, "connect_timeout", params.get("connect_timeout", "5")),
        read_timeout=_seconds(url, "read_timeout", params.get("read_timeout", "30")),
    )


# Error translation: the one place -------------------------------------------------------------


class _ObjectMissing(NotFound):
    """The key does not exist (NoSuchKey, or a HEAD's bare 404). Methods turn it into None."""


class _RangeNotSatisfiable(TabletStoreError):
    """The range starts at or past the end of an existing object. get_range returns b""."""


_DENIED = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "InvalidSecurity",
    }
)
_THROTTLED = frozenset(
    {
        "SlowDown",
        "ServiceUnavailable",
        "Throttling",
        "ThrottlingException",
        "RequestTimeout",
        "RequestTimeTooSkewed",
        "ConditionalRequestConflict",
        "OperationAborted",
    }
)
#: Failures after which the request may have reached S3 and been applied.
_AMBIGUOUS_TRANSPORT = (
    botocore.exceptions.ReadTimeoutError,
    botocore.exceptions.ConnectionClosedError,
    botocore.exceptions.ResponseStreamingError,
    botocore.exceptions.IncompleteReadError,
    botocore.exceptions.HTTPClientError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    OSError,
)
#: Failures before the request could be sent.
_UNSENT_TRANSPORT = (
    botocore.exceptions.EndpointConnectionError,
    botocore.exceptions.ConnectTimeoutError,
)
_CREDENTIALS = (
    botocore.exceptions.NoCredentialsError,
    botocore.exceptions.PartialCredentialsError,
    botocore.exceptions.CredentialRetrievalError,
    botocore.exceptions.NoAuthTokenError,
    botocore.exceptions.TokenRetrievalError,
)
#: Everything translate_error understands; anything else (a bug) propagates unchanged.
TRANSLATED: tuple[type[BaseException], ...] = (
    botocore.exceptions.BotoCoreError,
    botocore.exceptions.ClientError,
    aiohttp.ClientError,
    asyncio.TimeoutError,
    OSError,
)


def translate_error(
    exc: BaseException, *, url: str, key: str | None, op: str, mutation: bool = False
) -> TabletStoreError:
    """The tabletstore error for a botocore / transport failure of ``op`` on ``key``.

    ``mutation`` marks requests that change the bucket (PUT, DELETE): a failure that may have
    happened after S3 applied them (a read timeout, a dropped connection, a 500) becomes
    Indeterminate instead of Unavailable, because Unavailable promises "not applied".
    """
    where = object_url(url, key) if key is not None else url
    if isinstance(exc, botocore.exceptions.ClientError):
        return _translate_client_error(exc, where=where, url=url, op=op, mutation=mutation)
    if isinstance(exc, _CREDENTIALS):
        return PermissionDenied(f"{op} {where}: no usable AWS credentials ({exc})")
    if isinstance(exc, _UNSENT_TRANSPORT):
        return Unavailable(f"{op} {where}: cannot reach the S3 endpoint ({exc})")
    if isinstance(exc, _AMBIGUOUS_TRANSPORT):
        if mutation:
            return Indeterminate(f"{op} {where}: the connection failed mid-request ({exc})")
        return Unavailable(f"{op} {where}: the connection failed mid-request ({exc})")
    if isinstance(
        exc,
        botocore.exceptions.ParamValidationError
        | botocore.exceptions.ValidationError
        | botocore.exceptions.BaseEndpointResolverError
        | botocore.exceptions.ProfileNotFound
        | botocore.exceptions.InvalidS3AddressingStyleError,
    ):
        return InvalidArgument(f"{op} {where}: {exc}")
    return Unavailable(f"{op} {where}: {exc}")


def _translate_client_error(
    exc: botocore.exceptions.ClientError, *, where: str, url: str, op: str, mutation: bool
) -> TabletStoreError:
    error = exc.response.get("Error", {})
    code = str(error.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    message = str(error.get("Message", "")) or code
    if code in ("NoSuchKey", "404", "NotFound"):
        return _ObjectMissing(f"{where} does not exist")
    if code == "NoSuchBucket":
        return NotFound(f"the bucket of {url} does not exist")
    if code == "InvalidRange":
        return _RangeNotSatisfiable(f"{op} {where}: {message}")
    if code == "PreconditionFailed" or status == 412:
        return PreconditionFailed(f"object {where} already exists")
    if code in _DENIED or status == 403:
        return PermissionDenied(f"{op} {where}: access denied ({code}: {message})")
    if code in _THROTTLED or status == 503:
        # S3 rejected the request without applying it; 409 ConditionalRequestConflict means
        # another conditional write of the key is in flight and AWS documents "retry" for it
        # (the retry then succeeds or gets 412).
        return Throttled(f"{op} {where}: S3 asked to back off ({code}: {message})")
    if status >= 500 or status == 0:
        if mutation:
            return Indeterminate(f"{op} {where}: S3 failed, the change may be applied ({code})")
        return Unavailable(f"{op} {where}: S3 failed ({code}: {message})")
    return InvalidArgument(f"{op} {where}: S3 rejected the request ({code}: {message})")


def _blocking_session(profile: str | None) -> boto3.session.Session:
    """One boto3 Session per profile per process, for threaded reads (REQUIRES: the caller
    holds ``_BLOCKING_LOCK``)."""
    session = _BLOCKING_SESSIONS.get(profile)
    if session is None:
        session = _BLOCKING_SESSIONS[profile] = boto3.session.Session(profile_name=profile)
    return session


def _session(profile: str | None) -> aioboto3.Session:
    """One aioboto3 Session per profile per process: it caches botocore's service models."""
    session = _SESSIONS.get(profile)
    if session is None:
        session = _SESSIONS[profile] = aioboto3.Session(profile_name=profile)
    return session


# The store ------------------------------------------------------------------------------------


def _s3_layer(store: object) -> S3ObjectStore | None:
    """The S3 store under a stack of wrappers, if there is one."""
    return find_layer(store, S3ObjectStore)


class S3ObjectStore:
    """An ObjectStore on one bucket and prefix; see the module docstring."""

    def __init__(
        self,
        url: str,
        *,
        max_pool_connections: int = 64,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        session_token: str | None = None,
        threaded_reads: bool = False,
    ) -> None:
        """``access_key_id`` / ``secret_access_key`` / ``session_token`` override the standard
        credential chain for this store only (otherwise botocore resolves credentials once per
        process and profile, and refreshes temporary ones itself). ``threaded_reads``: large
        ranged GETs in the store's threads (module docstring)."""
        self._loc = parse_s3_url(url)
        self._threaded = threaded_reads
        self._threads: ThreadPoolExecutor | None = None
        self.url = url
        self._max_pool = max_pool_connections
        self._credentials = {
            name: value
            for name, value in (
                ("aws_access_key_id", access_key_id),
                ("aws_secret_access_key", secret_access_key),
                ("aws_session_token", session_token),
            )
            if value is not None
        }
        self._client: Any = None
        self._exit_stack: AsyncExitStack | None = None
        self._client_lock = asyncio.Lock()
        self._closed = False

    @property
    def bucket(self) -> str:
        return self._loc.bucket

    @property
    def prefix(self) -> str:
        return self._loc.prefix

    async def _get_client(self) -> Any:
        """The store's one client, created on first use.

        REQUIRES: called on the event loop every later call uses (aiohttp binds to it).
        """
        if self._closed:
            raise Closed(f"object store {self.url} is closed")
        if self._client is not None:
            return self._client
        async with self._client_lock:
            if self._client is None:
                loc = self._loc
                config = AioConfig(
                    region_name=loc.region,
                    connect_timeout=loc.connect_timeout,
                    read_timeout=loc.read_timeout,
                    retries={"total_max_attempts": 1, "mode": "standard"},
                    max_pool_connections=self._max_pool,
                    s3={"addressing_style": loc.addressing_style},
                )
                stack = AsyncExitStack()
                try:
                    # A plain-HTTP endpoint has no certificates to verify: without this the
                    # client still loads the CA bundle into a TLS context it never uses (about
                    # 0.1-0.3 s on the first request of every store opened).
                    plain = (loc.endpoint_url or "").startswith("http://")
                    tls: dict[str, Any] = {"verify": False} if plain else {}
                    client = await stack.enter_async_context(
                        _session(loc.profile).client(
                            "s3",
                            endpoint_url=loc.endpoint_url,
                            config=config,
                            **tls,
                            **self._credentials,
                        )
                    )
                except TRANSLATED as exc:
                    await stack.aclose()
                    raise translate_error(exc, url=self.url, key=None, op="connect") from exc
                self._exit_stack, self._client = stack, client
        return self._client

    @asynccontextmanager
    async def _translating(
        self, op: str, key: str | None, *, mutation: bool = False
    ) -> AsyncIterator[None]:
        try:
            yield
        except TRANSLATED as exc:
            raise translate_error(exc, url=self.url, key=key, op=op, mutation=mutation) from exc

    def _key(self, key: str) -> str:
        check_key(self.url, key)
        return self._loc.prefix + key

    # Reads ----------------------------------------------------------------------------------

    async def get(self, key: str) -> bytes | None:
        full = self._key(key)
        client = await self._get_client()
        try:
            async with self._translating("GetObject", key):
                response = await client.get_object(Bucket=self._loc.bucket, Key=full)
                async with response["Body"] as body:
                    data: bytes = await body.read()
        except _ObjectMissing:
            return None
        return data

    async def get_range(self, key: str, offset: int, length: int) -> bytes | None:
        full = self._key(key)
        check_range(self.url, key, offset, length)
        if length == 0:
            # HTTP ranges cannot be empty; existence is all there is to report.
            return None if await self.head(key) is None else b""
        if self._threaded and length >= THREADED_READ_BYTES:
            if self._closed:
                raise Closed(f"object store {self.url} is closed")
            if self._threads is None:
                self._threads = ThreadPoolExecutor(self._max_pool, thread_name_prefix="s3-read")
            return await asyncio.get_running_loop().run_in_executor(
                self._threads, self._get_range_blocking, key, full, offset, length
            )
        client = await self._get_client()
        try:
            async with self._translating("GetObject", key):
                response = await client.get_object(
                    Bucket=self._loc.bucket,
                    Key=full,
                    Range=f"bytes={offset}-{offset + length - 1}",
                )
                async with response["Body"] as body:
                    data: bytes = await body.read()
        except _ObjectMissing:
            return None
        except _RangeNotSatisfiable:
            return b""  # The object exists and ends at or before ``offset``.
        return data

    def _blocking_client(self) -> Any:
        """The blocking client for threaded reads: one per process and settings."""
        loc = self._loc
        ident = (
            loc.profile,
            loc.endpoint_url,
            loc.region,
            loc.addressing_style,
            loc.connect_timeout,
            loc.read_timeout,
            self._max_pool,
            tuple(sorted(self._credentials.items())),
        )
        with _BLOCKING_LOCK:
            client = _BLOCKING_CLIENTS.get(ident)
            if client is None:
                # The async client's settings (stubs type them per literal service name).
                settings: dict[str, Any] = {
                    "region_name": loc.region,
                    "connect_timeout": loc.connect_timeout,
                    "read_timeout": loc.read_timeout,
                    "retries": {"total_max_attempts": 1, "mode": "standard"},
                    "max_pool_connections": self._max_pool,
                    "s3": {"addressing_style": loc.addressing_style},
                }
                session: Any = _blocking_session(loc.profile)
                plain = (loc.endpoint_url or "").startswith("http://")
                tls: dict[str, Any] = {"verify": False} if plain else {}
                client = _BLOCKING_CLIENTS[ident] = session.client(
                    "s3",
                    endpoint_url=loc.endpoint_url,
                    config=botocore.config.Config(**settings),
                    **tls,
                    **self._credentials,
                )
            return client

    def _get_range_blocking(self, key: str, full: str, offset: int, length: int) -> bytes | None:
        """:meth:`get_range` on the blocking client (in one of the store's threads)."""
        try:
            try:
                client = self._blocking_client()
                response = client.get_object(
                    Bucket=self._loc.bucket,
                    Key=full,
                    Range=f"bytes={offset}-{offset + length - 1}",
                )
                data: bytes = response["Body"].read()
            except TRANSLATED as exc:
                raise translate_error(exc, url=self.url, key=key, op="GetObject") from exc
        except _ObjectMissing:
            return None
        except _RangeNotSatisfiable:
            return b""  # The object exists and ends at or before ``offset``.
        return data

    async def head(self, key: str) -> ObjectInfo | None:
        full = self._key(key)
        client = await self._get_client()
        try:
            async with self._translating("HeadObject", key):
                response = await client.head_object(Bucket=self._loc.bucket, Key=full)
        except _ObjectMissing:
            # HEAD has no body, so a missing bucket is also a bare 404; check() tells them
            # apart when the store is opened.
            return None
        return ObjectInfo(
            key=key,
            size=int(response["ContentLength"]),
            last_modified=response["LastModified"].timestamp(),
        )

    # Writes ---------------------------------------------------------------------------------

    def copies_from(self, source: object) -> bool:
        """Whether :meth:`copy_from` can copy from ``source`` (module docstring): an S3 store,
        or a stack of wrappers over one, on this endpoint, region and credentials."""
        other = _s3_layer(source)
        if other is None:
            return False
        mine, theirs = self._loc, other._loc
        return (mine.endpoint_url, mine.region, mine.profile, self._credentials) == (
            theirs.endpoint_url,
            theirs.region,
            theirs.profile,
            other._credentials,
        )

    async def copy_from(self, source: object, key: str) -> str | None:
        """Copy ``source``'s object ``key`` to ``key`` here with one CopyObject; returns the
        SHA-256 the server computed (``sha256:<hex>``), None if it returned none. NotFound
        naming the source object if it does not exist."""
        other = _s3_layer(source)
        if other is None or not self.copies_from(other):
            raise InvalidArgument(f"{self.url} cannot copy server-side from {source!r}")
        full, origin = self._key(key), other._key(key)
        client = await self._get_client()
        try:
            async with self._translating("CopyObject", key, mutation=True):
                response = await client.copy_object(
                    Bucket=self._loc.bucket,
                    Key=full,
                    CopySource={"Bucket": other.bucket, "Key": origin},
                    ChecksumAlgorithm="SHA256",
                )
        except _ObjectMissing:
            raise NotFound(f"{object_url(other.url, key)} does not exist") from None
        digest = response.get("CopyObjectResult", {}).get("ChecksumSHA256")
        return None if not digest else "sha256:" + base64.b64decode(digest).hex()

    async def create(self, key: str, data: bytes) -> None:
        full = self._key(key)
        client = await self._get_client()
        async with self._translating("PutObject", key, mutation=True):
            await client.put_object(
                Bucket=self._loc.bucket, Key=full, Body=bytes(data), IfNoneMatch="*"
            )

    async def delete(self, key: str) -> None:
        full = self._key(key)
        client = await self._get_client()
        try:
            async with self._translating("DeleteObject", key, mutation=True):
                await client.delete_object(Bucket=self._loc.bucket, Key=full)
        except _ObjectMissing:
            return  # Some servers answer 404 for a missing key; deletes are idempotent.

    async def delete_many(self, keys: Iterable[str]) -> None:
        # Deduplicated (order kept): one DeleteObjects request should name each key once.
        full_keys = list(dict.fromkeys(self._key(key) for key in keys))
        if not full_keys:
            return
        client = await self._get_client()
        for start in range(0, len(full_keys), S3_BATCH):
            batch = full_keys[start : start + S3_BATCH]
            async with self._translating("DeleteObjects", None, mutation=True):
                response = await client.delete_objects(
                    Bucket=self._loc.bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True},
                )
            self._raise_delete_errors(response.get("Errors") or [])

    def _raise_delete_errors(self, errors: list[dict[str, Any]]) -> None:
        """DeleteObjects reports per-key failures in a 200 response; raise the first one."""
        failures = [e for e in errors if e.get("Code") != "NoSuchKey"]
        if not failures:
            return
        first = failures[0]
        key = str(first.get("Key", ""))[len(self._loc.prefix) :]
        fake = botocore.exceptions.ClientError(
            {"Error": {"Code": first.get("Code", ""), "Message": first.get("Message", "")}},
            "DeleteObjects",
        )
        error = translate_error(fake, url=self.url, key=key, op="DeleteObjects", mutation=True)
        error.args = (f"{error.args[0]} (and {len(failures) - 1} more keys failed)",)
        raise error

    # Listing --------------------------------------------------------------------------------

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectInfo]:
        client = await self._get_client()
        root = self._loc.prefix
        # MaxKeys as S3's own default: servers with smaller defaults (moto: 100) would
        # otherwise cost ten requests where S3 costs one.
        kwargs: dict[str, Any] = {
            "Bucket": self._loc.bucket,
            "Prefix": root + prefix,
            "MaxKeys": S3_BATCH,
        }
        if start_after is not None:
            kwargs["StartAfter"] = root + start_after
        while True:
            async with self._translating("ListObjectsV2", prefix or None):
                page = await client.list_objects_v2(**kwargs)
            for item in page.get("Contents", ()):
                yield ObjectInfo(
                    key=item["Key"][len(root) :],
                    size=int(item["Size"]),
                    last_modified=item["LastModified"].timestamp(),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            kwargs.pop("StartAfter", None)
            kwargs["ContinuationToken"] = token

    # Lifecycle ------------------------------------------------------------------------------

    async def check(self) -> None:
        """Verify that the endpoint answers, the credentials work, the bucket exists and the
        server honours create-only PUTs (:meth:`probe_conditional_create`).

        Raises one error naming the URL: NotFound (no such bucket), PermissionDenied (bad or
        missing credentials), Unavailable (endpoint unreachable), Unimplemented (the server
        ignores ``If-None-Match: *``).
        """
        client = await self._get_client()
        try:
            async with self._translating("HeadBucket", None):
                await client.head_bucket(Bucket=self._loc.bucket)
        except _ObjectMissing as exc:
            raise NotFound(f"the bucket of {self.url} does not exist") from exc
        except PermissionDenied as exc:
            raise PermissionDenied(
                f"access to the bucket of {self.url} was denied: check the AWS credentials"
            ) from exc
        except Unavailable as exc:
            raise Unavailable(f"cannot reach the S3 endpoint of {self.url}: {exc}") from exc
        await self.probe_conditional_create()

    async def create_bucket_if_missing(self) -> bool:
        """Create the URL's bucket unless it exists; True if this call created it.

        For a development endpoint (MinIO, a local stack): production buckets come from
        Terraform. PermissionDenied says so clearly when the credentials may not create it.
        """
        client = await self._get_client()
        try:
            async with self._translating("HeadBucket", None):
                await client.head_bucket(Bucket=self._loc.bucket)
            return False
        except _ObjectMissing:
            pass  # no such bucket: create it below
        kwargs: dict[str, Any] = {"Bucket": self._loc.bucket}
        region = self._loc.region or client.meta.region_name
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            async with self._translating("CreateBucket", None, mutation=True):
                await client.create_bucket(**kwargs)
        except PermissionDenied as exc:
            raise PermissionDenied(
                f"the bucket {self._loc.bucket!r} does not exist at {self.endpoint} and these "
                f"credentials may not create it: create it yourself ({exc})"
            ) from exc
        except InvalidArgument as exc:
            if "BucketAlreadyOwnedByYou" in str(exc):
                return False  # created meanwhile by another of our own processes
            raise
        return True

    @property
    def endpoint(self) -> str:
        """The endpoint URL requests go to (AWS's own when the URL names none)."""
        return self._loc.endpoint_url or "AWS S3 (the default endpoint)"

    async def probe_conditional_create(self) -> None:
        """Create one probe object twice with ``If-None-Match: *``; the second must fail.

        Raises Unimplemented naming the endpoint if the server replaced the object instead
        (fencing would be silently off). Credentials that may not create objects (a read-only
        batch job) skip the probe: such a process never creates an object, so it never relies
        on create-only PUTs.
        """
        key = layout.conditional_create_probe_key(uuid.uuid4().hex)
        try:
            await self.create(key, b"first")
        except PermissionDenied:
            return
        try:
            await self.create(key, b"second")
        except PreconditionFailed:
            return
        finally:
            # Swallowed: a probe object left behind is harmless (no layout key; the bucket's
            # lifecycle rule expires probes/), and the probe's verdict is what matters here.
            with contextlib.suppress(TabletStoreError):
                await self.delete(key)
        raise Unimplemented(
            f"the S3 endpoint {self.endpoint} of {self.url} ignores If-None-Match: * (a second "
            f"create-only PUT of {object_url(self.url, key)} replaced the object): tabletstore "
            "fences deposed writers with create-only PUTs and refuses to run without them; use "
            "AWS S3, MinIO or another server that answers 412 PreconditionFailed"
        )

    async def close(self) -> None:
        """Close the client and its connection pool. Idempotent."""
        self._closed = True
        stack, self._exit_stack, self._client = self._exit_stack, None, None
        threads, self._threads = self._threads, None
        if threads is not None:
            await asyncio.to_thread(threads.shutdown)
        if stack is not None:
            await stack.aclose()
