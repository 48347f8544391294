"""A fault-injecting S3 proxy on loopback, in front of moto or SeaweedFS (chaos harness only).

Why a proxy rather than the in-process :class:`~tabletstore.testing.faulty_store.FaultyObjectStore`:
the faults must reach worker and master *processes*, whose stores are built from the cluster's
store URL by production code (``storage_s3.open_store``). A proxy needs no test hook in that
code, and its faults go through the real client stack - botocore's parsing of a 503
``SlowDown``, aiohttp's read timeout, the :class:`RetryingObjectStore`'s retries and its
resolution of an ambiguous create-only PUT - which an in-process wrapper above the S3 client
would skip. It injects the same three kinds the wrapper's rules model (``fail``, ``delay``,
``lose_ack``), as HTTP:

* ``slowdown``: answer ``503 SlowDown`` (S3's throttling error) without forwarding;
* ``timeout``: hold the request ``hold`` seconds (set it past the store URL's
  ``read_timeout``), then forward it - the client has given up, the upstream may apply it;
* ``put_error``: forward a PUT, then answer ``500 InternalError`` although it was applied (a
  write whose acknowledgement was lost).

Each request draws from one RNG seeded by ``--seed``, with the probabilities set through the
control API (``POST /__chaos__/faults`` with JSON ``{"slowdown": p, "timeout": p,
"put_error": p, "hold": s}``; ``GET /__chaos__/stats`` returns the requests seen and faults
injected per kind). S3 paths start with a bucket name, which cannot start with ``_``, so the
control path never shadows a real request.

With ``--keep-logs DIR`` the proxy also keeps a copy of every commit-log segment that the
S3 server accepted (a PUT under ``.../logs/`` answered 2xx, the ``put_error`` fault's included:
it was applied), as ``DIR/<worker>/<incarnation>/<segment>.log``. The double-serving check
attributes each acknowledged write to the worker whose log holds it; with garbage collection
deleting trimmed and recovered logs during a run, the copies are that evidence. Run it as
``python -m tabletstore.testing.chaos.s3proxy --upstream URL --port P --seed S [--keep-logs DIR]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
from collections import Counter
from pathlib import Path

import aiohttp
from aiohttp import web

__all__ = ["LOGS_MARK", "FaultRates", "main", "make_app"]

CONTROL = "/__chaos__/"
#: What a commit-log segment's request path holds before the segment's ``worker/incarnation/
#: segment.log`` (storage_s3.layout.LOGS under the store's prefix).
LOGS_MARK = "/logs/"
#: Request headers not forwarded (hop-by-hop, or recomputed by aiohttp).
_DROP_REQUEST = {"host", "content-length", "transfer-encoding", "connection", "expect"}
_DROP_RESPONSE = {"content-length", "transfer-encoding", "connection", "content-encoding"}

_ERROR = (
    '<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code>'
    "<Message>{message}</Message><RequestId>chaos</RequestId></Error>"
)


class FaultRates:
    """Probabilities per request of each fault, and the timeout fault's hold in seconds."""

    def __init__(self) -> None:
        self.slowdown = 0.0
        self.timeout = 0.0
        self.put_error = 0.0
        self.hold = 8.0

    def update(self, raw: dict[str, float]) -> None:
        for name in ("slowdown", "timeout", "put_error"):
            value = float(raw.get(name, 0.0))
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
            setattr(self, name, value)
        hold = float(raw.get("hold", self.hold))
        if hold < 0:
            raise ValueError(f"hold must be >= 0 seconds, got {hold}")
        self.hold = hold


def _error(status: int, code: str, message: str) -> web.Response:
    body = _ERROR.format(code=code, message=message)
    return web.Response(status=status, text=body, content_type="application/xml")


def _keep(keep_logs: Path, path: str, body: bytes) -> None:
    """A copy of an accepted segment PUT (see the module docstring), written whole or not at
    all; a fence (zero bytes) holds no writes and is not kept."""
    if not body or LOGS_MARK not in path or not path.endswith(".log"):
        return
    rel = path.split(LOGS_MARK, 1)[1]
    if ".." in rel.split("/"):
        return
    dest = keep_logs / rel
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    tmp.write_bytes(body)
    tmp.replace(dest)


def make_app(upstream: str, seed: int, keep_logs: Path | None = None) -> web.Application:
    rates = FaultRates()
    rng = random.Random(seed)
    stats: Counter[str] = Counter()
    session: list[aiohttp.ClientSession] = []

    async def forward(request: web.Request, body: bytes) -> web.Response:
        if not session:
            session.append(
                aiohttp.ClientSession(
                    auto_decompress=False, timeout=aiohttp.ClientTimeout(total=None)
                )
            )
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _DROP_REQUEST}
        async with session[0].request(
            request.method, upstream + request.path_qs, headers=headers, data=body
        ) as resp:
            data = await resp.read()
            if keep_logs is not None and request.method == "PUT" and resp.status < 300:
                _keep(keep_logs, request.path, body)
            headers = {k: v for k, v in resp.headers.items() if k.lower() not in _DROP_RESPONSE}
            if resp.headers.get("Content-Encoding"):
                headers["Content-Encoding"] = resp.headers["Content-Encoding"]
            if request.method == "HEAD":
                # A HEAD's object size is its Content-Length; the response has no body.
                if "Content-Length" in resp.headers:
                    headers["Content-Length"] = resp.headers["Content-Length"]
                out = web.Response(status=resp.status, headers=headers)
            else:
                out = web.Response(status=resp.status, body=data, headers=headers)
            return out

    async def handle(request: web.Request) -> web.StreamResponse:
        if request.path.startswith(CONTROL):
            return await control(request)
        body = await request.read()
        stats["requests"] += 1
        draw = rng.random()
        if draw < rates.slowdown:
            stats["slowdown"] += 1
            return _error(503, "SlowDown", "Please reduce your request rate (chaos).")
        draw -= rates.slowdown
        if draw < rates.timeout:
            stats["timeout"] += 1
            await asyncio.sleep(rates.hold)
            return await forward(request, body)
        draw -= rates.timeout
        if request.method == "PUT" and draw < rates.put_error:
            resp = await forward(request, body)
            if resp.status < 300:
                stats["put_error"] += 1
                return _error(500, "InternalError", "We encountered an internal error (chaos).")
            return resp
        return await forward(request, body)

    async def control(request: web.Request) -> web.Response:
        what = request.path[len(CONTROL) :]
        if what == "faults" and request.method == "POST":
            try:
                rates.update(json.loads(await request.read() or b"{}"))
            except (ValueError, TypeError) as exc:
                return web.Response(status=400, text=f"bad fault rates: {exc}")
            return web.json_response(vars(rates))
        if what == "stats":
            return web.json_response(dict(stats))
        return web.Response(status=404, text=f"unknown control request {request.path}")

    async def close(_: web.Application) -> None:
        for s in session:
            await s.close()

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", handle)
    app.on_cleanup.append(close)
    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--upstream", required=True, help="the S3 server's endpoint, http://host:port"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--keep-logs", type=Path, default=None, help="keep a copy of every accepted log segment"
    )
    args = parser.parse_args(argv)
    web.run_app(
        make_app(args.upstream.rstrip("/"), args.seed, args.keep_logs),
        host=args.host,
        port=args.port,
        print=None,
        access_log=None,
    )


if __name__ == "__main__":
    main()
