"""A flood of unauthenticated calls takes the front door's CPU at a bounded rate.

A front door with TLS and bearer tokens, its tarpit on a clock the test moves by hand, and
the attack: calls without a token, many more than a connection carries at once. Each refusal
used to be answered at once, so the refusals answered (each about half a millisecond of the
front door's CPU) grew with the rate the attacker sent them: the security benchmark's flood
of 16 callers took the front door's CPU tenfold. Now refusals wait their turn in the tarpit:
only the burst is answered while the clock stands still, however long the flood goes on; a
connection's calls held there stop at its stream limit; held calls take no place from a token
holder, whose call goes through under a concurrent-call limit smaller than the calls held;
beyond the tarpit's capacity calls are refused at once, and counted. A made-up method name
without a token waits there too.

Everything is counted on the server's tarpit; nothing is timed.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc
import pytest

from tabletstore.bigtable_api.front_door import BigtableApiServer
from tabletstore.bigtable_api.tarpit import Tarpit
from tabletstore.security import TlsConfig, ca
from tests.security.secure_cluster import true_when, wait_for
from tests.security.test_frontdoor_inflight_bytes import Tokens, _request

pytestmark = pytest.mark.timeout(120)

MUTATE_ROW = "/google.bigtable.v2.Bigtable/MutateRow"
STREAMS = 8
BURST = 2
CAPACITY = 12
MAX_CALLS = 4


class Clock:
    """The tarpit's clock: it moves only when the test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Backend:
    """A database whose writes succeed at once; it counts them."""

    def __init__(self) -> None:
        self.writes = 0

    def table(self, name: str) -> Any:
        return self

    async def mutate_row(self, key: bytes, mutations: Any) -> None:
        self.writes += 1


def _refused(calls: list[asyncio.Future[Any]]) -> int:
    """How many of ``calls`` have been refused as unauthenticated; every other one that ended
    was turned away by gRPC's transport before the front door saw it (a stream opened while
    the server still counted one that had ended: REFUSED_STREAM, which clients retry)."""
    refused = 0
    for call in calls:
        if call.done():
            exc = call.exception()
            assert isinstance(exc, grpc.aio.AioRpcError), exc
            if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                refused += 1
            else:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE, exc
                assert "RST_STREAM" in (exc.details() or ""), exc
    return refused


async def test_refusals_of_a_flood_are_answered_at_the_tarpits_rate(tmp_path: Path) -> None:
    certs = tmp_path / "certs"
    ca.init_ca(certs)
    ca.issue(certs, "frontdoor", role="function")
    tls = TlsConfig(
        str(certs / "ca.pem"), str(certs / "frontdoor.pem"), str(certs / "frontdoor.key")
    )
    clock = Clock()
    tarpit = Tarpit(rate=1.0, burst=BURST, capacity=CAPACITY, clock=clock)
    backend = Backend()
    server = BigtableApiServer(
        backend,  # type: ignore[arg-type]
        tls=tls,
        tokens=Tokens(),
        streams_per_connection=STREAMS,
        max_concurrent_calls=MAX_CALLS,
        tarpit=tarpit,
    )
    port = await server.start()
    credentials = grpc.ssl_channel_credentials((certs / "ca.pem").read_bytes())
    # Distinct channel arguments: each channel its own connection.
    channels = [
        grpc.aio.secure_channel(f"127.0.0.1:{port}", credentials, options=[("test.channel", i)])
        for i in range(3)
    ]
    request = _request(b"row")
    authorized = (("authorization", "Bearer token-t1"),)
    for channel in channels:  # one call first: the server's stream limit is known (a client
        # that opens more streams before it is sees those beyond it refused, UNAVAILABLE)
        await channel.unary_unary(MUTATE_ROW)(request, metadata=authorized, timeout=30)
    first = [
        asyncio.ensure_future(channels[0].unary_unary(MUTATE_ROW)(request, timeout=60))
        for _ in range(40)
    ]
    try:
        # The burst is answered; then the connection's calls wait until its streams are full.
        await wait_for(true_when(lambda: tarpit.held == STREAMS), "a connection's calls held")
        await asyncio.sleep(0.5)  # more of the flood would come now if anything let it
        assert tarpit.held == STREAMS, tarpit.held
        assert tarpit.answered == BURST, tarpit.answered
        assert _refused(first) == BURST

        # A token holder (on a connection of its own: the flood's has no stream free) gets
        # through, though more calls wait than its limit of calls.
        await channels[2].unary_unary(MUTATE_ROW)(request, metadata=authorized, timeout=30)
        assert backend.writes == len(channels) + 1
        await wait_for(true_when(lambda: server.admission.active == 0), "its place back")

        # The clock moves three seconds, one at a time, at one refusal a second: three more
        # are answered.
        for turn in (1, 2, 3):
            clock.now += 1.0
            await wait_for(
                true_when(lambda turn=turn: tarpit.answered == BURST + turn), "a refusal"
            )
        await wait_for(true_when(lambda: tarpit.held == STREAMS), "the freed streams refilled")
        assert tarpit.answered == BURST + 3, tarpit.answered

        # A second connection fills the tarpit to its capacity; beyond, calls are refused at
        # once (counted), and a made-up method without a token is refused as unauthenticated.
        second = [
            asyncio.ensure_future(channels[1].unary_unary(MUTATE_ROW)(request, timeout=60))
            for _ in range(10)
        ]
        await wait_for(true_when(lambda: sum(c.done() for c in second) == 6), "the overflow")
        assert tarpit.held == CAPACITY, tarpit.held
        assert tarpit.overflowed == _refused(second) > 0, tarpit.overflowed
        overflowed = tarpit.overflowed
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await channels[2].unary_unary("/made.up.Service/Method")(b"", timeout=30)
        assert caught.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert tarpit.overflowed == overflowed + 1
        assert tarpit.peak == CAPACITY
    finally:
        for channel in channels:
            await channel.close()
        await server.stop(grace=5)
    # Every held call let go when its connection closed.
    await wait_for(true_when(lambda: tarpit.held == 0), "the held calls let go")
    await asyncio.gather(*first, return_exceptions=True)
