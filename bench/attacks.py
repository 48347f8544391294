"""The attacks on a secured cluster, rerun: each is refused or bounded, and what it costs other
clients (their latency) and the servers (their resident memory), against an idle run.

    python -m bench.attacks [--quick] [--rounds 3] [--window 6] [--only 2,4] [--json FILE]
        [--docs docs/operations/security.md] [--dir DIR] [--front-door-processes N]

Starts ``local-stack up --tls`` (etcd with client certificates and users, the signature-checking
S3 server, a master and one worker with a 20 s lease; ``cli/localstack.py``) and a front door in front of it
(``tabletstore bigtable-api`` with TLS and bearer tokens, its certificate of the delegating role
``function``), all real processes on loopback. A legitimate client, in a process of its own,
writes and reads one row after another through the worker (its certificate) and through the
front door (its token), and the benchmark samples the server processes' RSS meanwhile. The
idle phase is ``--rounds`` windows of ``--window`` seconds; then each attack runs
``--rounds`` times, each an idle window and then a window under the attack. A round's latency
ratio is a path's p99 under the attack over its p99 in the idle window just before (a shared
machine's load drifts over minutes), its memory ratio a process's peak RSS under the attack
over its RSS when the attack began (memory a process took is not always given back, so an
earlier attack would weigh on every later row; the RSS left after all of them is printed
too); an attack's figures are the medians over its rounds.

The attacks, each at a scale a 2-core machine takes in seconds (tests/security/ has each one's
test):

1. bulk load from another table's objects, a foreign endpoint and ``file://``;
2. TLS connections without a certificate holding a maximal frame header (4 source addresses);
3. authenticated connections announcing a maximal frame and trickling it;
4. concurrent unauthenticated 64 MiB calls at the front door;
5. a read whose filter holds 500 heavy regexes (through the worker and the front door);
8. unfinished request lines holding the status endpoint's places (4 source addresses);
and a flood of small unauthenticated calls at the front door (16 callers on each of 4
connections). A control row runs no attack:
its ratios are what the machine's own noise gives.

The table: the attack, its outcome (``refused``: every attack request was answered with a
refusal; ``bounded``: the server took it and closed or capped it), the worst path's latency
ratio and the worst process's memory ratio, the verdict (both ratios at most 1.5), and beside
it the worst process's ratio of CPU used (under the attack over the idle window before). The
attacks run in the benchmark's own process at niceness 10, every thread of it (an attacker's
CPU is its own machine's; on one machine its work would otherwise count against the servers),
the servers and the legitimate client at normal priority. Latency on a shared machine is noisy: the load
average is printed with the figures. A legitimate call that fails makes the verdict "over";
a server process that exits stops the run, naming it. ``--quick`` runs one short round of each
(a smoke test). ``--front-door-processes N`` runs the front door as N processes sharing its
port (``bigtable-api --processes N``); each is measured as a process of its own
(``front door 0`` ...). ``--only -`` runs the flood row alone.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from bench import replace_between, require_extra
from tests.security.request_support import rss_mib
from tests.security.test_filter_cost import heavy_pattern, regex_flood
from tests.security.test_frontdoor_unauthenticated import mutate_row_of_size

PROJECT, PLAIN = "bench", "shared"
FD_TABLE = f"projects/{PROJECT}/instances/{PLAIN}/tables/fd-probe"
WORKER_TABLE = "probe"
VALUE = b"v" * 100
SOURCES = ("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")
LIMIT = 1.5
#: The worker's lease: longer than the default, as a machine shared with other work stalls a
#: process for seconds now and then, and a worker that loses its lease ends the run.
WORKER_ARGS = ("--lease-ttl", "20")
#: The attacking process's niceness (module docstring).
ATTACKER_NICE = 10
DATA = "/google.bigtable.v2.Bigtable"
#: grpc-status of a call refused for want of credentials (UNAUTHENTICATED).
UNAUTHENTICATED = "16"


def lower_priority(nice: int) -> None:
    """Set every thread of this process to niceness ``nice``. Linux keeps a niceness per
    thread, and ``os.nice`` changes only the caller's: gRPC's threads (started by the set-up's
    channel) would otherwise stay at normal priority. Threads started later inherit it. (Not
    SCHED_IDLE: on a machine busy with other work an idle-class attacker never runs.)"""
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(ProcessLookupError):  # a thread that has ended since
            os.setpriority(os.PRIO_PROCESS, int(task.name), nice)


#: The figures' paths: (where, operation).
PATHS = (("worker", "write"), ("worker", "read"), ("front door", "write"), ("front door", "read"))


# -- the legitimate client (a process of its own) ----------------------------------------------
@dataclass(frozen=True)
class Target:
    """How the legitimate client reaches the cluster and the front door."""

    cluster_url: str
    ca: str
    cert: str
    key: str
    front_door: str
    token: str
    ca_pem: bytes


def _probe_main(target: Target, pipe: Connection) -> None:
    """The legitimate client: on each ``seconds`` it receives, it writes and reads through both
    paths for that long (the four paths side by side, each one call after another) and answers
    with the latencies (seconds, a failure counted as its timeout) by path."""
    asyncio.run(_probe_serve(target, pipe))


async def _probe_serve(target: Target, pipe: Connection) -> None:
    import grpc
    from google.cloud.bigtable_v2.types import bigtable as bt
    from google.cloud.bigtable_v2.types import data

    from tabletstore.client.cluster import ClusterClient
    from tabletstore.data.model import SetCell
    from tabletstore.security import TlsConfig

    tls = TlsConfig(target.ca, target.cert, target.key)
    client = await ClusterClient.open(target.cluster_url, tls=tls)
    table = client.table(WORKER_TABLE)
    channel = grpc.aio.secure_channel(
        target.front_door, grpc.ssl_channel_credentials(target.ca_pem)
    )
    metadata = (("authorization", f"Bearer {target.token}"),)
    mutate = channel.unary_unary(f"{DATA}/MutateRow")
    read = channel.unary_stream(f"{DATA}/ReadRows")
    write_req = bt.MutateRowRequest.serialize(
        bt.MutateRowRequest(
            table_name=FD_TABLE,
            row_key=b"probe",
            mutations=[
                data.Mutation(
                    set_cell=data.Mutation.SetCell(
                        family_name="cf", column_qualifier=b"q", timestamp_micros=-1, value=VALUE
                    )
                )
            ],
        )
    )
    read_req = bt.ReadRowsRequest.serialize(
        bt.ReadRowsRequest(table_name=FD_TABLE, rows=data.RowSet(row_keys=[b"probe"]))
    )

    async def fd_read() -> None:
        async for _ in read(read_req, metadata=metadata, timeout=10):
            pass

    ops: list[tuple[tuple[str, str], Callable[[], Any]]] = [
        (PATHS[0], lambda: table.mutate_row(b"probe", [SetCell("cf", b"q", VALUE)])),
        (PATHS[1], lambda: table.read_row(b"probe")),
        (PATHS[2], lambda: mutate(write_req, metadata=metadata, timeout=10)),
        (PATHS[3], fd_read),
    ]
    pipe.send("ready")
    try:
        while True:
            seconds = await asyncio.to_thread(pipe.recv)
            if seconds is None:
                return
            pipe.send(await _window(ops, seconds))
    finally:
        await channel.close()
        await client.close()


async def _window(
    ops: list[tuple[tuple[str, str], Callable[[], Any]]], seconds: float
) -> tuple[dict[str, list[float]], int]:
    """Each path's latencies over ``seconds`` (the paths side by side, each one call after
    another, so a fast path gathers samples enough for its p99 beside a slow one), and the
    failed calls (each counted as its timeout)."""
    samples: dict[str, list[float]] = {f"{w} {o}": [] for w, o in PATHS}
    failures = 0
    end = time.monotonic() + seconds

    async def loop(path: str, run: Callable[[], Any]) -> None:
        nonlocal failures
        while time.monotonic() < end:
            start = time.perf_counter()
            try:
                async with asyncio.timeout(10):
                    await run()
                took = time.perf_counter() - start
            except Exception:  # a failed call costs the client its timeout
                failures += 1
                took = 10.0
            samples[path].append(took)

    await asyncio.gather(*(loop(f"{w} {o}", run) for (w, o), run in ops))
    return samples, failures


# -- the stack ---------------------------------------------------------------------------------
@dataclass
class Stack:
    directory: Path
    stack: Any  # localstack.Stack
    front_door: subprocess.Popen[str]
    fd_port: int
    token: str
    ca_pem: bytes = b""
    pids: dict[str, int] = field(default_factory=dict)

    def channel(self, *options: tuple[str, Any]) -> Any:
        """A gRPC channel to the front door over TLS (no token: calls add their own)."""
        import grpc

        credentials = grpc.ssl_channel_credentials(self.ca_pem)
        return grpc.aio.secure_channel(f"127.0.0.1:{self.fd_port}", credentials, options=options)

    @property
    def worker(self) -> Any:
        return next(r for r in self.stack.processes if r.role == "worker-0")

    @property
    def worker_port(self) -> int:
        return int(self.worker.url.rsplit(":", 1)[1])

    @property
    def ca(self) -> str:
        return str(Path(self.stack.tls_dir) / "ca.pem")


def _start(directory: Path, front_door_processes: int = 1) -> Stack:
    from bench.cluster_target import children_of
    from tabletstore.cli import localstack
    from tabletstore.security import ca

    stack = localstack.up(directory, workers=1, tls=True, worker_args=WORKER_ARGS)
    tls_dir = Path(stack.tls_dir)
    ca.issue(tls_dir, "frontdoor", role="function")
    env = {**os.environ, **localstack.environment(stack), "PYTHONUNBUFFERED": "1"}
    argv = [
        sys.executable, "-m", "tabletstore.cli.main",
        "--tls-ca", str(tls_dir / "ca.pem"),
        "--tls-cert", str(tls_dir / "frontdoor.pem"),
        "--tls-key", str(tls_dir / "frontdoor.key"),
        "bigtable-api", "--url", stack.cluster_url, "--port", "0",
        "--plain-instance", PLAIN,
        "--tls-cert", str(tls_dir / "frontdoor.pem"),
        "--tls-key", str(tls_dir / "frontdoor.key"),
        "--processes", str(front_door_processes),
    ]  # fmt: skip
    log = open(directory / "front-door.log", "w")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line.startswith("bigtable-api listening with TLS on"):
        proc.kill()
        raise RuntimeError(f"the front door did not start: {line!r} (see {log.name})")
    port = int(line.removeprefix("bigtable-api listening with TLS on").split()[0].rsplit(":")[1])
    token = asyncio.run(_token(stack.admin_url, "t1"))
    running = Stack(directory, stack, proc, port, token, (tls_dir / "ca.pem").read_bytes())
    running.pids = {r.role: r.pid for r in stack.processes if r.role in ("master", "worker-0")}
    if front_door_processes == 1:
        running.pids["front door"] = proc.pid
    else:  # the supervisor serves nothing: its processes are measured, each on its own
        for i, pid in enumerate(sorted(children_of(proc.pid))):
            running.pids[f"front door {i}"] = pid
    return running


async def _token(admin_url: str, name: str) -> str:
    from tabletstore.coordination import open_coordinator
    from tabletstore.coordination.tokens import TokenStore

    coordinator = open_coordinator(admin_url)
    try:
        return await TokenStore(coordinator).create(name)
    finally:
        await coordinator.close()


def _stop(running: Stack) -> None:
    from tabletstore.cli import localstack

    proc = running.front_door
    if proc.poll() is None:
        proc.terminate()  # our own child, by its handle
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    localstack.down(running.directory)


async def _prepare(running: Stack) -> None:
    """The probe's tables: ``probe`` through the worker, ``fd-probe`` through the front door
    (t1 creates it, so it is t1's), and the victim table of the bulk-load attack."""
    from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as bta
    from google.cloud.bigtable_admin_v2.types import table as admin_table

    from tabletstore.client.cluster import ClusterClient
    from tabletstore.data.model import SetCell
    from tabletstore.errors import Unavailable

    tls = running.stack.tls("client")
    async with await ClusterClient.open(running.stack.cluster_url, tls=tls) as client:
        for name in (WORKER_TABLE, "victim", "mine"):
            end = time.monotonic() + 150
            while True:
                try:
                    await client.create_table(name, ["cf"])
                    break
                except Unavailable:
                    if time.monotonic() > end:
                        raise
                    await asyncio.sleep(0.5)
        await client.table("victim").mutate_row(b"secret", [SetCell("cf", b"q", b"victim's")])
        await client.flush("victim")
    channel = running.channel()
    try:
        create = channel.unary_unary("/google.bigtable.admin.v2.BigtableTableAdmin/CreateTable")
        request = bta.CreateTableRequest(
            parent=FD_TABLE.split("/tables/")[0],
            table_id="fd-probe",
            table=admin_table.Table(column_families={"cf": admin_table.ColumnFamily()}),
        )
        await create(
            bta.CreateTableRequest.serialize(request),
            metadata=(("authorization", f"Bearer {running.token}"),),
            timeout=60,
        )
    finally:
        await channel.close()


# -- the attacks -------------------------------------------------------------------------------
@dataclass
class Tally:
    """What became of one attack's requests: refused (an error answer or a close by the
    server) or taken (served, or still held when the window ended)."""

    refused: int = 0
    taken: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def outcome(self) -> str:
        if not self.refused and not self.taken:
            return "-"
        if self.refused and not self.taken:
            return "refused"
        return "bounded"


Attack = Callable[[Stack, Tally, asyncio.Event, bool], Any]


def _anonymous_context(
    ca_file: str, cert: str | None = None, key: str | None = None
) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(ca_file)
    if cert is not None:
        ctx.load_cert_chain(cert, key)
    return ctx


async def _closed_by_server(reader: asyncio.StreamReader, stop: asyncio.Event) -> bool:
    """Read until the server closes (True) or ``stop`` is set (False)."""
    reading = asyncio.ensure_future(_drain(reader))
    stopping = asyncio.ensure_future(stop.wait())
    done, _ = await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    for task in (reading, stopping):
        task.cancel()
    return reading in done


async def _drain(reader: asyncio.StreamReader) -> None:
    with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
        while await reader.read(65536):
            pass


async def bulk_load(running: Stack, tally: Tally, stop: asyncio.Event, quick: bool) -> None:
    """Finding 1: loads from another table's objects, a foreign endpoint, a local directory."""
    from tabletstore.client.cluster import ClusterClient
    from tabletstore.errors import TabletStoreError

    stack = running.stack
    async with await ClusterClient.open(stack.cluster_url, tls=stack.tls("client")) as client:
        victim = (await client._info("victim")).table_id
        bucket_url = stack.store_url.split("?")[0]
        sources = [
            f"{bucket_url}/tables/{victim}?endpoint_url={stack.s3_endpoint}",
            f"{bucket_url}/tables/{victim}?endpoint_url=http://127.0.0.1:9&region=us-east-1",
            f"file://{running.directory}",
        ]
        while not stop.is_set():
            for url in sources:
                try:
                    await client.bulk_load("mine", url, load_id="attack")
                    tally.taken += 1
                except TabletStoreError:
                    tally.refused += 1
            await asyncio.sleep(0.1)


async def unauthenticated_slots(
    running: Stack, tally: Tally, stop: asyncio.Event, quick: bool
) -> None:
    """Finding 2: TLS connections without a certificate send the hello and a header
    announcing the largest frame, from four source addresses, and wait."""
    from tabletstore.rpc import frames
    from tabletstore.rpc.frames import Kind

    ctx = _anonymous_context(running.ca)
    per_source = 16 if quick else 64
    header = frames.HEADER.pack(frames.DEFAULT_MAX_FRAME, Kind.REQUEST, 1)
    waits = []
    writers = []
    while not stop.is_set():
        for source in SOURCES:
            for _ in range(per_source):
                try:
                    reader, writer = await asyncio.open_connection(
                        "127.0.0.1", running.worker_port, ssl=ctx, local_addr=(source, 0)
                    )
                    writer.write(frames.encode_hello(frames.DEFAULT_MAX_FRAME) + header)
                except (ConnectionError, ssl.SSLError, OSError):
                    tally.refused += 1
                    continue
                writers.append(writer)
                waits.append(asyncio.ensure_future(_closed_by_server(reader, stop)))
        # Open again what the server closed, until the window ends.
        await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=1.0)
        for closed in await asyncio.gather(*[w for w in waits if w.done()]):
            tally.refused += closed
        waits = [w for w in waits if not w.done()]
    for closed in await asyncio.gather(*waits):
        tally.refused += closed
        tally.taken += not closed
    for writer in writers:
        writer.close()


