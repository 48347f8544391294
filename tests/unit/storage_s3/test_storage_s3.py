"""S3ObjectStore specifics: URL parsing, error translation, check(), prefixes, client reuse."""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from collections.abc import Iterator

import botocore.exceptions
import pytest

from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    PreconditionFailed,
    Unavailable,
    Unimplemented,
)
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import Throttled
from tabletstore.storage_s3.retrying import RetryingObjectStore
from tabletstore.storage_s3.s3 import S3ObjectStore, parse_s3_url, translate_error
from tabletstore.testing.store_conformance import collect
from tests.plugins.s3rver_server import STORE_KEYS

URL = "s3://bucket/db"


def client_error(code: str, status: int, op: str = "GetObject") -> botocore.exceptions.ClientError:
    return botocore.exceptions.ClientError(
        {
            "Error": {"Code": code, "Message": f"{code} happened"},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        op,
    )


# URL parsing --------------------------------------------------------------------------------


def test_parse_url_with_parameters() -> None:
    loc = parse_s3_url("s3://bkt/a/b/?endpoint_url=http://127.0.0.1:9000&region=eu-west-1")
    assert (loc.bucket, loc.prefix) == ("bkt", "a/b/")
    assert (loc.endpoint_url, loc.region, loc.addressing_style) == (
        "http://127.0.0.1:9000",
        "eu-west-1",
        "path",
    )
    bare = parse_s3_url("s3://bkt")
    assert (bare.prefix, bare.endpoint_url, bare.addressing_style) == ("", None, "auto")


@pytest.mark.parametrize(
    "url",
    [
        "s3:///prefix",
        "gs://bkt/x",
        "s3://bkt/x?endpoint=http://x",
        "s3://bkt/x?read_timeout=-1",
        "s3://bkt/x?connect_timeout=soon",
        "s3://bkt/x?addressing_style=sideways",
        "s3://bkt/x#frag",
    ],
)
def test_malformed_urls_are_invalid_and_named(url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        parse_s3_url(url)
    assert url in str(info.value)


@pytest.mark.parametrize("url", ["ftp://x/y", "no-scheme", "s3:/x"])
def test_open_store_rejects_unknown_urls(url: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        open_store(url)
    assert url in str(info.value)


# Error translation (the one place) ------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "status", "mutation", "expected"),
    [
        ("NoSuchBucket", 404, False, NotFound),
        ("PreconditionFailed", 412, True, PreconditionFailed),
        ("AccessDenied", 403, False, PermissionDenied),
        ("InvalidAccessKeyId", 403, False, PermissionDenied),
        ("SignatureDoesNotMatch", 403, True, PermissionDenied),
        ("403", 403, False, PermissionDenied),
        ("SlowDown", 503, True, Throttled),
        ("ServiceUnavailable", 503, False, Throttled),
        ("ConditionalRequestConflict", 409, True, Throttled),
        ("InternalError", 500, False, Unavailable),
        ("InternalError", 500, True, Indeterminate),
        ("KeyTooLongError", 400, True, InvalidArgument),
    ],
)
def test_client_errors_are_translated(
    code: str, status: int, mutation: bool, expected: type[Exception]
) -> None:
    error = translate_error(
        client_error(code, status), url=URL, key="k", op="PutObject", mutation=mutation
    )
    assert type(error) is expected
    assert URL in str(error)
    if expected in (Unavailable, Throttled):
        assert not isinstance(error, Indeterminate)
    # Only a refusal the store never applied is Throttled (a create retries it freely).
    assert isinstance(error, Throttled) == (expected is Throttled)


def test_missing_key_is_not_a_public_error() -> None:
    error = translate_error(client_error("NoSuchKey", 404), url=URL, key="k", op="GetObject")
    assert isinstance(error, NotFound)  # A private subclass that get/head turn into None.
    assert type(error) is not NotFound


@pytest.mark.parametrize(
    ("exc", "mutation", "expected"),
    [
        (botocore.exceptions.EndpointConnectionError(endpoint_url="http://x"), True, Unavailable),
        (botocore.exceptions.ConnectTimeoutError(endpoint_url="http://x"), True, Unavailable),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), False, Unavailable),
        (botocore.exceptions.ReadTimeoutError(endpoint_url="http://x"), True, Indeterminate),
        (botocore.exceptions.ConnectionClosedError(endpoint_url="http://x"), True, Indeterminate),
        (botocore.exceptions.NoCredentialsError(), False, PermissionDenied),
        (botocore.exceptions.ParamValidationError(report="bad"), False, InvalidArgument),
        (TimeoutError(), True, Indeterminate),
    ],
)
def test_transport_errors_are_translated(
    exc: Exception, mutation: bool, expected: type[Exception]
) -> None:
    error = translate_error(exc, url=URL, key="k", op="PutObject", mutation=mutation)
    assert type(error) is expected
    assert URL in str(error)


# Against moto's server --------------------------------------------------------------------------


async def test_check_passes_for_a_good_bucket(s3_url: str) -> None:
    store = S3ObjectStore(s3_url)
    await store.check()
    # The conditional-create probe cleans up after itself.
    assert await collect(store, "") == []
    await store.close()


async def test_a_server_ignoring_if_none_match_is_refused_naming_it(
    s3rver_server: str, s3rver_url: str
) -> None:
    """s3rver overwrites on a second create-only PUT: fencing would be off, so opening the
    store fails (Unimplemented is an InvalidArgument: retrying cannot help)."""
    s3rver = S3ObjectStore(s3rver_url, **STORE_KEYS)
    stacked = RetryingObjectStore(S3ObjectStore(s3rver_url, **STORE_KEYS))
    for store in (s3rver, stacked):
        with pytest.raises(Unimplemented) as info:
            await store.check()
        message = str(info.value)
        assert s3rver_server in message and "If-None-Match" in message, message
        assert await collect(store, "") == []  # the probe object was deleted
        await store.close()


