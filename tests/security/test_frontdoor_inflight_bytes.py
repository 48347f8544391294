"""The front door bounds the request bytes of authenticated calls in flight, per caller.

A front door with TLS and tokens over a backend whose writes wait until the test lets them go,
so every write that got through holds its request. The attack: token holder t1 sends 12
concurrent 700 KiB MutateRow calls. Without a budget gRPC received all 12 messages and handed
them on (8.4 MiB held, the concurrency limit the only bound). Now the front door's in-flight
budget (4 MiB, one caller at most 2 MiB, a message charged 1 MiB while it arrives) lets at most
two of t1's calls hold their messages; the others wait and are refused RESOURCE_EXHAUSTED
naming the budget and its flag, without their messages being read. Meanwhile t2, another
caller, still gets its write through: t1 holds only its own share.

Bounded: one round of calls under deadlines; the backend is released in a finally.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from tabletstore.bigtable_api.front_door import BigtableApiServer
from tabletstore.errors import PermissionDenied
from tabletstore.limits import MiB
from tabletstore.security import TlsConfig, ca
from tabletstore.security.principal import Principal
from tests.security.secure_cluster import true_when, wait_for

pytestmark = pytest.mark.timeout(120)

MUTATE_ROW = "/google.bigtable.v2.Bigtable/MutateRow"
TABLE = "projects/p/instances/i/tables/t"
CAPACITY = 4 * MiB
MESSAGE = 1 * MiB
CALLS = 12
VALUE = 700 * 1024


class Tokens:
    """Two callers' tokens."""

    async def verify(self, token: str) -> Principal:
        if token not in ("token-t1", "token-t2"):
            raise PermissionDenied("unknown token")
        return Principal(token.removeprefix("token-"), "client", "token")


class HeldWrites:
    """A backend whose writes wait for ``release``; it counts what they hold."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding: dict[str, int] = {}
        self.peak = 0

    def table(self, name: str) -> Any:
        return _Table(self)


class _Table:
    def __init__(self, backend: HeldWrites) -> None:
        self._backend = backend

    async def mutate_row(self, key: bytes, mutations: Any) -> None:
        from tabletstore.client.client import ACTING_FOR

        b = self._backend
        who = ACTING_FOR.get() or ""
        b.holding[who] = b.holding.get(who, 0) + VALUE
        b.peak = max(b.peak, sum(b.holding.values()))
        try:
            await b.release.wait()
        finally:
            b.holding[who] -= VALUE


def _request(row: bytes) -> bytes:
    from google.cloud.bigtable_v2.types import bigtable as bt
    from google.cloud.bigtable_v2.types import data

    req = bt.MutateRowRequest(
        table_name=TABLE,
        row_key=row,
        mutations=[
            data.Mutation(
                set_cell=data.Mutation.SetCell(
                    family_name="cf",
                    column_qualifier=b"q",
                    timestamp_micros=-1,
                    value=b"v" * VALUE,
                )
            )
        ],
    )
    return bytes(bt.MutateRowRequest.serialize(req))


async def test_one_caller_holds_only_its_share_of_the_in_flight_request_bytes(
    tmp_path: Path,
) -> None:
    certs = tmp_path / "certs"
    ca.init_ca(certs)
    ca.issue(certs, "frontdoor", role="function")
    tls = TlsConfig(
        str(certs / "ca.pem"), str(certs / "frontdoor.pem"), str(certs / "frontdoor.key")
    )
    backend = HeldWrites()
    server = BigtableApiServer(
        backend,  # type: ignore[arg-type]
        tls=tls,
        tokens=Tokens(),
        max_message_bytes=MESSAGE,
        max_inflight_bytes=CAPACITY,
        budget_wait=1.0,
    )
    port = await server.start()
    channel = grpc.aio.secure_channel(
        f"127.0.0.1:{port}", grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    )
    mutate = channel.unary_unary(MUTATE_ROW)

    def call(who: str, row: bytes) -> Any:
        metadata = (("authorization", f"Bearer token-{who}"),)
        return asyncio.ensure_future(mutate(_request(row), metadata=metadata, timeout=30))

    try:
        flood = [call("t1", b"r%d" % i) for i in range(CALLS)]
        # The flood's refusals come after the budget's wait; t2 meanwhile gets in.
        other = call("t2", b"other")
        await wait_for(
            true_when(lambda: backend.holding.get("t2", 0) > 0 or other.done()), "t2's write"
        )
        assert backend.holding.get("t2", 0) == VALUE, (backend.holding, other)
        # Two of t1's calls hold their messages (its share); the rest are refused.
        await wait_for(
            true_when(lambda: sum(f.done() for f in flood) >= CALLS - 2), "t1's refusals"
        )
        refused = [f for f in flood if f.done() and f.exception() is not None]
        assert len(refused) == CALLS - 2, (len(refused), backend.holding)
        assert backend.holding["t1"] == 2 * VALUE, backend.holding
        for f in refused:
            exc = f.exception()
            assert isinstance(exc, grpc.aio.AioRpcError)
            assert exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, exc
            assert "--max-inflight-bytes" in (exc.details() or ""), exc.details()
        assert backend.peak <= CAPACITY, backend.peak
        assert server.budget.peak <= CAPACITY, server.budget.peak
    finally:
        backend.release.set()
        await channel.close()
        await server.stop(grace=5)
    # Every call's bytes came back, whatever became of it.
    assert server.budget.used == 0, server.budget.used
