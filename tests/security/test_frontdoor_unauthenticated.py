"""The front door refuses an unauthenticated call before it reads the request.

A real front door (``tabletstore bigtable-api --tls-cert/--tls-key`` in front of a master and a
worker on loopback, so bearer tokens are required) and, meanwhile, a token holder's calls.
The attack: 8 concurrent calls without a token, each a 64 MiB MutateRow message. gRPC used to
receive each message whole (and decode it) before the token check's handler refused the call:
the issue measured 12 such calls taking a front door from 0.94 to 2.79 GB. Now the refusal
handler takes its request as a stream it never reads: every call is UNAUTHENTICATED, the front
door's resident memory grows by far less than one message, and the token holder's calls keep
answering.

Bounded: one round of 8 calls under a deadline; the watcher samples at most 600 times.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from tabletstore.cli.localstack import ProcessRecord
from tabletstore.coordination import open_coordinator
from tabletstore.coordination.tokens import TokenStore
from tabletstore.security import ca
from tests.security.request_support import ENV, processes, rss_mib, start_cluster

__all__ = ["processes"]  # the fixture, used by name

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CALLS = 8
MESSAGE = 64 * 1024 * 1024
MUTATE_ROW = "/google.bigtable.v2.Bigtable/MutateRow"
LIST_TABLES = "/google.bigtable.admin.v2.BigtableTableAdmin/ListTables"


@pytest.fixture
def front_door(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """The certificates' directory and a function for starting the front door process."""
    certs = tmp_path / "certs"
    ca.init_ca(certs)
    ca.issue(certs, "frontdoor", role="function")
    started: list[subprocess.Popen[str]] = []
    yield started, certs  # type: ignore[misc]
    for proc in started:  # by our own Popen handle only
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _start_front_door(
    started: list[subprocess.Popen[str]], certs: Path, etcd_url: str
) -> tuple[subprocess.Popen[str], int]:
    argv = [
        sys.executable,
        "-m",
        "tabletstore.cli.main",
        "bigtable-api",
        "--url",
        etcd_url,
        "--port",
        "0",
        "--tls-cert",
        str(certs / "frontdoor.pem"),
        "--tls-key",
        str(certs / "frontdoor.key"),
    ]
    env = {**os.environ, **ENV}
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, env=env)
    started.append(proc)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()  # the process prints its port once it serves
    assert line.startswith("bigtable-api listening with TLS on 127.0.0.1:"), line
    return proc, int(line.rsplit(":", 1)[1])


def mutate_row_of_size(size: int) -> bytes:
    """A well-formed MutateRowRequest of about ``size`` bytes (a huge table_name)."""
    n = size - 6
    varint = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        varint.append(byte | (0x80 if n else 0))
        if not n:
            break
    return b"\x0a" + bytes(varint) + b"t" * (size - 6)


def _watch_rss(pid: int, stop: threading.Event, peak: list[float]) -> None:
    for _ in range(600):
        peak[0] = max(peak[0], rss_mib(pid))
        if stop.wait(0.1):
            return


async def test_an_unauthenticated_call_is_refused_before_its_message_is_read(
    etcd_url: str,
    s3_url: str,
    tmp_path: Path,
    processes: list[ProcessRecord],
    front_door: tuple[list[subprocess.Popen[str]], Path],
) -> None:
    await start_cluster(tmp_path, etcd_url, s3_url, processes)
    started, certs = front_door
    proc, port = await asyncio.to_thread(_start_front_door, started, certs, etcd_url)
    coordinator = open_coordinator(etcd_url)
    token = await TokenStore(coordinator).create("t1")
    await coordinator.close()
    channel = grpc.aio.secure_channel(
        f"127.0.0.1:{port}",
        grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes()),
        options=[("grpc.max_send_message_length", 2 * MESSAGE)],
    )
    mutate = channel.unary_unary(MUTATE_ROW)  # raw bytes: never encoded or decoded here
    list_tables = channel.unary_unary(LIST_TABLES)
    authorized = (("authorization", f"Bearer {token}"),)

    async def probe() -> float:
        """One token holder's call: its latency (answered with any status)."""
        start = time.monotonic()
        try:
            await list_tables(
                b"\n\x1cprojects/p/instances/instance", metadata=authorized, timeout=30
            )
        except grpc.aio.AioRpcError as exc:
            assert exc.code() != grpc.StatusCode.UNAUTHENTICATED, exc
        return time.monotonic() - start

    try:
        idle_latency = max([await probe() for _ in range(5)])
        idle_rss = rss_mib(proc.pid)
        stop, peak = threading.Event(), [idle_rss]
        watcher = threading.Thread(target=_watch_rss, args=(proc.pid, stop, peak))
        watcher.start()
        payload = mutate_row_of_size(MESSAGE)
        try:
            async with asyncio.timeout(120):
                attack = [asyncio.ensure_future(mutate(payload, timeout=100)) for _ in range(CALLS)]
                latencies = [await probe() for _ in range(5)]
                outcomes = await asyncio.gather(*attack, return_exceptions=True)
        finally:
            stop.set()
            await asyncio.to_thread(watcher.join, 30)
        codes = [o.code() if isinstance(o, grpc.aio.AioRpcError) else o for o in outcomes]
        assert codes == [grpc.StatusCode.UNAUTHENTICATED] * CALLS, codes
        growth = peak[0] - idle_rss
        print(  # the figures, for a run with -s
            f"front door RSS idle {idle_rss:.0f} MiB, peak {peak[0]:.0f} MiB; token holder's "
            f"call {idle_latency * 1000:.0f} ms idle, {max(latencies) * 1000:.0f} ms at worst "
            f"during the attack"
        )
        # Before: every message buffered whole (8 x 64 MiB and their decoding: +1 GiB). Now what
        # HTTP/2 flow control lets each call send before its answer (the window, which gRPC's
        # bandwidth probing grows to a few MiB on a busy machine), far under one message each.
        assert growth < 3 * MESSAGE / 2**20, (growth, idle_rss, peak[0])
        assert proc.poll() is None, "the front door exited"
        assert max(latencies) < 30, (latencies, idle_latency)
    finally:
        await channel.close()
