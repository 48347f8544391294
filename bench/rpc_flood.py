"""What a flood of half-sent frames costs an RPC server, over TCP on 127.0.0.1
with the server in a child process.

    python bench/rpc_flood.py [--connections 40] [--frame-mib 16] [--budget-mib 81] [--uvloop]

Each connection sends its hello, a frame header declaring ``--frame-mib`` MiB and half the body,
then stops. Prints the server's RSS before, at its peak and after, the byte budget's peak
(``RpcServer.budget.peak``) and how long until every connection was closed by the stall
timeout (1 s here). Before the caps the server held every half frame: about
``connections × frame / 2`` of RSS, for as long as the clients liked.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from pathlib import Path

from tabletstore.limits import MAX_FRAME, MiB
from tabletstore.options import RpcServerOptions
from tabletstore.rpc import frames
from tabletstore.rpc.frames import Kind
from tabletstore.rpc.tcp import RpcServer


def _serve(budget: int, uvloop_: bool, pipe: Connection) -> None:
    async def main() -> None:
        async def echo(request: object) -> object:
            return request

        options = RpcServerOptions(max_buffered_bytes=budget, stall_timeout=1.0)
        async with RpcServer({"echo": echo}, options=options) as server:
            pipe.send(server.port)
            while True:
                await asyncio.to_thread(pipe.poll, None)
                pipe.recv()
                pipe.send(server.budget.peak)

    if uvloop_:
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _half_frame(port: int, frame: int, body: memoryview) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(frames.encode_hello(MAX_FRAME))
        sock.recv(frames.HELLO_SIZE)
        try:
            sock.sendall(frames.HEADER.pack(frame - 4, Kind.REQUEST, 1))
            sock.sendall(body)
            while sock.recv(65536):
                pass
        except OSError:
            pass  # closed by the server: what we are waiting for


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=40)
    parser.add_argument("--frame-mib", type=int, default=16)
    parser.add_argument("--budget-mib", type=int, default=MAX_FRAME // MiB)
    parser.add_argument("--uvloop", action="store_true")
    args = parser.parse_args()
    frame, budget = args.frame_mib * MiB, max(args.budget_mib * MiB, MAX_FRAME)
    ours, theirs = multiprocessing.Pipe()
    child = multiprocessing.Process(target=_serve, args=(budget, args.uvloop, theirs))
    child.start()
    try:
        port = ours.recv()
        assert child.pid is not None
        before = _rss_mib(child.pid)
        peak = [before]
        done = threading.Event()

        def watch() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss_mib(child.pid or 0))
                done.wait(0.05)

        watcher = threading.Thread(target=watch)
        watcher.start()
        body = memoryview(bytes(frame // 2))
        start = time.perf_counter()
        with ThreadPoolExecutor(args.connections) as pool:
            list(pool.map(lambda _: _half_frame(port, frame, body), range(args.connections)))
        elapsed = time.perf_counter() - start
        done.set()
        watcher.join()
        ours.send("peak")
        budget_peak = ours.recv()
        print(
            f"{args.connections} connections x half of a {args.frame_mib} MiB frame, budget "
            f"{budget // MiB} MiB ({'uvloop' if args.uvloop else 'asyncio'}):\n"
            f"  server RSS {before:.0f} MiB -> peak {peak[0]:.0f} MiB -> after "
            f"{_rss_mib(child.pid):.0f} MiB (unbounded: +{args.connections * frame / 2 / MiB:.0f})\n"
            f"  byte budget peak {budget_peak / MiB:.1f} MiB; all closed in {elapsed:.1f} s"
        )
    finally:
        child.kill()
        child.join()


if __name__ == "__main__":
    main()