async def trickled_frames(running: Stack, tally: Tally, stop: asyncio.Event, quick: bool) -> None:
    """Finding 3: authenticated connections each announce a frame of nearly the largest size
    and send one byte every 0.5 s."""
    from tabletstore.rpc import frames
    from tabletstore.rpc.frames import Kind

    tls = running.stack.tls("client")
    ctx = _anonymous_context(running.ca, str(tls.cert), str(tls.key))
    conns = []
    for _ in range(4):
        reader, writer = await asyncio.open_connection("127.0.0.1", running.worker_port, ssl=ctx)
        writer.write(frames.encode_hello(frames.DEFAULT_MAX_FRAME))
        writer.write(frames.HEADER.pack(frames.DEFAULT_MAX_FRAME - 64, Kind.REQUEST, 1))
        conns.append((reader, writer, asyncio.ensure_future(_closed_by_server(reader, stop))))
    while not stop.is_set():
        await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=0.5)
        for _, writer, _ in conns:
            if not writer.is_closing():
                with contextlib.suppress(ConnectionError, OSError):
                    writer.write(b"\0")
    for _, writer, closed in conns:
        if await closed:
            tally.refused += 1
        else:
            tally.taken += 1
        writer.close()


async def _answered(tally: Tally, call: Callable[[], Any], refusals: set[Any]) -> None:
    """Make one gRPC call (a unary one, or a stream read to its end) and count how it was
    answered: refused if with one of the status codes ``refusals``, else taken."""
    import grpc

    try:
        answer = call()
        if hasattr(answer, "__aiter__"):
            async for _ in answer:
                pass
        else:
            await answer
        tally.taken += 1
    except grpc.aio.AioRpcError as exc:
        if exc.code() in refusals:
            tally.refused += 1
        else:
            tally.taken += 1
            tally.notes.append(str(exc.code()))


