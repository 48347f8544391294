"""moto's S3 server for the local stack: its conditional writes made atomic, and with
``--credentials`` every request's signature checked (``local-stack up --tls``).

Conditional writes. moto answers a PUT with ``If-None-Match: *`` (or ``If-Match``) by
checking the key, then writing it, in the request's own thread: two concurrent creates of one
key can both succeed, where S3 decides each conditional write atomically. tabletstore's
fencing and claims rest on create-only PUTs, so :func:`serialize_conditional_writes` runs
moto's object PUT and POST (CompleteMultipartUpload) handlers one at a time; every moto server
the project starts goes through it (this launcher; the test suite's in-process server).
Without ``--credentials`` the launcher is moto's own server (``moto.server``, its control API
included) with that one change.

With ``--credentials``:

moto's server answers any request, whatever credentials it is signed with or none, unless its
IAM authentication is on; and its control API (``/moto-api/``: dump every object, reset the
data, turn authentication back off) answers anyone. This launcher runs the same server with:

- authentication on from the first request: every S3 request must carry a valid signature
  (SigV4) of an access key moto knows and be allowed by that key's user's policy; made-up
  credentials get ``InvalidAccessKeyId``, a wrong secret ``SignatureDoesNotMatch``;
- one IAM user, ``tabletstore``, allowed ``s3:*`` on the stack's bucket and nothing else,
  whose access key is made at start and written to ``--credentials`` (mode 0600) before the
  port opens, as two lines ``AWS_ACCESS_KEY_ID=...`` and ``AWS_SECRET_ACCESS_KEY=...``;
- the bucket made in-process (no unsigned request is ever served);
- the control API and moto's other non-S3 services refused: 403 for any ``/moto-api`` path;
- each request's URL handed to moto as the client sent it (:func:`_backend_app_as_sent`), so
  that moto checks a signature over the path the client signed, whatever characters a key has.

Usage: ``python -m tabletstore.cli.local_s3 --host 127.0.0.1 --port N [--bucket B
--credentials FILE]`` (``cli/localstack.py`` starts it).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

__all__ = ["USER", "main", "read_credentials", "serialize_conditional_writes"]

#: The IAM user the stack's processes sign as.
USER = "tabletstore"
_REGION = "us-east-1"


#: moto's S3 handlers that check a write's condition and then write.
_CONDITIONAL_HANDLERS = ("put_object", "_key_response_post")
_conditional_writes = threading.Lock()


def serialize_conditional_writes() -> None:
    """Make moto's S3 server decide conditional writes atomically, as S3 does (module
    docstring). Idempotent; patches this process's moto."""
    from moto.s3.responses import S3Response

    for name in _CONDITIONAL_HANDLERS:
        handler = getattr(S3Response, name)
        if getattr(handler, "serialized", False):
            continue

        @functools.wraps(handler)
        def serialized(self: Any, *args: Any, __handler: Any = handler, **kwargs: Any) -> Any:
            with _conditional_writes:
                return __handler(self, *args, **kwargs)

        serialized.serialized = True  # type: ignore[attr-defined]
        setattr(S3Response, name, serialized)


def read_credentials(path: Path) -> tuple[str, str]:
    """(access key id, secret) from a ``--credentials`` file."""
    values = dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return values["AWS_ACCESS_KEY_ID"], values["AWS_SECRET_ACCESS_KEY"]


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT


def _bootstrap(bucket: str, credentials: Path) -> None:
    """The user, its policy, its key (written to ``credentials``) and the bucket, made in
    moto's models directly."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.iam.models import iam_backends
    from moto.s3.models import s3_backends

    iam = iam_backends[DEFAULT_ACCOUNT_ID]["global"]
    iam.create_user(_REGION, USER)
    policy = {
        "Version": "2012-10-17",
        "Statement": [
            {
                "Effect": "Allow",
                "Action": "s3:*",
                "Resource": [f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/*"],
            }
        ],
    }
    iam.put_user_policy(USER, "bucket", json.dumps(policy))
    key = iam.create_access_key(USER)
    s3_backends[DEFAULT_ACCOUNT_ID]["aws"].create_bucket(bucket, _REGION)
    _write_private(
        credentials,
        f"AWS_ACCESS_KEY_ID={key.access_key_id}\nAWS_SECRET_ACCESS_KEY={key.secret_access_key}\n",
    )


Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]


def _without_control_api(app: Wsgi) -> Wsgi:
    def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if str(environ.get("PATH_INFO", "")).startswith("/moto-api"):
            start_response("403 Forbidden", [("Content-Type", "text/plain")])
            return [b"the control API is off on this server\n"]
        return app(environ, start_response)

    return guarded


def _url_as_sent(environ: dict[str, Any], scheme: str, host: str) -> str | None:
    """The request's URL with its path and query exactly as the client encoded them, from the
    request line werkzeug's server keeps in ``RAW_URI`` (None if it is missing)."""
    raw = environ.get("RAW_URI")
    if not isinstance(raw, str) or not raw:
        return None
    if "://" in raw.split("?", 1)[0]:  # absolute-form request line
        parts = urlsplit(raw)
        path, query = parts.path, parts.query
    else:
        path, _, query = raw.partition("?")
    path = path if path.startswith("/") else f"/{path}"
    return f"{scheme}://{host}{path}" + (f"?{query}" if query else "")


def _backend_app_as_sent(create: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """moto's per-service Flask apps, each with a request class whose ``url`` is the URL as
    the client sent it.

    A SigV4 signature covers the path and query exactly as the client encoded them: botocore
    encodes every byte of a key but unreserved characters and ``/``, so ``tables/!metadata/x``
    goes out as ``tables/%21metadata/x``. moto checks the signature over the request's ``url``,
    which werkzeug rebuilds from the decoded path and turns into an IRI (``%21`` back to ``!``,
    and likewise ``$&'()*+,:;=@`` and non-ASCII letters): for such a key the two canonical
    requests differ and moto answers SignatureDoesNotMatch, where S3 and MinIO check the path
    as sent. moto takes key names from the request line already (``RAW_URI``, unquoted once),
    so handing it the same line as the URL changes which requests verify, not which objects
    they name. Flask's ``request_class`` is the documented place to change the request type.
    """
    from flask import Request

    class RequestAsSent(Request):
        @property
        def url(self) -> str:  # type: ignore[override]
            return _url_as_sent(self.environ, self.scheme, self.host) or super().url

    def created(service: Any) -> Any:
        app = create(service)
        app.request_class = RequestAsSent
        return app

    return created


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tabletstore.cli.local_s3")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bucket", help="with --credentials: the bucket made at start")
    parser.add_argument("--credentials", type=Path, help="check signatures (module docstring)")
    args = parser.parse_args(argv)
    if args.credentials is None:
        from moto.server import main as moto_server

        serialize_conditional_writes()
        moto_server(["-H", args.host, "-p", str(args.port)])
        return
    if args.bucket is None:
        parser.error("--credentials needs --bucket")
    # Read by moto's settings when it is imported: authentication from the first request.
    os.environ["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
    serialize_conditional_writes()
    from moto import settings
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
    from werkzeug.serving import run_simple

    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    _bootstrap(args.bucket, args.credentials)
    app = _without_control_api(
        DomainDispatcherApplication(_backend_app_as_sent(create_backend_app))
    )
    run_simple(args.host, args.port, app, threaded=True)


if __name__ == "__main__":
    main()
