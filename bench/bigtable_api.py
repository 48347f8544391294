"""The Cloud Bigtable front door against Google's emulator, through the same official client.

    python -m bench.bigtable_api [--ops 1000] [--batch 100] [--batches 50] [--runs 1]
                                 [--url URL] [--only tabletstore|emulator] [--baseline DIR]

Starts ``tabletstore bigtable-api`` (a subprocess, over ``--url``: by default a fresh
``memory://`` database, in memory as the emulator's is; ``--url file`` for a durable one in a
temporary directory, whose every acknowledged write is an fsync'd commit-log segment) and
``cbtemulator`` (found as the tests find
it), and drives each with google-cloud-bigtable's synchronous data client, one call in flight
(``BIGTABLE_EMULATOR_HOST`` pointing at one, then the other):

* **single writes/s**: ``mutate_row`` of one 100-byte cell, ``--ops`` times;
* **batched writes/s**: rows per second of ``bulk_mutate_rows`` of ``--batch`` rows, ``--batches``
  times;
* **random reads/s**: ``read_row`` of a random written row, ``--ops`` times;
* **scanned rows/s**: ``read_rows`` of the whole table (every row written above).

Single writes and random reads also report each call's latency (p50, p99, p99.9 and the
maximum, ``bench.latency``): with one call in flight, a long tail there is the server
stalling (a collection, a compaction holding the loop), not a queue.

``--baseline DIR`` adds a third server: the front door run from another checkout (``DIR``, say
the main branch's), measured in the same runs, so a change's effect is read beside the machine's
load of the moment rather than against another run's figures.

Prints the columns side by side and tabletstore / emulator; the median of ``--runs`` runs,
which alternate between the two servers, each run starting with the other one (a loaded
machine then weighs on both alike).
Both servers run in their own process, so the client's process measures only the client.
Below the rates, each server's CPU time per operation (user + system, read from ``/proc``
around each phase): with one call in flight on a shared machine this is the steadier figure,
and the one the server can cut (the client's share is the same on both sides).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import require_extra
from bench.latency import summarize

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator")
REPO = Path(__file__).resolve().parents[1]
PROJECT, INSTANCE = "bench-project", "bench-instance"
VALUE = b"v" * 100
FIGURES = ("single writes/s", "batched writes/s", "random reads/s", "scanned rows/s")
#: The figures whose calls are timed one by one, and the latency columns of each.
TIMED = ("single writes/s", "random reads/s")
TAIL = ("p50", "p99", "p99.9", "max")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_listening(proc: subprocess.Popen[Any], port: int, what: str) -> None:
    deadline = time.monotonic() + 180  # a loaded machine imports slowly
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{what} did not start") from None
            time.sleep(0.05)


@contextlib.contextmanager
def emulator() -> Iterator[tuple[str, int]]:
    binary = str(EMULATOR) if EMULATOR.exists() else (shutil.which("cbtemulator") or "")
    if not binary:
        raise SystemExit("cbtemulator is not installed")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-host", "127.0.0.1", "-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(proc, port, "cbtemulator")
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextlib.contextmanager
def front_door(url: str | None, repo: Path = REPO) -> Iterator[tuple[str, int]]:
    with tempfile.TemporaryDirectory(prefix="bench-bigtable-api-") as tmp:
        port = _free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tabletstore.cli.main",
                "bigtable-api",
                "--url",
                f"file://{tmp}/db"
                if url == "file"
                else url or f"memory://bench-{uuid.uuid4().hex}",
                "--port",
                str(port),
            ],
            cwd=repo,
            env={**os.environ, "PYTHONPATH": str(repo)},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            _wait_listening(proc, port, "tabletstore bigtable-api")
            yield f"127.0.0.1:{port}", proc.pid
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _rate(n: int, fn: Callable[[], None], pid: int | None) -> tuple[float, float]:
    """(operations per second, server CPU microseconds per operation; 0 without ``pid``)."""
    cpu = _cpu_seconds(pid) if pid else 0.0
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    used = _cpu_seconds(pid) - cpu if pid else 0.0
    return n / elapsed, used * 1e6 / n


def measure(
    address: str, ops: int, batch: int, batches: int, pid: int | None = None
) -> dict[str, float]:
    """The four figures against the server at ``address`` (process ``pid``), and for each
    the server's CPU microseconds per operation (under ``"<figure> cpu"``)."""
    from google.cloud.bigtable import Client
    from google.cloud.bigtable.data import (
        BigtableDataClient,
        ReadRowsQuery,
        RowMutationEntry,
        SetCell,
    )

    os.environ["BIGTABLE_EMULATOR_HOST"] = address
    table_id = f"bench-{uuid.uuid4().hex[:8]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        admin = Client(project=PROJECT, admin=True)
        admin.instance(INSTANCE).table(table_id).create(column_families={"cf": None})
        admin.close()
        client = BigtableDataClient(project=PROJECT)
    try:
        table = client.get_table(INSTANCE, table_id)
        single = [b"s%08d" % i for i in range(ops)]
        bulk = [[b"b%08d" % (j * batch + i) for i in range(batch)] for j in range(batches)]
        cell = SetCell("cf", b"q", VALUE, 1000)
        out: dict[str, float] = {}
        calls: dict[str, list[float]] = {figure: [] for figure in TIMED}

        def singles() -> None:
            lat = calls["single writes/s"]
            for key in single:
                t0 = time.perf_counter()
                table.mutate_row(key, cell)
                lat.append(time.perf_counter() - t0)

        def batched() -> None:
            for keys in bulk:
                table.bulk_mutate_rows([RowMutationEntry(k, [cell]) for k in keys])

        everything = single + [k for keys in bulk for k in keys]
        picks = random.Random(1).choices(everything, k=ops)

        def reads() -> None:
            lat = calls["random reads/s"]
            for key in picks:
                t0 = time.perf_counter()
                row = table.read_row(key)
                lat.append(time.perf_counter() - t0)
                if row is None:
                    raise AssertionError(f"row {key!r} is missing")

        scanned = 0

        def scan() -> None:
            nonlocal scanned
            scanned = len(table.read_rows(ReadRowsQuery()))

        table.read_row(b"warm-up")  # the client's channel, and the server's first call
        phases = (
            (ops, singles),
            (batch * batches, batched),
            (ops, reads),
            (len(everything), scan),
        )
        for figure, (n, fn) in zip(FIGURES, phases, strict=True):
            out[figure], out[f"{figure} cpu"] = _rate(n, fn, pid)
        for figure, lat in calls.items():
            tail = summarize(lat)
            values = (tail.p50_ms, tail.p99_ms, tail.p999_ms, tail.max_ms)
            for name, ms in zip(TAIL, values, strict=True):
                out[f"{figure} {name}"] = ms
        if scanned != len(everything):
            raise AssertionError(f"scan returned {scanned} rows, expected {len(everything)}")
        return out
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.bigtable_api", description=__doc__)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument(
        "--url", default=None, help="tabletstore database (default: memory; 'file': a temp dir)"
    )
    ap.add_argument("--only", choices=("tabletstore", "emulator"), default=None)
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="another checkout whose front door runs beside this one's (a third column)",
    )
    args = ap.parse_args(argv)
    require_extra("bigtable-api", "python -m bench.bigtable_api")
    columns: dict[str, dict[str, list[float]]] = {}
    backends: list[tuple[str, Callable[[], contextlib.AbstractContextManager[tuple[str, int]]]]] = [
        ("tabletstore", lambda: front_door(args.url)),
        ("emulator", emulator),
    ]
    if args.baseline is not None:
        baseline = args.baseline.resolve()
        backends.append(("baseline", lambda: front_door(args.url, baseline)))
    with contextlib.ExitStack() as stack:
        addresses = {
            name: stack.enter_context(start())
            for name, start in backends
            if args.only in (None, name) or name == "baseline"
        }
        # Runs alternate between the servers, and which goes first alternates from run to
        # run, so a change in the machine's load meanwhile weighs on both columns alike.
        for run in range(args.runs):
            order = list(addresses.items())
            for name, (address, pid) in order[::-1] if run % 2 else order:
                got = measure(address, args.ops, args.batch, args.batches, pid)
                for figure, value in got.items():
                    columns.setdefault(name, {}).setdefault(figure, []).append(value)
    names = [name for name, _ in backends if name in columns]
    # Ratios: tabletstore over the emulator, and over the baseline checkout when there is one.
    pairs = [(a, b) for a, b in (("tabletstore", "emulator"), ("tabletstore", "baseline"))
             if a in names and b in names]  # fmt: skip
    store = (
        "a durable file:// database (fsync'd commit log)"
        if args.url == "file"
        else args.url or "memory:// (in memory; writes still go through the commit log)"
    )
    print(f"tabletstore over {store}; the emulator keeps everything in memory")
    print(
        f"{'':20}"
        + "".join(f"{n:>14}" for n in names)
        + "".join(f"{'/' + b[:8]:>11}" for _, b in pairs)
    )

    def row(label: str, key: str, fmt: str) -> None:
        values = {n: statistics.median(columns[n][key]) for n in names}
        line = label + "".join(f"{values[n]:>14{fmt}}" for n in names)
        for a, b in pairs:
            line += f"   {values[a] / values[b]:>7.2f}x" if values[b] else f"{'-':>11}"
        print(line)

    for figure in FIGURES:
        row(f"{figure:20}", figure, ",.0f")
    print("server CPU µs per operation")
    for figure in FIGURES:
        row(f"  {figure:18}", f"{figure} cpu", ",.1f")
    print("latency ms per call (" + ", ".join(TAIL) + ")")
    for figure in TIMED:
        line = f"  {figure:18}"
        for n in names:
            tail = [statistics.median(columns[n][f"{figure} {t}"]) for t in TAIL]
            line += f"  {n}: " + " / ".join(f"{ms:.2f}" for ms in tail)
        print(line)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
