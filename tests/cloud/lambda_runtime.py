"""A local stand-in for AWS Lambda's two HTTP interfaces, on loopback.

* :class:`RuntimeApi` -- the Runtime API one function's container polls (``awslambdaric``
  does, at ``AWS_LAMBDA_RUNTIME_API``): ``GET /2018-06-01/runtime/invocation/next`` answers
  the next event with its ``Lambda-Runtime-*`` headers; ``POST .../invocation/<id>/response``
  and ``.../invocation/<id>/error`` answer it; ``POST /2018-06-01/runtime/init/error`` reports
  a runtime that could not start (every invocation then fails with that error, as Lambda's
  ``Runtime.InitError``).
* :class:`InvokeApi` -- Lambda's ``Invoke`` (``POST /2015-03-31/functions/<name>/invocations``,
  what boto3's ``lambda.invoke`` sends when ``AWS_ENDPOINT_URL_LAMBDA`` points here): it hands
  the payload to that function's Runtime API and answers with the function's result, or with
  ``X-Amz-Function-Error: Unhandled`` and the error document, as Lambda does.

One invocation at a time per function container (Lambda's model: a sandbox handles one event,
``next`` is called again when it has answered). Every invocation is recorded
(:attr:`RuntimeApi.invocations`) for the rehearsal's report.
"""

from __future__ import annotations

import itertools
import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

__all__ = ["FunctionError", "InitError", "Invocation", "InvokeApi", "RuntimeApi"]

_PREFIX = "/2018-06-01/runtime"


class FunctionError(Exception):
    """The function answered an invocation with an error document (errorType, errorMessage)."""

    def __init__(self, document: dict[str, Any]) -> None:
        super().__init__(f"{document.get('errorType')}: {document.get('errorMessage')}")
        self.document = document


class InitError(FunctionError):
    """The runtime reported that it could not start (``/runtime/init/error``)."""


