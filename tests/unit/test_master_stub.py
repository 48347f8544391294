"""The cluster client's view of the master (client/cluster.py MasterStub), over the in-memory
coordinator and a scripted transport.

Issue 12: right after a cluster starts, ``create_table`` failed with ``Unavailable: no master is
elected in this cluster`` instead of waiting for the election within its deadline. An admin call
now waits for the election (watching it), and a master failing over is found again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tabletstore.client.cluster import MasterStub
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.errors import Unavailable, Unreachable
from tabletstore.rpc.messages import ListTablesResponse

pytestmark = pytest.mark.timeout(60)


class Masters:
    """A transport to master processes by address: live ones answer list_tables."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.calls: list[tuple[str, str]] = []

    async def call(self, address: str, method: str, request: Any) -> Any:
        self.calls.append((address, method))
        if address not in self.live:
            raise Unreachable(f"cannot connect to {address}")
        return ListTablesResponse(())

    def stream(self, address: str, method: str, request: Any) -> AsyncIterator[Any]:
        raise AssertionError("no streams here")

    async def close(self) -> None:
        pass


async def elect(coord: MemoryCoordinator, address: str) -> None:
    lease = await coord.grant_lease(60)
    await coord.election(paths.MASTER_ELECTION).campaign(address.encode(), lease)


async def test_an_admin_call_made_before_the_election_waits_for_it() -> None:
    coord, masters = MemoryCoordinator(), Masters()
    stub = MasterStub(coord, masters, deadline=30)  # type: ignore[arg-type]
    call = asyncio.ensure_future(stub.list_tables())
    for _ in range(10):  # the call is under way, finding no master
        await asyncio.sleep(0)
    assert not call.done()
    masters.live.add("10.0.0.1:7000")
    await elect(coord, "10.0.0.1:7000")
    assert await asyncio.wait_for(call, 30) == []
    assert masters.calls == [("10.0.0.1:7000", "list_tables")]
    await coord.close()


async def test_no_master_within_the_deadline_is_unavailable_and_says_so() -> None:
    coord = MemoryCoordinator()
    stub = MasterStub(coord, Masters(), deadline=0.3)  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="no master was elected in this cluster within"):
        await stub.list_tables()
    await coord.close()


async def test_a_master_that_fails_over_is_found_again() -> None:
    coord, masters = MemoryCoordinator(), Masters()
    first = await coord.grant_lease(60)
    await coord.election(paths.MASTER_ELECTION).campaign(b"10.0.0.1:7000", first)
    masters.live.add("10.0.0.1:7000")
    stub = MasterStub(coord, masters, deadline=30)  # type: ignore[arg-type]
    assert await stub.list_tables() == []
    # The first master dies (its lease and election key go); a standby takes over.
    masters.live.clear()
    await first.revoke()
    masters.live.add("10.0.0.2:7000")
    await elect(coord, "10.0.0.2:7000")
    assert await stub.list_tables() == []
    assert masters.calls[-1] == ("10.0.0.2:7000", "list_tables")
    await coord.close()
