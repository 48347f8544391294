"""The point-read and mutate paths through the RPC layer (DESIGN.md §8), in one process.

    python bench/client_rpc_bench.py [--runs 3] [--ops 3000] [--no-uvloop]

Opens an embedded ``memory://`` database and measures, one request in flight and 16 in flight:

* **embedded**: ``AsyncTable.mutate_row`` and ``AsyncTable.read_row`` through the client, the
  location cache and the in-process transport to the worker (the embedded default's path);
* **tcp**: the same worker's handlers behind an ``RpcServer`` on 127.0.0.1 and a typed
  ``TabletService`` stub over a ``TcpTransport``: ``mutate_rows`` (one entry) and ``read_row``
  requests, codec and frames included (the path a cluster client takes to a worker).

Prints the median of ``--runs`` runs of each figure in operations per second.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from tabletstore.data.model import RowMutation, SetCell
from tabletstore.embedded import Database
from tabletstore.rpc.messages import MutateRowsRequest, ReadRowsRequest
from tabletstore.rpc.services import TABLET
from tabletstore.rpc.tcp import RpcServer, TcpTransport
from tabletstore.rpc.wire import register_all

Op = Callable[[int], Awaitable[Any]]


async def rate(op: Op, ops: int, in_flight: int) -> float:
    per_task = ops // in_flight

    async def worker(base: int) -> None:
        for i in range(per_task):
            await op(base + i)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for t in range(in_flight):
            tg.create_task(worker(t * per_task))
    return per_task * in_flight / (time.perf_counter() - start)


async def bench(runs: int, ops: int) -> dict[str, list[float]]:
    register_all()
    db = await Database.open("memory://client-rpc-bench")
    table = await db.create_table("t", ["f"])
    value = b"v" * 100
    keys = [b"row-%06d" % i for i in range(ops)]
    for key in keys:
        await table.mutate_row(key, [SetCell("f", b"q", value)])
    info = await db._info("t")
    rec = await db.locations.locate(info.table_id, b"")

    server = RpcServer(TABLET.handlers(db.worker.services))
    await server.start()
    transport = TcpTransport(timeout=30.0)
    stub = TABLET.client(transport, server.address)

    async def embedded_mutate(i: int) -> None:
        await table.mutate_row(keys[i % ops], [SetCell("f", b"q", value)])

    async def embedded_read(i: int) -> None:
        assert await table.read_row(keys[i % ops]) is not None

    async def tcp_mutate(i: int) -> None:
        entry = RowMutation(keys[i % ops], (SetCell("f", b"q", value),))
        resp = await stub.mutate_rows(MutateRowsRequest(info.table_id, rec.tablet_id, (entry,)))
        assert not resp.errors

    async def tcp_read(i: int) -> None:
        req = ReadRowsRequest(info.table_id, rec.tablet_id, keys=(keys[i % ops],))
        await stub.read_row(req)

    figures: dict[str, Op] = {
        "embedded mutate_row": embedded_mutate,
        "embedded read_row": embedded_read,
        "tcp mutate_rows": tcp_mutate,
        "tcp read_row": tcp_read,
    }
    results: dict[str, list[float]] = {}
    try:
        for op in figures.values():
            await rate(op, 200, 1)  # warm up
        for _ in range(runs):
            for name, op in figures.items():
                results.setdefault(f"{name}, 1 in flight", []).append(await rate(op, ops, 1))
                results.setdefault(f"{name}, 16 in flight", []).append(await rate(op, ops, 16))
    finally:
        await transport.close()
        await server.close()
        await db.close()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ops", type=int, default=3000)
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args()
    coro = bench(args.runs, args.ops)
    if args.no_uvloop:
        results = asyncio.run(coro)
    else:
        import uvloop

        results = uvloop.run(coro)
    loop = "asyncio" if args.no_uvloop else "uvloop"
    print(f"Client RPC paths ({loop}, median of {args.runs} runs, ops/s):")
    for name, rates in results.items():
        spread = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"  {name:>36}: {statistics.median(rates):>9,.0f}   ({spread})")


if __name__ == "__main__":
    main()