@dataclass
class Invocation:
    """One event handed to the function, and how it was answered."""

    request_id: str
    payload: bytes
    deadline_ms: int
    done: threading.Event = field(default_factory=threading.Event)
    result: bytes | None = None
    error: dict[str, Any] | None = None
    taken: float | None = None
    answered: float | None = None


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    owner: RuntimeApi | InvokeApi

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the rehearsal reports what it needs."""

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def send(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        self.owner.handle(self, "GET", urlsplit(self.path).path, b"")

    def do_POST(self) -> None:
        body = self._body()
        self.owner.handle(self, "POST", urlsplit(self.path).path, body)


def _serve(owner: RuntimeApi | InvokeApi, host: str, port: int) -> _Server:
    handler = type("Handler", (_Handler,), {"owner": owner})
    server = _Server((host, port), handler)
    threading.Thread(target=server.serve_forever, daemon=True, name=type(owner).__name__).start()
    return server


def _json(document: Any) -> bytes:
    return json.dumps(document).encode()


class RuntimeApi:
    """The Runtime API of one function (module docstring). ``address`` is ``host:port``, the
    value of ``AWS_LAMBDA_RUNTIME_API``."""

    def __init__(
        self, function_name: str, *, region: str = "us-east-1", host: str = "127.0.0.1"
    ) -> None:
        self.function_name = function_name
        self.arn = f"arn:aws:lambda:{region}:123456789012:function:{function_name}"
        self.invocations: list[Invocation] = []
        self.init_error: dict[str, Any] | None = None
        self.polls = 0
        self._pending: queue.Queue[Invocation] = queue.Queue()
        self._by_id: dict[str, Invocation] = {}
        self._lock = threading.Lock()
        self._server = _serve(self, host, 0)
        self.address = f"{host}:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def invoke(self, payload: bytes, *, timeout: float) -> bytes:
        """Hand ``payload`` to the function and wait for its answer: the result's bytes, or
        FunctionError (InitError if the runtime could not start); TimeoutError after
        ``timeout`` seconds (Lambda's function timeout)."""
        if self.init_error is not None:
            raise InitError(self.init_error)
        invocation = Invocation(
            request_id=str(uuid.uuid4()),
            payload=payload,
            deadline_ms=int((time.time() + timeout) * 1000),
        )
        with self._lock:
            self.invocations.append(invocation)
            self._by_id[invocation.request_id] = invocation
        self._pending.put(invocation)
        end = time.monotonic() + timeout
        while not invocation.done.wait(0.1):
            if self.init_error is not None:
                raise InitError(self.init_error)
            if time.monotonic() > end:
                raise TimeoutError(
                    f"{self.function_name}: no answer to {invocation.request_id} in {timeout}s"
                    + ("" if invocation.taken else " (the runtime never asked for it)")
                )
        if invocation.error is not None:
            raise FunctionError(invocation.error)
        assert invocation.result is not None
        return invocation.result

    def handle(self, request: _Handler, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path == f"{_PREFIX}/invocation/next":
            self.polls += 1
            invocation = self._pending.get()  # long poll, as Lambda's: until there is an event
            invocation.taken = time.monotonic()
            request.send(
                200,
                invocation.payload,
                {
                    "Lambda-Runtime-Aws-Request-Id": invocation.request_id,
                    "Lambda-Runtime-Deadline-Ms": str(invocation.deadline_ms),
                    "Lambda-Runtime-Invoked-Function-Arn": self.arn,
                    "Lambda-Runtime-Trace-Id": f"Root=1-{uuid.uuid4().hex[:8]}-{uuid.uuid4().hex[:24]}",
                },
            )
            return
        if method == "POST" and path == f"{_PREFIX}/init/error":
            self.init_error = _error_document(body, request)
            request.send(202, _json({"status": "OK"}))
            return
        parts = path[len(_PREFIX) :].strip("/").split("/") if path.startswith(_PREFIX) else []
        if method == "POST" and len(parts) == 3 and parts[0] == "invocation":
            with self._lock:
                invocation = self._by_id.get(parts[1])
            if invocation is None or invocation.done.is_set():
                request.send(400, _json({"errorType": "InvalidRequestID", "errorMessage": path}))
                return
            if parts[2] == "response":
                invocation.result = body
            elif parts[2] == "error":
                invocation.error = _error_document(body, request)
            else:
                request.send(404, _json({"errorType": "NotFound", "errorMessage": path}))
                return
            invocation.answered = time.monotonic()
            invocation.done.set()
            request.send(202, _json({"status": "OK"}))
            return
        request.send(404, _json({"errorType": "NotFound", "errorMessage": f"{method} {path}"}))


def _error_document(body: bytes, request: _Handler) -> dict[str, Any]:
    try:
        document = json.loads(body) if body else {}
    except ValueError:
        document = {"errorMessage": body.decode(errors="replace")}
    if not isinstance(document, dict):
        document = {"errorMessage": str(document)}
    document.setdefault(
        "errorType", request.headers.get("Lambda-Runtime-Function-Error-Type") or "Unhandled"
    )
    return document


class InvokeApi:
    """Lambda's Invoke API in front of the functions' Runtime APIs (module docstring).
    ``endpoint`` is the URL for ``AWS_ENDPOINT_URL_LAMBDA``."""

    _ids = itertools.count()

    def __init__(
        self, functions: dict[str, RuntimeApi], *, timeout: float = 300, host: str = "127.0.0.1"
    ) -> None:
        self.functions = functions
        self.timeout = timeout
        self._server = _serve(self, host, 0)
        self.endpoint = f"http://{host}:{self._server.server_address[1]}"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def handle(self, request: _Handler, method: str, path: str, body: bytes) -> None:
        parts = path.strip("/").split("/")
        if method != "POST" or len(parts) != 4 or parts[:2] != ["2015-03-31", "functions"]:
            request.send(404, _json({"Type": "User", "message": f"no route {method} {path}"}))
            return
        name = unquote(parts[2]).rsplit(":function:", 1)[-1].split(":", 1)[0]
        function = self.functions.get(name)
        if function is None:
            request.send(
                404,
                _json({"Type": "User", "message": f"Function not found: {name}"}),
                {"x-amzn-ErrorType": "ResourceNotFoundException"},
            )
            return
        kind = request.headers.get("X-Amz-Invocation-Type") or "RequestResponse"
        if kind == "Event":
            threading.Thread(
                target=_swallow, args=(function, body, self.timeout), daemon=True
            ).start()
            request.send(202, b"")
            return
        try:
            result = function.invoke(body or b"{}", timeout=self.timeout)
        except FunctionError as exc:
            kind = "Unhandled"
            request.send(200, _json(exc.document), {"X-Amz-Function-Error": kind})
            return
        except TimeoutError as exc:
            document = {"errorType": "Sandbox.Timedout", "errorMessage": str(exc)}
            request.send(200, _json(document), {"X-Amz-Function-Error": "Unhandled"})
            return
        request.send(200, result, {"X-Amz-Executed-Version": "$LATEST"})


def _swallow(function: RuntimeApi, body: bytes, timeout: float) -> None:
    """An asynchronous (``Event``) invocation: its outcome is recorded, never returned."""
    try:
        function.invoke(body or b"{}", timeout=timeout)
    except (FunctionError, TimeoutError):
        pass  # recorded in function.invocations
