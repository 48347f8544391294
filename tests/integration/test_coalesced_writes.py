"""Coalesced single-row writes through real workers (client/coalesce.py).

A cluster client sends the concurrent ``mutate_row`` calls of one event-loop iteration to a
worker as one ``mutate_tablets`` request, a part per tablet. Here, through two in-process
workers (test_location's stack: the cluster's code paths without sockets), a tablet moves
while such a request is on its way: its rows are refused alone (NotServing), looked up again
and written at the tablet's new worker, the other tablets' rows are acknowledged by the first
request, and every acknowledged row reads back.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tabletstore.client.client import AsyncClient
from tabletstore.data.model import SetCell
from tabletstore.rpc.messages import MutateTabletsRequest
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Method, Transport
from tests.integration.test_location import Stack, stack  # noqa: F401 (the fixture)

pytestmark = pytest.mark.timeout(120)

MUTATE_TABLETS = TABLET.method(TabletService.mutate_tablets)


class Recording:
    """A Transport that records each ``mutate_tablets`` (its worker and its parts' tablets and
    rows) and runs ``before_first`` before handing the first one to the worker."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.sent: list[tuple[str, dict[str, list[bytes]]]] = []
        self.before_first: Any = None

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        if method is MUTATE_TABLETS:
            assert isinstance(request, MutateTabletsRequest)
            parts = {p.tablet_id: [e.row for e in p.entries] for p in request.parts}
            self.sent.append((address, parts))
            if self.before_first is not None:
                hook, self.before_first = self.before_first, None
                await hook()
        return await self.inner.call(address, method, request, timeout=timeout)

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        return self.inner.stream(address, method, request, timeout=timeout)

    async def close(self) -> None:
        await self.inner.close()


async def test_a_tablet_moved_under_a_coalesced_write_retries_only_its_rows(
    stack: Stack,  # noqa: F811 (the fixture)
) -> None:
    await stack.client.create_table("cw", ["f"], split_keys=[b"g", b"n", b"t"])  # 4 tablets
    info = await stack.client._info("cw")
    records = [
        await stack.client.locations.locate(info.table_id, k) for k in (b"a", b"g", b"n", b"t")
    ]
    by_worker: dict[str | None, list[Any]] = {}
    for rec in records:
        by_worker.setdefault(rec.location, []).append(rec)
    # A worker serving two of the tablets (the master spreads 4 over 2 workers).
    (shared,) = [recs for recs in by_worker.values() if len(recs) >= 2][:1]
    moving, staying = shared[0], shared[1]

    transport = Recording(stack.transport)
    client = AsyncClient(
        catalog=stack.master.catalog, transport=transport, admin=stack.master, coalesce=True
    )
    table = client.table("cw")
    # Every tablet's location is cached before the round (one write each, not recorded).
    for rec in records:
        await table.mutate_row(rec.start_row or b"a", [SetCell("f", b"q", b"warm")])
    transport.sent.clear()

    async def move() -> None:
        await stack.move(moving)

    transport.before_first = move
    rows = [rec.start_row + b"%02d" % i for rec in (moving, staying) for i in range(4)]
    await asyncio.gather(*(table.mutate_row(r, [SetCell("f", b"q", b"v-" + r)]) for r in rows))

    first_address, first_parts = transport.sent[0]
    assert first_address == moving.location
    assert set(first_parts) == {moving.tablet_id, staying.tablet_id}  # one request, 2 tablets
    # Only the moved tablet's rows were sent again, to its new worker.
    retried = transport.sent[1:]
    assert retried and all(set(parts) == {moving.tablet_id} for _, parts in retried)
    assert all(a != moving.location for a, _ in retried)
    assert sorted(r for _, parts in retried for rs in parts.values() for r in rs) == sorted(
        first_parts[moving.tablet_id]
    )
    for r in rows:
        got = await table.read_row(r)
        assert got is not None and got.cells[0].value == b"v-" + r, r
    assert client._point_writes is not None and client._point_writes.in_flight == 0
