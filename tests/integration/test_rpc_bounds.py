"""A real worker process under connection and frame floods (resource caps, ``rpc/admission.py``).

A master and a worker (``python -m tabletstore.cli.main``) run against the session's etcd and
moto's S3, the worker with the smallest byte budget the CLI accepts (the frame limit, 81 MiB)
and a one-second stall timeout. Then, on 127.0.0.1:

- 40 connections each send half of a 16 MiB frame and stop (the attack once held 40 × 8 MiB): the worker's ``tabletstore_rpc_buffered_bytes`` never passes the budget, the frames
  finishing past it and one socket read per waiting connection, and every connection is closed
  by the stall timeout with an ERROR naming it;
- connections past the per-peer cap are refused with an ERROR naming the cap;
- a normal workload through the cluster client still works.

Bounded in count (40 connections, one thread each) and time (a deadline on every wait).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.cluster import ClusterClient
from tabletstore.data.model import SetCell
from tabletstore.limits import MAX_FRAME, MiB
from tabletstore.rpc import frames
from tabletstore.rpc.codec import decode_error
from tabletstore.rpc.connection import parse_address
from tabletstore.rpc.frames import Kind

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "PYTHONUNBUFFERED": "1",
}
FLOOD = 40
FRAME = 16 * MiB
BUDGET = MAX_FRAME  # the smallest --max-buffered-bytes accepted
PER_PEER = 60
#: What one socket read may bring in beyond a reservation (asyncio and uvloop read <= 256 KiB).
READ = 256 * 1024
T = TypeVar("T")


def eventually(check: Callable[[], T | None], what: str, deadline: float = 60.0) -> T:
    end = time.monotonic() + deadline
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        time.sleep(0.1)


def metric(url: str, name: str, **labels: str) -> float:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        text = response.read().decode()
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and set(labels.items()) <= set(sample.labels.items()):
                total += sample.value
    return total


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def handshake(address: str) -> socket.socket:
    host, port = parse_address(address)
    sock = socket.create_connection((host, port), timeout=30)
    sock.sendall(frames.encode_hello(MAX_FRAME))
    hello = b""
    while len(hello) < frames.HELLO_SIZE:
        chunk = sock.recv(frames.HELLO_SIZE - len(hello))
        assert chunk, "closed during the handshake"
        hello += chunk
    return sock


def closing_error(sock: socket.socket) -> str | None:
    """The message of the ERROR (request id 0) the server sent before closing, if any."""
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except OSError:
        pass
    if len(data) < frames.HEADER.size:
        return None
    length, kind, rid = frames.HEADER.unpack_from(data)
    if (kind, rid) != (Kind.ERROR, 0) or len(data) < 4 + length:
        return None
    return str(decode_error(data[frames.HEADER.size : 4 + length]))


def ping(sock: socket.socket) -> str | None:
    """None if the server answers a PING; the message of its ERROR if it refused the connection."""
    sock.sendall(frames.encode_frame(Kind.PING, 1, b"hi"))
    data = b""
    while len(data) < frames.HEADER.size or len(data) < 4 + frames.HEADER.unpack_from(data)[0]:
        chunk = sock.recv(65536)
        assert chunk, "closed without an answer"
        data += chunk
    length, kind, _ = frames.HEADER.unpack_from(data)
    if kind == Kind.PONG:
        return None
    assert kind == Kind.ERROR
    return str(decode_error(data[frames.HEADER.size : 4 + length]))


def half_frame(address: str, body: memoryview) -> str | None:
    """Send a frame header declaring FRAME bytes and half its body, then wait for the close."""
    sock = handshake(address)
    sock.settimeout(120)
    try:
        try:
            sock.sendall(frames.HEADER.pack(FRAME - 4, Kind.REQUEST, 1))
            sock.sendall(body)
        except OSError:
            pass  # closed while sending: read what it said
        return closing_error(sock)
    finally:
        sock.close()


@pytest.fixture
def processes() -> Iterator[list[ProcessRecord]]:
    started: list[ProcessRecord] = []
    yield started
    for record in reversed(started):  # by pid, and only while it still runs our command
        localstack.stop(record)


async def test_a_worker_holds_its_caps_under_floods_and_still_serves(
    etcd_url: str, s3_url: str, tmp_path: Path, processes: list[ProcessRecord]
) -> None:
    master = await asyncio.to_thread(
        localstack.start_master,
        tmp_path,
        etcd_url,
        s3_url,
        env=ENV,
        extra_args=("--lease-ttl", "3"),
    )
    processes.append(master)
    worker = await asyncio.to_thread(
        localstack.start_worker,
        tmp_path,
        etcd_url,
        0,
        env=ENV,
        metrics=True,
        extra_args=(
            "--lease-ttl",
            "3",
            "--stall-timeout",
            "1",
            "--max-buffered-bytes",
            str(BUDGET),
            "--max-connections-per-peer",
            str(PER_PEER),
        ),
    )
    processes.append(worker)
    url = worker.metrics_url
    assert url is not None
    address = worker.url
    rss_before = rss_mib(worker.pid)

    # The flood: 40 half frames, the budget's peak and the worker's RSS watched meanwhile.
    body = memoryview(bytes(FRAME // 2))
    peak_rss = [rss_before]
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak_rss[0] = max(peak_rss[0], rss_mib(worker.pid))
            done.wait(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(FLOOD) as pool:
            messages = await asyncio.to_thread(
                lambda: list(pool.map(lambda _: half_frame(address, body), range(FLOOD)))
            )
    finally:
        done.set()
        watcher.join()
    peak = metric(url, "tabletstore_rpc_buffered_bytes_peak")
    print(  # the figures, for the report (pytest -s)
        f"\nflood of {FLOOD} half {FRAME // MiB} MiB frames: buffered peak {peak / MiB:.1f} MiB "
        f"(budget {BUDGET / MiB:.0f} MiB, unbounded {FLOOD * FRAME / 2 / MiB:.0f} MiB); "
        f"worker RSS {rss_before:.0f} -> peak {peak_rss[0]:.0f} MiB"
    )
    # The budget, one frame finishing past it (the budget is one frame here), one read each.
    assert peak <= 2 * BUDGET + FLOOD * READ, peak
    said = [m for m in messages if m is not None]
    assert said and all("stall_timeout" in m for m in said), said
    eventually(
        lambda: metric(url, "tabletstore_rpc_connections_refused_total", reason="stalled") >= FLOOD,
        "every half-sent frame's connection is closed by the stall timeout",
    )
    eventually(lambda: metric(url, "tabletstore_rpc_buffered_bytes") == 0, "every byte is returned")

    # The per-peer cap: connections from 127.0.0.1 are refused past it, saying why.
    opened: list[socket.socket] = []
    refusal: str | None = None
    try:
        for _ in range(PER_PEER + 1):
            sock = handshake(address)
            refusal = ping(sock)  # an admitted connection answers PONG, a refused one ERROR
            if refusal is not None:
                sock.close()
                break
            opened.append(sock)
    finally:
        for sock in opened:
            sock.close()
    assert refusal is not None and f"limit per peer address is {PER_PEER}" in refusal
    assert metric(url, "tabletstore_rpc_connections_refused_total", reason="peer") >= 1
    eventually(
        lambda: metric(url, "tabletstore_rpc_connections_open") < PER_PEER,
        "the test's connections are released",
    )

    # A normal workload still works.
    client = await ClusterClient.open(etcd_url)
    try:
        table = await client.create_table("bounds", ["f"])
        rows = {b"r%03d" % i: b"v" * 1000 for i in range(100)}
        for key, val in rows.items():
            await table.mutate_row(key, [SetCell("f", b"q", val)])
        got = {row.key: row.cells[0].value async for row in table.read_rows()}
        assert got == rows
    finally:
        await client.close()
