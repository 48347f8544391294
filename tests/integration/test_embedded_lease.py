"""The embedded database survives a busy machine: its worker's lease cannot fence it.

Two ``bench.paper --growth`` runs at load 12-17 died with ``NotServing: worker embedded's
lease may have expired``: the event loop was held for longer than the lease (a request
loop that never suspended, see ``rpc/transport.call_handler``), the keep-alive came late,
and the lease — and with it the only worker of the process — was gone for good. In one
process that owns its directory nobody else can take the tablets, so the lease is bound to
the process (``coordination/lease.py``): these tests stall the event loop for several TTLs
(a short TTL through the options) and then read, write and scan, on ``memory://`` and
``file://``. A second test checks that a loop of requests answered from memory lets the
process's other tasks (the keep-alive among them) run.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tabletstore import SetCell
from tabletstore.embedded import Database
from tabletstore.options import LeaseOptions, WorkerOptions
from tests.integration.api_support import URL_KINDS, make_url

TTL = 0.6
#: The injected fault: the loop blocked for this long (several TTLs), not a wait.
STALL = 4 * TTL


@pytest.fixture(params=URL_KINDS)
async def short_lease_db(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Database]:
    db = await Database.open(
        make_url(request.param, tmp_path),
        worker_options=WorkerOptions(lease=LeaseOptions(ttl=TTL, safety_margin=TTL / 4)),
    )
    # A fenced worker would make the client retry NotServing until this deadline: fail fast.
    db.retry_deadline = 5.0
    try:
        yield db
    finally:
        await db.close()


def _stall_the_loop() -> None:
    """Block the event loop (the whole embedded database) for STALL seconds: the fault."""
    time.sleep(STALL)


def _set(value: bytes) -> list[SetCell]:
    return [SetCell("cf", b"q", value)]


async def test_a_stalled_event_loop_does_not_end_the_database(short_lease_db: Database) -> None:
    db = short_lease_db
    table = await db.create_table("t", ["cf"])
    await table.mutate_row(b"before", _set(b"1"))
    for round_ in range(2):
        _stall_the_loop()
        row = await table.read_row(b"before")
        assert row is not None and row.cells[0].value == b"1"
        await table.mutate_row(b"after-%d" % round_, _set(b"2"))
        keys = [r.key async for r in table.read_rows()]
        assert keys == [*[b"after-0", b"after-1"][: round_ + 1], b"before"]
        lease = db.worker.lease
        assert lease is not None and not lease.expired


async def test_a_loop_of_requests_served_from_memory_lets_other_tasks_run(
    short_lease_db: Database,
) -> None:
    db = short_lease_db
    table = await db.create_table("t", ["cf"])
    await table.mutate_row(b"hot", _set(b"v"))
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    requests = 0
    try:
        # Nothing here suspends unless the requests do: each call gives the ticker a turn.
        while ticks - before < 5 and requests < 10_000:
            assert await table.read_row(b"hot") is not None
            requests += 1
    finally:
        stop.set()
        await task
    assert ticks - before >= 5, f"the other task ran {ticks - before} times in {requests} requests"


async def test_callers_on_one_loop_take_turns_request_by_request(short_lease_db: Database) -> None:
    """Requests answered from memory never suspend, so without turns one caller runs its
    whole loop while a caller whose request waits (for I/O, or its turn) waits for every other
    caller's loop: the tail of a serving store. Every call gives the others a turn: a strict
    round robin, one request per caller per turn."""
    db = short_lease_db
    table = await db.create_table("t", ["cf"])
    await table.mutate_row(b"hot", _set(b"v"))
    order: list[int] = []
    callers, each = 8, 300

    async def caller(i: int) -> None:
        for _ in range(each):
            assert await table.read_row(b"hot") is not None
            order.append(i)

    await asyncio.gather(*(caller(i) for i in range(callers)))
    streak = longest = 1
    for a, b in itertools.pairwise(order):
        streak = streak + 1 if a == b else 1
        longest = max(longest, streak)
    # A 10 ms slice let one caller finish all of its 300 reads (about 20 µs each) in a row,
    # and a 0.1 ms slice a few.
    assert longest <= 2, f"a caller completed {longest} requests in a row"
