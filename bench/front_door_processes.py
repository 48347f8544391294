"""The front door as one process against several sharing its port: reads/s and CPU per read.

    python -m bench.front_door_processes [--processes 2] [--repeat 3] [--seconds 10]
        [--clients 4] [--rows 2000] [--markdown FILE]

Starts the local stack (``cli/localstack.py``: etcd, a master and one worker over a local
directory store), loads ``--rows`` rows of 100 bytes into a table, and then, ``--repeat``
times, alternately starts ``tabletstore bigtable-api --processes 1`` and ``--processes P``
in front of it (``--plain-instance``: the table is seen through the Bigtable API as is; which
one goes first alternates, so a drift in the machine's load weighs on both alike). Against
each, ``--clients`` client processes (google-cloud-bigtable's synchronous data client, one
call in flight each, each its own connection: the kernel spreads connections, not calls,
over the processes) read random rows for ``--seconds``.

Reported per configuration: reads/s of every repeat and their median, p50 and p99 of the
calls, and CPU microseconds per read (medians) of the front door's processes and of the
worker behind it, from /proc. All on this machine: the clients, the front door and the
cluster share its cores, so on a machine with few cores a second process gains little
rate; the CPU per read says what each read costs. The load average is printed with them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import multiprocessing
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from bench import require_extra
from bench.cluster_target import cpu_seconds

PROJECT, INSTANCE, TABLE = "bench", "plain", "reads"
VALUE = b"v" * 100


def _key(i: int) -> bytes:
    return b"row%08d" % i


def _client(address: str, rows: int, seconds: float, seed: int, out: Connection) -> None:
    """One client process: random single-row reads for ``seconds``; sends the latencies."""
    os.environ["BIGTABLE_EMULATOR_HOST"] = address
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from google.cloud.bigtable.data import BigtableDataClient

        client = BigtableDataClient(project=PROJECT)
    picks = random.Random(seed)
    latencies: list[float] = []
    try:
        table = client.get_table(INSTANCE, TABLE)
        table.read_row(_key(0))  # the channel, before the clock starts
        out.send("ready")
        out.recv()
        end = time.perf_counter() + seconds
        while (now := time.perf_counter()) < end:
            if table.read_row(_key(picks.randrange(rows))) is None:
                raise AssertionError("a loaded row is missing")
            latencies.append(time.perf_counter() - now)
    finally:
        client.close()
    out.send(latencies)


@contextlib.contextmanager
def front_door(cluster_url: str, processes: int, env: dict[str, str]) -> Iterator[tuple[str, int]]:
    """``bigtable-api --processes N`` on a free port: (address, supervisor or process pid)."""
    argv = [
        sys.executable, "-m", "tabletstore.cli.main", "bigtable-api", "--url", cluster_url,
        "--port", "0", "--plain-instance", INSTANCE, "--processes", str(processes),
    ]  # fmt: skip
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("bigtable-api listening on "):
            raise RuntimeError(f"the front door did not start: {line!r}")
        yield line.split()[3], proc.pid
    finally:
        proc.terminate()  # our own child, by its handle
        proc.wait(120)


@dataclass
class Runs:
    rate: list[float] = field(default_factory=list)
    fd_cpu: list[float] = field(default_factory=list)
    worker_cpu: list[float] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)


def measure(
    address: str, fd_pid: int, worker_pid: int, args: argparse.Namespace, runs: Runs
) -> None:
    spawn = multiprocessing.get_context("spawn")
    pipes, procs = [], []
    for i in range(args.clients):
        ours, theirs = spawn.Pipe()
        proc = spawn.Process(
            target=_client, args=(address, args.rows, args.seconds, i, theirs), daemon=True
        )
        proc.start()
        pipes.append(ours)
        procs.append(proc)
    for pipe in pipes:
        if not pipe.poll(120) or pipe.recv() != "ready":
            raise RuntimeError("a client did not start")
    fd0, w0, t0 = cpu_seconds(fd_pid), cpu_seconds(worker_pid), time.perf_counter()
    for pipe in pipes:
        pipe.send("go")
    got = [pipe.recv() for pipe in pipes]
    elapsed = time.perf_counter() - t0
    fd1, w1 = cpu_seconds(fd_pid), cpu_seconds(worker_pid)
    for proc in procs:
        proc.join(30)
    reads = sum(len(x) for x in got)
    runs.rate.append(reads / elapsed)
    runs.fd_cpu.append(1e6 * (fd1 - fd0) / reads)
    runs.worker_cpu.append(1e6 * (w1 - w0) / reads)
    runs.latencies += [x for one in got for x in one]


async def _load(cluster_url: str, rows: int) -> None:
    from tabletstore import connect_async
    from tabletstore.data.model import RowMutation, SetCell

    client = await connect_async(cluster_url)
    try:
        table = await client.create_table(TABLE, ["cf"])
        for start in range(0, rows, 500):
            await table.mutate_rows(
                [
                    RowMutation(_key(i), [SetCell("cf", b"q", VALUE, timestamp=1000)])
                    for i in range(start, min(rows, start + 500))
                ]
            )
    finally:
        await client.close()


def _quantile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(results: dict[int, Runs], args: argparse.Namespace, load: str) -> str:
    lines = [
        "| front-door processes | reads/s (runs) | median reads/s | p50 / p99 ms "
        "| front door CPU µs/read | worker CPU µs/read |",
        "|---:|---|---:|---|---:|---:|",
    ]
    for processes, runs in sorted(results.items()):
        lines.append(
            f"| {processes} | {' '.join(f'{x:,.0f}' for x in runs.rate)} "
            f"| {statistics.median(runs.rate):,.0f} "
            f"| {_quantile(runs.latencies, 0.5):.1f} / {_quantile(runs.latencies, 0.99):.1f} "
            f"| {statistics.median(runs.fd_cpu):,.0f} "
            f"| {statistics.median(runs.worker_cpu):,.0f} |"
        )
    lines += [
        "",
        f"{args.clients} client processes (one call in flight each), {args.seconds:g} s per "
        f"run, {args.repeat} interleaved runs, {os.cpu_count()} cores; load average {load}.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.front_door_processes", description=__doc__)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--markdown", type=Path, default=None, help="write the table here")
    args = ap.parse_args(argv)
    require_extra("bigtable-api", "python -m bench.front_door_processes")
    from tabletstore.cli import localstack

    directory = Path(tempfile.mkdtemp(prefix="bench-fd-processes-"))
    stack = localstack.up(directory, workers=1, store_url=f"file://{directory / 'store'}")
    try:
        assert stack.cluster_url is not None
        worker = next(r for r in stack.processes if r.role == "worker-0")
        env = {**os.environ, **localstack.environment(stack)}
        asyncio.run(_load(stack.cluster_url, args.rows))
        results: dict[int, Runs] = {}
        loads = [os.getloadavg()[0]]
        for run in range(args.repeat):
            order = [1, args.processes] if run % 2 == 0 else [args.processes, 1]
            for processes in order:
                with front_door(stack.cluster_url, processes, env) as (address, pid):
                    measure(address, pid, worker.pid, args, results.setdefault(processes, Runs()))
                    loads.append(os.getloadavg()[0])
                    print(f"run {run} processes {processes}: {results[processes].rate[-1]:,.0f}"
                          f" reads/s", flush=True)  # fmt: skip
    finally:
        localstack.down(directory)
        shutil.rmtree(directory, ignore_errors=True)
    text = report(results, args, f"{min(loads):.1f} to {max(loads):.1f}")
    print(text)
    if args.markdown is not None:
        args.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
