"""The byte budget reserved by frames that never arrive.

The attack: a few connections each announce a frame of nearly the largest size and then send
one byte now and then. The budget reserved each announced frame whole as soon as its header
arrived, so a handful of headers took the whole budget and every other client's writes waited
behind them (first come, first served) for as long as the trickle went on.

Now nothing is reserved from a header: a frame's bytes are charged as they arrive, so the
trickling connections hold a few bytes and other clients' writes go straight through; a frame
that arrives slower than ``min_receive_rate`` is closed. Without a certificate the header is
not even read (the connection must authenticate first). Bounded: two attack connections each
way, a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tabletstore.errors import PermissionDenied
from tabletstore.rpc import frames
from tabletstore.rpc.frames import Kind
from tabletstore.rpc.tcp import RpcServer
from tests.security.transport_support import (
    Blob,
    Certs,
    attacker_context,
    client,
    close_all,
    closing_error,
    open_raw,
    secure_server,
)

pytestmark = pytest.mark.timeout(120)

FRAME = 4 << 20  # the largest frame; two of them fill the budget
BUDGET = 8 << 20


@contextlib.asynccontextmanager
async def _trickle(
    server: RpcServer, ctx: object, n: int
) -> AsyncIterator[list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]:
    """``n`` connections announcing a maximal frame, then one byte every 0.2 s."""
    conns = [await open_raw(server, ctx) for _ in range(n)]  # type: ignore[arg-type]
    for _, writer in conns:
        writer.write(frames.HEADER.pack(FRAME, Kind.REQUEST, 1))

    async def drip() -> None:
        for _ in range(100):  # at most 20 s
            await asyncio.sleep(0.2)
            for _, writer in conns:
                if not writer.is_closing():
                    writer.write(b"\0")

    task = asyncio.create_task(drip())
    try:
        yield conns
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        close_all(conns)


async def _victim_writes(certs: Certs, server: RpcServer) -> None:
    """Writes of 12 KiB to 1 MiB from an authenticated client, each within a short deadline."""
    async with client(certs, server, "u1") as victim:
        for size in (12 << 10, 256 << 10, 1 << 20):
            data = b"v" * size
            assert await victim.call("echo", Blob(data), timeout=5) == Blob(data[:16])


async def test_announced_frames_reserve_nothing_and_slow_senders_are_closed(
    tmp_path: Path,
) -> None:
    certs = Certs(tmp_path)
    async with secure_server(
        certs,
        max_frame=FRAME + 8,
        max_buffered_bytes=BUDGET,
        stall_timeout=1.0,
        min_receive_rate=4096,
    ) as server:
        # An authenticated attacker (a certificate of its own).
        ctx = attacker_context(certs.ca, certs.tls("u2"))
        async with _trickle(server, ctx, 2) as conns:
            await asyncio.sleep(0.5)  # the headers are in
            assert server.budget.used < 64 << 10
            await _victim_writes(certs, server)
            errors = await asyncio.gather(*(closing_error(r, 20) for r, _ in conns))
        assert all(e is not None and "min_receive_rate" in str(e) for e in errors), errors
        assert server.gate.refused["slow"] == 2


async def test_an_unauthenticated_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    async with secure_server(
        certs, max_frame=FRAME + 8, max_buffered_bytes=BUDGET, stall_timeout=1.0
    ) as server:
        anonymous = attacker_context(certs.ca)
        async with _trickle(server, anonymous, 2) as conns:
            await _victim_writes(certs, server)
            errors = await asyncio.gather(*(closing_error(r, 20) for r, _ in conns))
        assert all(isinstance(e, PermissionDenied) for e in errors), errors
        assert server.budget.peak < 2 << 20