@pytest.fixture
def reader_keys(s3_server: str, s3_url: str) -> dict[str, str]:
    """Keys of a moto IAM user that may only read the bucket of ``s3_url``."""
    import boto3

    iam = boto3.client(
        "iam",
        endpoint_url=s3_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    name = f"reader-{time.monotonic_ns()}"
    iam.create_user(UserName=name)
    bucket = parse_s3_url(s3_url).bucket
    iam.put_user_policy(
        UserName=name,
        PolicyName="read",
        PolicyDocument=json.dumps(
            {
                "Version": "2012-10-17",
                "Statement": [
                    {
                        "Effect": "Allow",
                        # AWS authorizes HeadBucket as s3:ListBucket; moto names it HeadBucket.
                        "Action": ["s3:GetObject", "s3:ListBucket", "s3:HeadBucket"],
                        "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
                    }
                ],
            }
        ),
    )
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return {"access_key_id": key["AccessKeyId"], "secret_access_key": key["SecretAccessKey"]}


async def test_read_only_credentials_skip_the_probe(
    s3_url: str, reader_keys: dict[str, str], moto_auth: None
) -> None:
    """A batch job whose role may only read never creates objects, so it does not need
    create-only PUTs: its check passes without them (moto enforcing IAM here)."""
    store = S3ObjectStore(s3_url, **reader_keys)
    await store.check()
    with pytest.raises(PermissionDenied):
        await store.create("k", b"v")
    await store.close()


async def test_missing_bucket_is_not_found_naming_the_url(s3_server: str, s3_url: str) -> None:
    url = f"s3://no-such-bucket-here/db?endpoint_url={s3_server}&region=us-east-1"
    store = S3ObjectStore(url)
    with pytest.raises(NotFound) as info:
        await store.check()
    assert url in str(info.value)
    for call in (store.get("k"), store.create("k", b"x"), collect(store, "")):
        with pytest.raises(NotFound) as info:
            await call
        assert url in str(info.value)
    await store.close()


@pytest.fixture
def moto_auth(s3_server: str) -> Iterator[None]:
    """Make moto's server check credentials (it accepts any by default) for one test."""

    def set_free_requests(count: str) -> None:
        request = urllib.request.Request(
            f"{s3_server}/moto-api/reset-auth",
            data=count.encode(),
            method="POST",
            headers={"Content-Type": "text/plain"},  # Not a form: moto reads the raw body.
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            assert response.status == 200

    set_free_requests("0")
    try:
        yield
    finally:
        set_free_requests("inf")


async def test_bad_credentials_are_permission_denied(s3_url: str, moto_auth: None) -> None:
    store = S3ObjectStore(s3_url, access_key_id="AKIANOTAREALKEY00000", secret_access_key="bad")
    with pytest.raises(PermissionDenied) as info:
        await store.check()
    assert s3_url in str(info.value) and "credentials" in str(info.value)
    with pytest.raises(PermissionDenied):
        await store.get("k")
    await store.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_unreachable_endpoint_is_unavailable_and_fast(s3_url: str) -> None:
    url = f"s3://bucket/db?endpoint_url=http://127.0.0.1:{closed_port()}&connect_timeout=2"
    store = S3ObjectStore(url)
    started = time.monotonic()
    with pytest.raises(Unavailable) as info:
        await store.check()
    assert url in str(info.value)
    # A refused connection was never sent: not Indeterminate even for a PUT.
    with pytest.raises(Unavailable) as put_info:
        await store.create("k", b"x")
    assert not isinstance(put_info.value, Indeterminate)
    assert time.monotonic() - started < 30  # Deadline, not a timing assertion: no retries.
    await store.close()


async def test_prefixes_isolate_stores_in_one_bucket(s3_server: str, s3_bucket: str) -> None:
    query = f"?endpoint_url={s3_server}&region=us-east-1"
    one = S3ObjectStore(f"s3://{s3_bucket}/one{query}")
    two = S3ObjectStore(f"s3://{s3_bucket}/one-more/{query}")
    root = S3ObjectStore(f"s3://{s3_bucket}{query}")
    await one.create("k", b"1")
    await two.create("k", b"2")
    assert [i.key for i in await collect(one, "")] == ["k"]
    assert [i.key for i in await collect(two, "")] == ["k"]
    assert [i.key for i in await collect(root, "")] == ["one-more/k", "one/k"]
    assert await root.get("one/k") == b"1"
    for store in (one, two, root):
        await store.close()


async def test_one_client_is_reused_and_closed(s3_url: str) -> None:
    store = S3ObjectStore(s3_url)
    await store.create("k", b"v")
    client = store._client
    assert client is not None
    await store.get("k")
    await store.head("k")
    assert store._client is client
    await store.close()
    assert store._client is None
    await store.close()  # Idempotent.


async def test_open_store_s3_checks_through_the_stack(s3_url: str) -> None:
    store = open_store(s3_url, instrument=True)
    await store.check()
    await store.create("k", b"v")
    assert await store.get("k") == b"v"
    await store.close()


async def test_a_plain_http_endpoint_loads_no_certificates(
    s3_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every store opened on an http:// endpoint (a local S3 server) would otherwise load the
    CA bundle into a TLS context it never uses, on its first request."""
    import ssl

    loads: list[object] = []
    real = ssl.SSLContext.load_verify_locations

    def counting(self: ssl.SSLContext, *args: object, **kwargs: object) -> None:
        loads.append(args)
        real(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counting)
    store = S3ObjectStore(s3_url)
    try:
        await store.create("k", b"v")
        assert await store.get("k") == b"v"
    finally:
        await store.close()
    assert loads == []