async def front_door_large(running: Stack, tally: Tally, stop: asyncio.Event, quick: bool) -> None:
    """Finding 4: concurrent unauthenticated 64 MiB calls at the front door, again and again,
    on one connection, sent frame by frame (``bench/raw_grpc.py``: the attacker's own copies
    of its messages are not the server's cost)."""
    from bench.raw_grpc import RawGrpcConnection

    message = memoryview(mutate_row_of_size((16 if quick else 64) << 20))
    calls = 4 if quick else 8
    conn = await RawGrpcConnection.open("127.0.0.1", running.fd_port, running.ca_pem)

    async def one() -> None:
        try:
            async with asyncio.timeout(60):
                status = await conn.call(f"{DATA}/MutateRow", message)
        except (TimeoutError, ConnectionError) as exc:
            tally.taken += 1
            tally.notes.append(str(exc) or type(exc).__name__)
            return
        if status == UNAUTHENTICATED:
            tally.refused += 1
        else:
            tally.taken += 1
            tally.notes.append(f"grpc-status {status}")

    try:
        while not stop.is_set():
            await asyncio.gather(*(one() for _ in range(calls)))
    finally:
        await conn.close()


async def front_door_flood(running: Stack, tally: Tally, stop: asyncio.Event, quick: bool) -> None:
    """Small unauthenticated calls at the front door: 16 concurrent callers on each of 4
    connections (more connections than one, as an attacker would open to get round a limit
    per connection)."""
    import grpc

    channels = [running.channel(("bench.connection", i)) for i in range(4)]
    payload = mutate_row_of_size(1024)

    async def caller(channel: Any) -> None:
        mutate = channel.unary_unary(f"{DATA}/MutateRow")
        while not stop.is_set():
            await _answered(
                tally, lambda: mutate(payload, timeout=10), {grpc.StatusCode.UNAUTHENTICATED}
            )

    try:
        await asyncio.gather(*(caller(c) for c in channels for _ in range(16)))
    finally:
        for channel in channels:
            await channel.close()


