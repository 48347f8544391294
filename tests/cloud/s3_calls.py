"""The S3 calls a role's processes make, recorded, and the IAM request each one is.

:class:`S3Recorder` is a reverse proxy on loopback in front of the rehearsal's S3 server: each
IAM role of the plan (the ECS task role, each function's role) gets its own, as its
containers' S3 endpoint, so every request its processes send is recorded as a :class:`Call`
(method, bucket, key, query; the keys of a multi-object delete) and passed on unchanged.

:func:`iam_requests` turns a call into what IAM authorizes (S3's documented mapping): the
action, the resource ARN and the ``s3:prefix`` of a listing (HeadBucket is ``s3:ListBucket``
with no prefix; a multi-object delete is one ``s3:DeleteObject`` per key).
"""

from __future__ import annotations

import http.client
import re
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

__all__ = ["Call", "IamRequest", "S3Recorder", "iam_requests"]

_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "upgrade"}
_KEY = re.compile(rb"<Key>(.*?)</Key>", re.S)


@dataclass(frozen=True)
class Call:
    method: str
    bucket: str
    key: str | None
    query: tuple[tuple[str, str], ...]
    #: The keys of a multi-object delete (POST ?delete).
    keys: tuple[str, ...] = ()


@dataclass(frozen=True)
class IamRequest:
    action: str
    resource: str
    #: ``s3:prefix`` of a listing (None: the request carries none).
    prefix: str | None = None

    def __str__(self) -> str:
        where = "" if self.prefix is None else f" prefix={self.prefix!r}"
        return f"{self.action} {self.resource}{where}"


def parse(method: str, path: str, body: bytes) -> Call:
    parts = urlsplit(path)
    bucket, _, key = unquote(parts.path).lstrip("/").partition("/")
    query = tuple(
        sorted((k, v[0]) for k, v in parse_qs(parts.query, keep_blank_values=True).items())
    )
    keys = ()
    if method == "POST" and not key and "delete" in dict(query):
        keys = tuple(k.decode() for k in _KEY.findall(body))
    return Call(method, bucket, key or None, query, keys)


def iam_requests(call: Call) -> list[IamRequest]:
    """What IAM authorizes for ``call`` (module docstring)."""
    bucket_arn = f"arn:aws:s3:::{call.bucket}"
    query = dict(call.query)
    if call.key is None:
        if call.method == "HEAD":
            return [IamRequest("s3:ListBucket", bucket_arn)]
        if call.method == "GET" and "location" in query:
            return [IamRequest("s3:GetBucketLocation", bucket_arn)]
        if call.method == "GET":
            return [IamRequest("s3:ListBucket", bucket_arn, query.get("prefix", ""))]
        if call.method == "PUT" and not query:
            return [IamRequest("s3:CreateBucket", bucket_arn)]
        if call.method == "POST" and "delete" in query:
            return [IamRequest("s3:DeleteObject", f"{bucket_arn}/{k}") for k in call.keys]
        raise ValueError(f"no IAM mapping for bucket call {call}")
    object_arn = f"{bucket_arn}/{call.key}"
    if call.method in ("GET", "HEAD"):
        return [IamRequest("s3:GetObject", object_arn)]
    if call.method in ("PUT", "POST"):
        return [IamRequest("s3:PutObject", object_arn)]
    if call.method == "DELETE":
        return [IamRequest("s3:DeleteObject", object_arn)]
    raise ValueError(f"no IAM mapping for object call {call}")


class _Server(ThreadingHTTPServer):
    daemon_threads = True


class S3Recorder:
    """A recording reverse proxy to ``upstream`` (``http://host:port``); ``endpoint`` is its
    own URL."""

    def __init__(self, upstream: str, *, host: str = "127.0.0.1") -> None:
        target = urlsplit(upstream)
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                """Quiet."""

            def _forward(self) -> None:
                body = self._read_body()
                call = parse(self.command, self.path, body)
                with recorder._lock:
                    recorder.calls.append(call)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
                headers["Content-Length"] = str(len(body))
                upstream_conn = http.client.HTTPConnection(
                    target.hostname, target.port, timeout=120
                )
                try:
                    upstream_conn.request(self.command, self.path, body=body, headers=headers)
                    response = upstream_conn.getresponse()
                    data = response.read()
                    self.send_response_only(response.status, response.reason)
                    for key, value in response.getheaders():
                        if key.lower() not in _HOP and key.lower() != "content-length":
                            self.send_header(key, value)
                    length = response.getheader("Content-Length")
                    head = self.command == "HEAD"
                    self.send_header(
                        "Content-Length", length if head and length else str(len(data))
                    )
                    self.end_headers()
                    if not head:
                        self.wfile.write(data)
                finally:
                    upstream_conn.close()

            def _read_body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    chunks = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if size == 0:
                            self.rfile.readline()
                            return b"".join(chunks)
                        chunks.append(self.rfile.read(size))
                        self.rfile.readline()
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = _Server((host, 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        self.endpoint = f"http://{host}:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
