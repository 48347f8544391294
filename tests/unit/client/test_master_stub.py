"""The cluster client's view of the master (client/cluster.py: a MasterService stub over the
ElectedMaster transport), over the in-memory coordinator and a scripted transport.

Right after a cluster starts, ``create_table`` failed with ``Unavailable: no master is
elected in this cluster`` instead of waiting for the election within its deadline. An admin call
now waits for the election (watching it), and a master failing over is found again.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tabletstore.client.cluster import master_client
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.errors import (
    AlreadyExists,
    Indeterminate,
    NotServing,
    TabletStoreError,
    Unavailable,
    Unreachable,
)
from tabletstore.rpc.messages import ListTablesRequest, ListTablesResponse
from tabletstore.rpc.services import MASTER, MasterService
from tabletstore.rpc.transport import Method

pytestmark = pytest.mark.timeout(60)


class Masters:
    """A transport to master processes by address: live ones answer list_tables."""

    def __init__(self) -> None:
        self.live: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        #: Answers to give before answering normally.
        self.errors: list[TabletStoreError] = []

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        assert method is MASTER.method(MasterService.list_tables)
        self.calls.append((address, method.name))
        if address not in self.live:
            raise Unreachable(f"cannot connect to {address}")
        if self.errors:
            raise self.errors.pop(0)
        return ListTablesResponse(())

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        raise AssertionError("no streams here")

    async def close(self) -> None:
        pass


async def elect(coord: MemoryCoordinator, address: str) -> None:
    lease = await coord.grant_lease(60)
    await coord.election(paths.MASTER_ELECTION).campaign(address.encode(), lease)


async def test_an_admin_call_made_before_the_election_waits_for_it() -> None:
    coord, masters = MemoryCoordinator(), Masters()
    stub = master_client(coord, masters, deadline=30)
    call = asyncio.ensure_future(stub.list_tables(ListTablesRequest()))
    for _ in range(10):  # the call is under way, finding no master
        await asyncio.sleep(0)
    assert not call.done()
    masters.live.add("10.0.0.1:7000")
    await elect(coord, "10.0.0.1:7000")
    assert await asyncio.wait_for(call, 30) == ListTablesResponse(())
    assert masters.calls == [("10.0.0.1:7000", "list_tables")]
    await coord.close()


async def test_no_master_within_the_deadline_is_unavailable_and_says_so() -> None:
    coord = MemoryCoordinator()
    stub = master_client(coord, Masters(), deadline=0.3)
    with pytest.raises(Unavailable, match="no master was elected in this cluster within"):
        await stub.list_tables(ListTablesRequest())
    await coord.close()


async def test_a_master_that_fails_over_is_found_again() -> None:
    coord, masters = MemoryCoordinator(), Masters()
    first = await coord.grant_lease(60)
    await coord.election(paths.MASTER_ELECTION).campaign(b"10.0.0.1:7000", first)
    masters.live.add("10.0.0.1:7000")
    stub = master_client(coord, masters, deadline=30)
    assert await stub.list_tables(ListTablesRequest()) == ListTablesResponse(())
    # The first master dies (its lease and election key go); a standby takes over.
    masters.live.clear()
    await first.revoke()
    masters.live.add("10.0.0.2:7000")
    await elect(coord, "10.0.0.2:7000")
    assert await stub.list_tables(ListTablesRequest()) == ListTablesResponse(())
    assert masters.calls[-1] == ("10.0.0.2:7000", "list_tables")
    await coord.close()


async def test_refusals_and_no_answer_are_sent_again_and_a_failed_repeat_is_indeterminate() -> None:
    """NotServing (a master that stopped leading) applied nothing: the call goes to the master
    elected next. Indeterminate (the master died with the call in flight) is sent again too
    (every admin change is guarded by the catalog), but a repeat that then fails may have
    failed because of the first attempt: the caller hears Indeterminate."""
    coord, masters = MemoryCoordinator(), Masters()
    await elect(coord, "10.0.0.1:7000")
    masters.live.add("10.0.0.1:7000")
    stub = master_client(coord, masters, deadline=30)
    masters.errors = [NotServing("this process is not the elected master")]
    assert await stub.list_tables(ListTablesRequest()) == ListTablesResponse(())
    assert len(masters.calls) == 2
    masters.errors = [Indeterminate("connection lost with the request in flight")]
    assert await stub.list_tables(ListTablesRequest()) == ListTablesResponse(())
    assert len(masters.calls) == 4
    masters.errors = [Indeterminate("no answer"), AlreadyExists("table t already exists")]
    with pytest.raises(Indeterminate, match=r"may have been applied.*AlreadyExists"):
        await stub.list_tables(ListTablesRequest())
    masters.errors = [AlreadyExists("table t already exists")]
    with pytest.raises(AlreadyExists):  # no earlier attempt: the answer as it is
        await stub.list_tables(ListTablesRequest())
    await coord.close()