async def costly_filter(running: Stack, tally: Tally, stop: asyncio.Event, quick: bool) -> None:
    """Finding 5: reads whose filter holds 500 heavy regexes, through the worker and through
    the front door (a token holder's ReadRows with the same filter)."""
    import grpc
    from google.cloud.bigtable_v2.types import bigtable as bt
    from google.cloud.bigtable_v2.types import data

    from tabletstore.client.cluster import ClusterClient
    from tabletstore.errors import TabletStoreError

    hostile = regex_flood(500)  # built without the checks, as a hostile client can
    fd_filter = data.RowFilter(
        interleave=data.RowFilter.Interleave(
            filters=[data.RowFilter(value_regex_filter=heavy_pattern(i)) for i in range(500)]
        )
    )
    request = bt.ReadRowsRequest.serialize(
        bt.ReadRowsRequest(table_name=FD_TABLE, filter=fd_filter)
    )
    stack = running.stack
    channel = running.channel()
    read = channel.unary_stream(f"{DATA}/ReadRows")
    metadata = (("authorization", f"Bearer {running.token}"),)
    async with await ClusterClient.open(stack.cluster_url, tls=stack.tls("client")) as client:
        table = client.table(WORKER_TABLE)
        try:
            while not stop.is_set():
                try:
                    _ = [row async for row in table.read_rows(filter=hostile)]
                    tally.taken += 1
                except TabletStoreError:
                    tally.refused += 1
                await _answered(
                    tally,
                    lambda: read(request, metadata=metadata, timeout=30),
                    {grpc.StatusCode.INVALID_ARGUMENT},
                )
        finally:
            await channel.close()


