"""The floor under the front door's unary calls: a Python gRPC server that does nothing.

    python -m bench.grpc_floor [--ops 1000] [--runs 3]

Drives three servers with google-cloud-bigtable's synchronous data client, one call in flight,
as ``bench.bigtable_api`` does: ``mutate_row`` of one 100-byte cell and ``read_row``, ``--ops``
times each, and prints the calls per second and each server's CPU time per call (user +
system, from ``/proc``):

* **do-nothing grpc.aio**: a grpc.aio server on uvloop (what the front door runs on) whose
  MutateRow and ReadRows handlers return an empty message at once (no database, no protobuf
  parsing: the request stays bytes). What any Python front door pays per call before doing
  anything;
* **front door**: ``tabletstore bigtable-api`` over a ``memory://`` database;
* **emulator**: Google's ``cbtemulator`` (Go), its whole call.

Runs alternate between the servers; medians of ``--runs``. If the do-nothing server's CPU per
call is above the emulator's whole call, no Python gRPC front door reaches the emulator's
unary rates on this machine (both sides share its cores with the client).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

from bench import require_extra
from bench.bigtable_api import (
    INSTANCE,
    PROJECT,
    VALUE,
    _cpu_seconds,
    _free_port,
    _wait_listening,
    emulator,
    front_door,
)

FIGURES = ("writes/s", "write cpu µs", "reads/s", "read cpu µs")


def _serve_nothing(port: int) -> None:
    """The do-nothing server (run in its own process by :func:`do_nothing`)."""
    import grpc
    import uvloop

    async def empty(request: bytes, context: Any) -> bytes:
        return b""  # an empty MutateRowResponse; for ReadRows, a response with no chunks

    async def main() -> None:
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(empty)
        server.add_generic_rpc_handlers(
            [
                grpc.method_handlers_generic_handler(
                    "google.bigtable.v2.Bigtable", {"MutateRow": handler, "ReadRows": handler}
                )
            ]
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        await server.wait_for_termination()

    uvloop.run(main())


@contextlib.contextmanager
def do_nothing() -> Iterator[tuple[str, int]]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bench.grpc_floor", "--serve", str(port)])
    try:
        _wait_listening(proc, port, "the do-nothing server")
        yield f"127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def measure(address: str, pid: int, ops: int, *, create: bool) -> dict[str, float]:
    """Single writes and point reads against ``address`` (server process ``pid``)."""
    from google.cloud.bigtable import Client
    from google.cloud.bigtable.data import BigtableDataClient, SetCell

    os.environ["BIGTABLE_EMULATOR_HOST"] = address
    table_id = f"floor-{uuid.uuid4().hex[:8]}"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if create:  # the do-nothing server has no tables, and needs none
            admin = Client(project=PROJECT, admin=True)
            admin.instance(INSTANCE).table(table_id).create(column_families={"cf": None})
            admin.close()
        client = BigtableDataClient(project=PROJECT)
    try:
        table = client.get_table(INSTANCE, table_id)
        cell = SetCell("cf", b"q", VALUE, 1000)
        keys = [b"f%08d" % i for i in range(ops)]
        table.read_row(b"warm-up")
        out: dict[str, float] = {}
        phases = (("writes/s", "write cpu µs", True), ("reads/s", "read cpu µs", False))
        for rate, cpu, write in phases:
            used = _cpu_seconds(pid)
            start = time.perf_counter()
            for key in keys:
                if write:
                    table.mutate_row(key, cell)
                else:
                    table.read_row(key)
            out[rate] = ops / (time.perf_counter() - start)
            out[cpu] = (_cpu_seconds(pid) - used) * 1e6 / ops
        return out
    finally:
        client.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.grpc_floor", description=__doc__)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--serve", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    require_extra("bigtable-api", "python -m bench.grpc_floor")
    if args.serve is not None:
        _serve_nothing(args.serve)
        return 0
    columns: dict[str, dict[str, list[float]]] = {}
    with contextlib.ExitStack() as stack:
        servers = {
            "do-nothing grpc.aio": (*stack.enter_context(do_nothing()), False),
            "front door": (*stack.enter_context(front_door(None)), True),
            "emulator": (*stack.enter_context(emulator()), True),
        }
        for run in range(args.runs):
            order = list(servers.items())
            for name, (address, pid, create) in order[::-1] if run % 2 else order:
                for figure, value in measure(address, pid, args.ops, create=create).items():
                    columns.setdefault(name, {}).setdefault(figure, []).append(value)
    print(f"load average {os.getloadavg()[0]:.1f}; medians of {args.runs} runs")
    print(f"{'':22}" + "".join(f"{f:>14}" for f in FIGURES))
    for name, figures in columns.items():
        print(f"{name:22}" + "".join(f"{statistics.median(figures[f]):>14,.0f}" for f in FIGURES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
