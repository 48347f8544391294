"""RPC transport throughput (docs/architecture/design.md §8): unary echo with 1 and 16 calls in
flight, and streamed items per second, over TCP on 127.0.0.1 with the server in a child process.

    python bench/rpc_bench.py [--runs 3] [--calls 5000] [--items 100000] [--no-uvloop] [--tls]

``--tls`` also runs a second server with mutual TLS and a client certificate (a
throwaway CA, ``tabletstore.security.ca``), alternating runs with the plain one so both see the
same machine load, and prints both and the TLS / plain ratio.

Prints the median of ``--runs`` runs of each figure. docs/architecture/design.md's reference for a
minimal framed echo over asyncio+uvloop on the project machine: about 14,000 req/s with one in
flight and about 60,000 with 16.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import multiprocessing
import shutil
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from tabletstore.rpc.auth import ClientAuth, ServerAuth
from tabletstore.rpc.codec import Codec
from tabletstore.rpc.tcp import RpcClient, RpcServer
from tabletstore.security import TlsConfig


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


def _tls(certs: str | None, name: str) -> TlsConfig | None:
    if certs is None:
        return None
    return TlsConfig(f"{certs}/ca.pem", f"{certs}/{name}.pem", f"{certs}/{name}.key")


def serve(port_queue: Any, use_uvloop: bool, certs: str | None = None) -> None:
    """The child process: serve until terminated (with mutual TLS when ``certs`` is given)."""

    async def main() -> None:
        tls = _tls(certs, "server")
        auth = ServerAuth(tls) if tls is not None else None
        server = RpcServer({"echo": echo, "items": items}, codec=CODEC, auth=auth)
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


async def bench(
    ports: dict[str, int], runs: int, calls: int, count: int, certs: str | None = None
) -> dict[str, dict[str, list[float]]]:
    """Runs alternate between the servers (``ports``: label -> port) run by run."""
    out: dict[str, dict[str, list[float]]] = {
        label: {"1 in flight": [], "16 in flight": [], "stream": []} for label in ports
    }
    clients = {}
    for label, port in ports.items():
        tls = _tls(certs, "client") if label == "tls" else None
        auth = ClientAuth(tls) if tls is not None else None
        clients[label] = RpcClient("127.0.0.1", port, codec=CODEC, auth=auth)
        await unary_rate(clients[label], 500, 1)  # warm up: connect, first allocations
    try:
        for _ in range(runs):
            for label, client in clients.items():
                results = out[label]
                results["1 in flight"].append(await unary_rate(client, calls, 1))
                results["16 in flight"].append(await unary_rate(client, calls * 4, 16))
                results["stream"].append(await stream_rate(client, count))
    finally:
        for client in clients.values():
            await client.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--no-uvloop", action="store_true")
    parser.add_argument("--tls", action="store_true", help="also mutual TLS, side by side")
    args = parser.parse_args()
    use_uvloop = not args.no_uvloop

    certs = None
    if args.tls:
        from tabletstore.security import ca

        certs = tempfile.mkdtemp(prefix="rpc-bench-certs-")
        ca.init_ca(certs)
        ca.issue(certs, "server", role="worker")
        ca.issue(certs, "client", role="client")
    ctx = multiprocessing.get_context("spawn")
    children, ports = [], {}
    try:
        for label, child_certs in [("plain", None), *([("tls", certs)] if certs else [])]:
            port_queue = ctx.Queue()
            child = ctx.Process(
                target=serve, args=(port_queue, use_uvloop, child_certs), daemon=True
            )
            child.start()
            children.append(child)
            ports[label] = port_queue.get(timeout=30)
        results = _run(lambda: bench(ports, args.runs, args.calls, args.items, certs), use_uvloop)
    finally:
        for child in children:
            child.terminate()
            child.join(10)
        if certs is not None:
            shutil.rmtree(certs, ignore_errors=True)
    loop = "uvloop" if use_uvloop else "asyncio"
    print(f"RPC over TCP on 127.0.0.1 ({loop}, median of {args.runs} runs):")
    for label, figures in results.items():
        print(f" {label}:")
        for name, rates in figures.items():
            unit = "items/s" if name == "stream" else "req/s"
            spread = ", ".join(f"{r:,.0f}" for r in rates)
            ratio = ""
            if label == "tls":
                plain = statistics.median(results["plain"][name])
                ratio = f"  TLS/plain {statistics.median(rates) / plain:.0%}"
            print(f"  {name:>13}: {statistics.median(rates):>10,.0f} {unit}{ratio}   ({spread})")


if __name__ == "__main__":
    main()