async def status_places(running: Stack, tally: Tally, stop: asyncio.Event, quick: bool) -> None:
    """Finding 8: connections from four addresses holding unfinished request lines at the
    worker's status endpoint; a scraper's request is answered meanwhile (refused: 401 without
    the status token, never 503)."""
    url = running.worker.metrics_url
    host, port = url.removeprefix("https://").rsplit(":", 1)
    ctx = _anonymous_context(running.ca)
    writers: list[asyncio.StreamWriter] = []

    async def hold(source: str) -> None:
        for _ in range(16 if quick else 32):
            with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
                _, writer = await asyncio.open_connection(
                    host, int(port), ssl=ctx, local_addr=(source, 0)
                )
                writer.write(b"GET /metrics HTTP/1.1\r\nHo")
                writers.append(writer)

    holding = asyncio.gather(*(hold(source) for source in SOURCES))
    try:
        while True:  # a scraper's request, then one every 0.5 s while the places are held
            try:
                async with asyncio.timeout(10):
                    reader, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
                    writer.write(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    status = await reader.readline()
                writer.close()
                if status.startswith(b"HTTP/1.1 503"):
                    tally.taken += 1  # the attack kept the scraper out
                else:
                    tally.refused += 1
            except (TimeoutError, ConnectionError, OSError, ssl.SSLError):
                tally.taken += 1
            if stop.is_set():
                break
            await asyncio.wait([asyncio.ensure_future(stop.wait())], timeout=0.5)
    finally:
        holding.cancel()
        await asyncio.gather(holding, return_exceptions=True)
        for writer in writers:
            writer.close()


async def nothing(running: Stack, tally: Tally, stop: asyncio.Event, quick: bool) -> None:
    """No attack: the control row, whose ratios are the run-to-run noise of the machine."""
    await stop.wait()


#: (finding, name, attack), in the order run (the front door's large calls last: memory a
#: process has taken is not always given back to the system, and would weigh on later rows).
ATTACKS: tuple[tuple[str, str, Attack], ...] = (
    ("0", "none (control: idle against idle)", nothing),
    ("1", "bulk load from foreign locations", bulk_load),
    ("2", "unauthenticated connection slots", unauthenticated_slots),
    ("3", "trickled maximal frames", trickled_frames),
    ("5", "500-regex filter (worker + front door)", costly_filter),
    ("8", "status endpoint places", status_places),
    ("-", "unauthenticated flood at the front door", front_door_flood),
    ("4", "unauthenticated 64 MiB calls at the front door", front_door_large),
)


# -- measuring ---------------------------------------------------------------------------------
@dataclass
class Phase:
    """One phase's figures: per path the median over rounds of its p50 and p99 (ms); per
    process the median over rounds of its peak RSS (MiB); the load average at its end."""

    name: str
    finding: str = ""
    p50: dict[str, float] = field(default_factory=dict)
    p99: dict[str, float] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)
    failures: int = 0
    load: float = 0.0
    outcome: str = ""
    refused: int = 0
    taken: int = 0
    p99_ratio: float = 0.0
    rss_ratio: float = 0.0
    #: The path of the worst p99 ratio and the process of the worst RSS ratio.
    worst_path: str = ""
    worst_process: str = ""
    #: Per process the median CPU it used under the attack (cores); the largest ratio to the
    #: idle window before, and its process (a figure beside the verdict: CPU an attack takes
    #: is what raises the others' latency on a shared machine).
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_ratio: float = 0.0
    cpu_process: str = ""

    @property
    def verdict(self) -> str:
        """``ok`` when both ratios are within :data:`LIMIT` and no legitimate call failed."""
        if self.failures:
            return f"over ({self.failures} failed calls)"
        return "ok" if self.p99_ratio <= LIMIT and self.rss_ratio <= LIMIT else "over"


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


