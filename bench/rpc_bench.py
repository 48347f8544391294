"""RPC transport throughput (DESIGN.md §8): unary echo with 1 and 16 calls in flight, and
streamed items per second, over TCP on 127.0.0.1 with the server in a child process.

    python bench/rpc_bench.py [--runs 3] [--calls 5000] [--items 100000] [--no-uvloop]

Prints the median of ``--runs`` runs of each figure. DESIGN.md's reference for a minimal framed
echo over asyncio+uvloop on the project machine: about 14,000 req/s with one in flight and
about 60,000 with 16.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import statistics
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from tabletstore.rpc.codec import Codec
from tabletstore.rpc.tcp import RpcClient, RpcServer


@dataclasses.dataclass(frozen=True, slots=True)
class Echo:
    text: str
    blob: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    key: bytes
    n: int


CODEC = Codec()
CODEC.register(1, Echo)
CODEC.register(2, Item)


async def echo(request: Echo) -> Echo:
    return request


async def items(count: int) -> AsyncIterator[Item]:
    for i in range(count):
        yield Item(b"row-%08d" % i, i)


def _run(main: Callable[[], Coroutine[Any, Any, Any]], use_uvloop: bool) -> Any:
    if use_uvloop:
        try:
            import uvloop

            return uvloop.run(main())
        except ImportError:
            pass
    return asyncio.run(main())


def serve(port_queue: Any, use_uvloop: bool) -> None:
    """The child process: serve until terminated."""

    async def main() -> None:
        server = RpcServer({"echo": echo, "items": items}, codec=CODEC)
        await server.start()
        port_queue.put(server.port)
        await asyncio.Event().wait()

    _run(main, use_uvloop)


async def unary_rate(client: RpcClient, calls: int, in_flight: int) -> float:
    request = Echo("hello", b"x" * 32)

    async def worker(n: int) -> None:
        for _ in range(n):
            await client.call("echo", request)

    start = time.perf_counter()
    async with asyncio.TaskGroup() as tg:
        for _ in range(in_flight):
            tg.create_task(worker(calls // in_flight))
    return (calls // in_flight * in_flight) / (time.perf_counter() - start)


async def stream_rate(client: RpcClient, count: int) -> float:
    start = time.perf_counter()
    got = 0
    async with client.stream("items", count, window=256) as stream:
        async for _ in stream:
            got += 1
    assert got == count
    return count / (time.perf_counter() - start)


async def bench(port: int, runs: int, calls: int, count: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {"1 in flight": [], "16 in flight": [], "stream": []}
    async with RpcClient("127.0.0.1", port, codec=CODEC) as client:
        await unary_rate(client, 500, 1)  # warm up: connect, first allocations
        for _ in range(runs):
            results["1 in flight"].append(await unary_rate(client, calls, 1))
            results["16 in flight"].append(await unary_rate(client, calls * 4, 16))
            results["stream"].append(await stream_rate(client, count))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--no-uvloop", action="store_true")
    args = parser.parse_args()
    use_uvloop = not args.no_uvloop

    ctx = multiprocessing.get_context("spawn")
    port_queue = ctx.Queue()
    child = ctx.Process(target=serve, args=(port_queue, use_uvloop), daemon=True)
    child.start()
    try:
        port = port_queue.get(timeout=30)
        results = _run(lambda: bench(port, args.runs, args.calls, args.items), use_uvloop)
    finally:
        child.terminate()
        child.join(10)
    loop = "uvloop" if use_uvloop else "asyncio"
    print(f"RPC over TCP on 127.0.0.1 ({loop}, median of {args.runs} runs):")
    for name, rates in results.items():
        unit = "items/s" if name == "stream" else "req/s"
        spread = ", ".join(f"{r:,.0f}" for r in rates)
        print(f"  {name:>13}: {statistics.median(rates):>10,.0f} {unit}   ({spread})")


if __name__ == "__main__":
    main()