@dataclass
class Window:
    """One window's figures: per path its p50 and p99 (ms); per process its RSS at the start
    and its peak (MiB) and the CPU it used; what became of the attack's requests."""

    p50: dict[str, float]
    p99: dict[str, float]
    start: dict[str, float]
    peak: dict[str, float]
    #: Per process the CPU it used over the window, in cores (CPU seconds a second).
    cpu: dict[str, float]
    failures: int
    tally: Tally


async def _measure(
    running: Stack, probe: Connection, seconds: float, attack: Attack | None, quick: bool
) -> Window:
    tally = Tally()
    stop = asyncio.Event()
    start = {name: rss_mib(pid) for name, pid in running.pids.items()}
    peak = dict(start)
    cpu_start = {name: _cpu_seconds(pid) for name, pid in running.pids.items()}
    began = time.monotonic()
    task = asyncio.ensure_future(attack(running, tally, stop, quick)) if attack else None
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            for name, pid in running.pids.items():
                peak[name] = max(peak[name], rss_mib(pid))
            done.wait(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        await asyncio.sleep(0.5 if attack else 0)  # the attack under way first
        if task is not None and task.done():
            task.result()  # an attack that could not start says why
        probe.send(seconds)
        samples, failures = await asyncio.to_thread(probe.recv)
        elapsed = time.monotonic() - began
        cpu = {
            name: (_cpu_seconds(pid) - cpu_start[name]) / elapsed
            for name, pid in running.pids.items()
        }
    finally:
        stop.set()
        if task is not None:
            try:
                async with asyncio.timeout(90):
                    await task
            except Exception as exc:  # reported in the row; the run goes on
                tally.notes.append(f"{type(exc).__name__}: {exc}")
        done.set()
        watcher.join()
    gone = [name for name, pid in running.pids.items() if not _running(pid)]
    if gone:  # every later figure would be of a broken cluster: stop here, saying why
        raise SystemExit(
            f"{', '.join(gone)} exited during {'an attack' if attack else 'an idle window'} "
            f"({getattr(attack, '__name__', 'idle')}); the logs are in {running.directory} "
            "(run with --dir to keep them)"
        )
    p50 = {k: _quantile(v, 0.5) for k, v in samples.items() if v}
    p99 = {k: _quantile(v, 0.99) for k, v in samples.items() if v}
    return Window(p50, p99, start, peak, cpu, failures, tally)


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (not gone, not a zombie)."""
    from tabletstore.testing.processes import gone

    return not gone(pid)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _medians(values: list[dict[str, float]]) -> dict[str, float]:
    keys = {k for v in values for k in v}
    return {k: statistics.median(v[k] for v in values if k in v) for k in sorted(keys)}


def _worst(ratios: dict[str, float]) -> tuple[float, str]:
    return max(((v, k) for k, v in ratios.items()), default=(0.0, ""))


async def _phase(
    running: Stack,
    probe: Connection,
    name: str,
    finding: str,
    attack: Attack | None,
    rounds: int,
    window: float,
    quick: bool,
) -> Phase:
    """``rounds`` windows; with an attack each round is an idle window then an attack window,
    and the round's ratios are the attack window's over the idle one's (p99 per path; per
    process its peak over its RSS at the window's start): a shared machine's load drifts
    over minutes, and memory a process took is not always given back, so each attack is
    compared with the moment before it. The phase's figures are the medians over rounds."""
    phase = Phase(name, finding)
    attacked: list[Window] = []
    latency: list[dict[str, float]] = []
    memory: list[dict[str, float]] = []
    cpu: list[dict[str, float]] = []
    notes: list[str] = []
    for _ in range(rounds):
        before = await _measure(running, probe, window, None, quick) if attack else None
        w = await _measure(running, probe, window, attack, quick)
        attacked.append(w)
        phase.failures += w.failures
        phase.refused += w.tally.refused
        phase.taken += w.tally.taken
        notes += w.tally.notes
        if before is not None:
            latency.append({k: v / before.p99[k] for k, v in w.p99.items() if before.p99.get(k)})
            memory.append({k: v / w.start[k] for k, v in w.peak.items() if w.start.get(k)})
            cpu.append({k: v / before.cpu[k] for k, v in w.cpu.items() if before.cpu.get(k)})
            await asyncio.sleep(1.0)  # the servers settle between rounds
    phase.p50 = _medians([w.p50 for w in attacked])
    phase.p99 = _medians([w.p99 for w in attacked])
    phase.rss = _medians([w.peak for w in attacked])
    phase.cpu = _medians([w.cpu for w in attacked])
    phase.load = os.getloadavg()[0]
    if attack is not None:
        phase.outcome = Tally(phase.refused, phase.taken).outcome
        phase.p99_ratio, phase.worst_path = _worst(_medians(latency))
        phase.rss_ratio, phase.worst_process = _worst(_medians(memory))
        phase.cpu_ratio, phase.cpu_process = _worst(_medians(cpu))
    if notes:
        print(f"  {name}: {sorted(set(notes))[:3]}", flush=True)
    return phase


def table(idle: Phase, phases: list[Phase], after: dict[str, float]) -> str:
    """The results as Markdown: the idle figures, then one row per attack; ``after``: each
    process's RSS once every attack has run."""
    paths = ", ".join(f"{k} {idle.p50[k]:.1f}/{idle.p99[k]:.1f} ms" for k in idle.p99)
    rss = ", ".join(f"{k} {v:.0f} MiB" for k, v in idle.rss.items())
    kept = ", ".join(f"{k} {v:.0f} MiB" for k, v in after.items())
    lines = [
        f"Idle (p50/p99): {paths}; RSS {rss}; load average {idle.load:.1f}. "
        f"RSS after every attack: {kept}.",
        "",
        "| finding | attack | outcome (refused/taken) | p99 ratio (worst path) "
        "| RSS ratio (worst process) | verdict (≤1.5×) | CPU ratio (worst process) | load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in phases:
        lines.append(
            f"| {p.finding} | {p.name} | {p.outcome} ({p.refused}/{p.taken}) | "
            f"{p.p99_ratio:.2f}× ({p.worst_path}) | {p.rss_ratio:.2f}× ({p.worst_process}) | "
            f"{p.verdict} | {p.cpu_ratio:.2f}× ({p.cpu_process}) | {p.load:.1f} |"
        )
    return "\n".join(lines)


#: The markers around the table in the docs page (``--docs``).
BEGIN, END = "<!-- bench.attacks: begin -->", "<!-- bench.attacks: end -->"


def write_docs(path: Path, text: str) -> None:
    """Replace the table between the markers in ``path`` with ``text``."""
    replace_between(path, BEGIN, END, f"{text}\n")


async def run(
    running: Stack, probe: Connection, *, rounds: int, window: float, quick: bool, only: set[str]
) -> tuple[Phase, list[Phase], dict[str, float]]:
    print("idle ...", flush=True)
    idle = await _phase(running, probe, "idle", "", None, rounds, window, quick)
    phases = []
    for finding, name, attack in ATTACKS:
        if only and finding not in only:
            continue
        print(f"{finding}: {name} ...", flush=True)
        phases.append(await _phase(running, probe, name, finding, attack, rounds, window, quick))
    return idle, phases, {name: rss_mib(pid) for name, pid in running.pids.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.attacks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="one short round of each")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--window", type=float, default=6.0, help="seconds per window")
    parser.add_argument("--only", default="", help="findings to run, e.g. 2,4 (default: all)")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--docs", type=Path, default=None, help="replace the table in this page")
    parser.add_argument("--dir", type=Path, default=None, help="the stack's directory (kept)")
    parser.add_argument(
        "--front-door-processes",
        type=int,
        default=1,
        help="front-door processes sharing its port (bigtable-api --processes)",
    )
    args = parser.parse_args(argv)
    require_extra("bigtable-api", "bench.attacks")
    if args.quick:
        args.rounds, args.window = 1, 2.0
    only = {x for x in args.only.split(",") if x}
    directory = args.dir or Path(tempfile.mkdtemp(prefix="bench-attacks-"))
    running = _start(directory, args.front_door_processes)
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    probe_proc = None
    try:
        asyncio.run(_prepare(running))
        stack = running.stack
        tls = stack.tls("client")
        target = Target(
            stack.cluster_url, running.ca, str(tls.cert), str(tls.key),
            f"127.0.0.1:{running.fd_port}", running.token, running.ca_pem,
        )  # fmt: skip
        probe_proc = spawn.Process(target=_probe_main, args=(target, theirs), daemon=True)
        probe_proc.start()
        if not ours.poll(120) or ours.recv() != "ready":
            raise RuntimeError("the probe client did not start")
        # The attacks run in this process: an attacker's CPU is its own machine's, so here it
        # yields to the servers and the legitimate client (started before, at normal priority).
        lower_priority(ATTACKER_NICE)
        idle, phases, after = asyncio.run(
            run(running, ours, rounds=args.rounds, window=args.window, quick=args.quick, only=only)
        )
        ours.send(None)
    finally:
        if probe_proc is not None:
            probe_proc.join(30)
            if probe_proc.is_alive():
                probe_proc.kill()
        _stop(running)
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)
    text = table(idle, phases, after)
    print(text)
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "cpus": os.cpu_count(),
                    "rounds": args.rounds,
                    "window": args.window,
                    "idle": asdict(idle),
                    "rss_after": after,
                    "attacks": [{**asdict(p), "verdict": p.verdict} for p in phases],
                },
                indent=2,
            )
        )
    if args.docs is not None:
        write_docs(args.docs, text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
