"""A cluster client (``coalesce=True``) sends the concurrent single-row reads and mutations of
one worker as one request (client/coalesce.py), and each caller still sees what its own
request would have given: its row, its entry's error, retries of what was refused, and
Indeterminate for a write whose request got no answer -- over a real TCP connection too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from tabletstore.client.client import AsyncClient
from tabletstore.data.model import Cell, Row, SetCell
from tabletstore.errors import Indeterminate, InvalidArgument, NotServing, TabletStoreError
from tabletstore.metadata.record import TabletRecord
from tabletstore.rpc import frames
from tabletstore.rpc.messages import (
    EntryError,
    LargeRow,
    MutateRowsRequest,
    MutateRowsResponse,
    MutateTabletsRequest,
    PointReadsRequest,
    PointReadsResponse,
    ReadRowsRequest,
    RowBatch,
)
from tabletstore.rpc.rpc_client import TcpTransport
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Method
from tabletstore.rpc.wire import register_all
from tests.unit.client.test_client_retry import Admin, OneTablet, put

MUTATE = TABLET.method(TabletService.mutate_rows)
MUTATE_TABLETS = TABLET.method(TabletService.mutate_tablets)
READ = TABLET.method(TabletService.read_row)
POINTS = TABLET.method(TabletService.read_points)


def row(key: bytes) -> Row:
    return Row(key, (Cell("f", b"c", 1, b"v:" + key),))


class Worker:
    """A scripted transport: MutateRows and mutate_tablets answer per row from ``entry_errors``
    (each used once), or a whole-call error from ``call_errors``; read_row answers the rows in
    ``rows``, and read_points each part likewise; a part of read_points or mutate_tablets is
    answered with the part's error from ``part_errors`` (by tablet, each used once)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, tuple[bytes, ...]]] = []
        self.entry_errors: dict[bytes, TabletStoreError] = {}
        self.call_errors: list[TabletStoreError] = []
        self.rows: dict[bytes, Row] = {}
        self.large = False
        self.part_errors: dict[str, list[TabletStoreError]] = {}
        self.read_errors: list[TabletStoreError] = []

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        await asyncio.sleep(0)
        if method is MUTATE:
            assert isinstance(request, MutateRowsRequest)
            rows = tuple(e.row for e in request.entries)
            self.requests.append(("mutate", rows))
            if self.call_errors:
                raise self.call_errors.pop(0)
            return MutateRowsResponse(
                tuple(
                    EntryError.of(i, self.entry_errors.pop(r))
                    for i, r in enumerate(rows)
                    if r in self.entry_errors
                )
            )
        if method is MUTATE_TABLETS:
            assert isinstance(request, MutateTabletsRequest)
            self.requests.append(("mutate", tuple(e.row for p in request.parts for e in p.entries)))
            if self.call_errors:
                raise self.call_errors.pop(0)
            errors: list[EntryError] = []
            base = 0
            for part in request.parts:
                refused = self.part_errors.get(part.tablet_id)
                why = refused.pop(0) if refused else None
                for i, e in enumerate(part.entries):
                    error = why or self.entry_errors.pop(e.row, None)
                    if error is not None:
                        errors.append(EntryError.of(base + i, error))
                base += len(part.entries)
            return MutateRowsResponse(tuple(errors))
        if method is POINTS:
            assert isinstance(request, PointReadsRequest)
            if self.read_errors:
                self.requests.append(("lost", tuple(k for p in request.parts for k in p.keys)))
                raise self.read_errors.pop(0)
            answers: list[RowBatch | LargeRow | EntryError] = []
            for i, part in enumerate(request.parts):
                self.requests.append(("read", part.keys))
                errors = self.part_errors.get(part.tablet_id)
                if errors:
                    answers.append(EntryError.of(i, errors.pop(0)))
                else:
                    answers.append(self._rows(part.keys))
            return PointReadsResponse(tuple(answers))
        assert method is READ and isinstance(request, ReadRowsRequest)
        self.requests.append(("read", request.keys))
        return self._rows(request.keys)

    def _rows(self, keys: tuple[bytes, ...]) -> RowBatch | LargeRow:
        if self.large and len(keys) > 1:
            return LargeRow(keys[0], 10**9)
        return RowBatch(tuple(self.rows[k] for k in keys if k in self.rows))

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        raise AssertionError("no streams here")

    async def close(self) -> None:
        pass


def coalescing_client(transport: Any) -> AsyncClient:
    return AsyncClient(
        catalog=None,  # type: ignore[arg-type]  # not used by reads and writes
        transport=transport,
        admin=Admin(),  # type: ignore[arg-type]
        retry_deadline=5.0,
        locations=OneTablet(),  # type: ignore[arg-type]
        coalesce=True,
    )


async def test_concurrent_writes_share_one_request_and_keep_their_own_outcome() -> None:
    worker = Worker()
    worker.entry_errors = {
        b"r1": NotServing("splitting"),  # refused: sent again, alone
        b"r2": Indeterminate("log write timed out"),  # may be applied: reported
        b"r3": InvalidArgument("no such family"),  # refused for good
    }
    table = coalescing_client(worker).table("t")
    rows = [b"r0", b"r1", b"r2", b"r3", b"r4"]
    results = await asyncio.gather(
        *(table.mutate_row(r, put()) for r in rows), return_exceptions=True
    )
    assert results[0] is None and results[1] is None and results[4] is None
    assert isinstance(results[2], Indeterminate)
    assert isinstance(results[3], InvalidArgument)
    assert worker.requests == [("mutate", tuple(rows)), ("mutate", (b"r1",))]


async def test_a_request_without_answer_is_indeterminate_for_each_writer() -> None:
    worker = Worker()
    worker.call_errors = [Indeterminate("connection lost with the request in flight")]
    table = coalescing_client(worker).table("t")
    idempotent = (SetCell("f", b"c", b"v", timestamp=5),)
    results = await asyncio.gather(
        table.mutate_row(b"a", put()),
        table.mutate_row(b"b", idempotent),
        table.mutate_row(b"c", put()),
        return_exceptions=True,
    )
    assert isinstance(results[0], Indeterminate) and isinstance(results[2], Indeterminate)
    assert results[1] is None  # idempotent: sent again
    assert worker.requests == [("mutate", (b"a", b"b", b"c")), ("mutate", (b"b",))]


async def test_concurrent_point_reads_share_one_request() -> None:
    worker = Worker()
    worker.rows = {k: row(k) for k in (b"a", b"c")}
    table = coalescing_client(worker).table("t")
    got = await asyncio.gather(*(table.read_row(k) for k in (b"c", b"b", b"a", b"c")))
    assert got == [row(b"c"), None, row(b"a"), row(b"c")]
    assert worker.requests == [("read", (b"c", b"b", b"a"))]  # each row asked once


class TwoTablets(OneTablet):
    """Rows before ``m`` in tablet t0, the others in t1, both served by worker w0."""

    async def locate(self, table_id: str, row: bytes, *, refresh: bool = False) -> TabletRecord:
        if refresh:
            self.invalidations += 1
        return self.cached(table_id, row)

    def cached(self, table_id: str, row: bytes) -> TabletRecord:
        if row < b"m":
            return TabletRecord(table_id, "t0", b"", b"m", location="w0")
        return TabletRecord(table_id, "t1", b"m", None, location="w0")


async def test_point_reads_of_two_tablets_share_one_request() -> None:
    """One request per worker, not per tablet; each caller gets its own row."""
    worker = Worker()
    worker.rows = {k: row(k) for k in (b"a", b"x", b"z")}
    client = coalescing_client(worker)
    client.locations = TwoTablets()  # type: ignore[assignment]
    table = client.table("t")
    keys = (b"x", b"a", b"b", b"z", b"a")
    got = await asyncio.gather(*(table.read_row(k) for k in keys))
    assert got == [row(b"x"), row(b"a"), None, row(b"z"), row(b"a")]
    assert worker.requests == [("read", (b"x", b"z")), ("read", (b"a", b"b"))]
    assert client._point_reads is not None and client._point_reads.in_flight == 0


async def test_a_large_round_of_reads_leaves_as_several_requests() -> None:
    """More concurrent readers than one request takes: requests of at most 16 keys (so the
    worker reads one while the client hands out another's rows), each reader its own row."""
    worker = Worker()
    keys = [b"k%02d" % i for i in range(40)]
    worker.rows = {k: row(k) for k in keys[::2]}
    table = coalescing_client(worker).table("t")
    got = await asyncio.gather(*(table.read_row(k) for k in keys))
    assert got == [row(k) if i % 2 == 0 else None for i, k in enumerate(keys)]
    sizes = [len(keys) for _, keys in worker.requests]
    assert max(sizes) <= 16 and sum(sizes) == 40
    assert [k for _, ks in worker.requests for k in ks] == keys  # each once, in order


async def test_a_tablet_refused_in_a_shared_request_fails_only_its_own_reads() -> None:
    """A part answered with its own error (the tablet moved): its callers retry, alone or
    together, and get their rows; the other tablet's callers got theirs the first time."""
    worker = Worker()
    worker.rows = {k: row(k) for k in (b"a", b"b", b"x")}
    worker.part_errors = {"t1": [NotServing("tablet t1 moved")]}
    client = coalescing_client(worker)
    client.locations = TwoTablets()  # type: ignore[assignment]
    table = client.table("t")
    got = await asyncio.gather(*(table.read_row(k) for k in (b"a", b"x", b"b", b"y")))
    assert got == [row(b"a"), row(b"x"), row(b"b"), None]
    assert worker.requests[:2] == [("read", (b"a", b"b")), ("read", (b"x", b"y"))]
    # Only t1's two readers asked again (one request, or one each).
    again = sorted(k for _, keys in worker.requests[2:] for k in keys)
    assert again == [b"x", b"y"]


async def test_writes_to_two_tablets_share_one_request() -> None:
    """Single-row writes to several tablets of one worker leave as one
    ``mutate_tablets`` request (random writes spread over a worker's tablets left as one
    request per tablet, several times the requests of sequential ones); each writer keeps
    its own outcome."""
    worker = Worker()
    worker.entry_errors = {b"y": InvalidArgument("no such family")}  # refused for good, alone
    client = coalescing_client(worker)
    client.locations = TwoTablets()  # type: ignore[assignment]
    table = client.table("t")
    rows = (b"x", b"a", b"y", b"b", b"z")
    results = await asyncio.gather(
        *(table.mutate_row(r, put()) for r in rows), return_exceptions=True
    )
    assert results[:2] == [None, None] and results[3:] == [None, None]
    assert isinstance(results[2], InvalidArgument)
    assert worker.requests == [("mutate", (b"x", b"y", b"z", b"a", b"b"))]  # by tablet
    assert client._point_writes is not None and client._point_writes.in_flight == 0


async def test_a_tablet_refused_in_a_shared_write_request_retries_only_its_rows() -> None:
    """A part refused as a whole (its tablet moved: NotServing): only that tablet's writers
    send again; the other tablet's writers were acknowledged by the first request."""
    worker = Worker()
    worker.part_errors = {"t1": [NotServing("tablet t1 moved")]}
    client = coalescing_client(worker)
    client.locations = TwoTablets()  # type: ignore[assignment]
    table = client.table("t")
    rows = (b"a", b"x", b"b", b"y")
    results = await asyncio.gather(*(table.mutate_row(r, put()) for r in rows))
    assert results == [None] * 4
    assert worker.requests[0] == ("mutate", (b"a", b"b", b"x", b"y"))
    assert sorted(r for _, rs in worker.requests[1:] for r in rs) == [b"x", b"y"]


async def test_coalesced_reads_without_answer_are_sent_again() -> None:
    """With the tablet's location cached, a read goes straight to the coalescer; a request
    that got no answer (Indeterminate: safe, a read) is sent again after the location was
    forgotten, and every reader gets its row."""
    worker = Worker()
    worker.rows = {k: row(k) for k in (b"a", b"b", b"c")}
    client = coalescing_client(worker)
    locations = client.locations
    table = client.table("t")
    assert await table.read_row(b"a") == row(b"a")  # the table's info is now cached
    worker.read_errors = [Indeterminate("connection lost with the request in flight")]
    worker.requests.clear()
    got = await asyncio.gather(*(table.read_row(k) for k in (b"a", b"b", b"c")))
    assert got == [row(b"a"), row(b"b"), row(b"c")]
    assert worker.requests[0] == ("lost", (b"a", b"b", b"c"))
    assert sorted(k for _, keys in worker.requests[1:] for k in keys) == [b"a", b"b", b"c"]
    assert locations.invalidations >= 3  # type: ignore[attr-defined]  # each reader's row


async def test_reads_too_large_together_are_read_one_by_one() -> None:
    worker = Worker()
    worker.rows = {k: row(k) for k in (b"a", b"b")}
    worker.large = True
    table = coalescing_client(worker).table("t")
    got = await asyncio.gather(table.read_row(b"a"), table.read_row(b"b"))
    assert got == [row(b"a"), row(b"b")]
    assert worker.requests[0] == ("read", (b"a", b"b"))
    assert sorted(worker.requests[1:]) == [("read", (b"a",)), ("read", (b"b",))]


async def test_filtered_reads_are_not_coalesced() -> None:
    worker = Worker()
    table = coalescing_client(worker).table("t")
    await asyncio.gather(*(table.read_row(k, families=["f"]) for k in (b"a", b"b")))
    assert sorted(worker.requests) == [("read", (b"a",)), ("read", (b"b",))]


async def test_connection_dropped_with_coalesced_writes_outstanding() -> None:
    """Over TCP: the server takes the request, then the connection drops; every
    (non-idempotent) writer of the coalesced request gets Indeterminate."""
    register_all()
    got_request = asyncio.Event()

    async def black_hole(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(frames.encode_hello(frames.DEFAULT_MAX_FRAME))
        await reader.readexactly(frames.HELLO_SIZE)
        await reader.readexactly(frames.HEADER.size)  # the request arrives...
        got_request.set()
        writer.transport.abort()  # ...and the connection drops before any answer

    server = await asyncio.start_server(black_hole, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    transport = TcpTransport(timeout=10.0)
    locations = OneTablet()

    async def locate(table_id: str, key: bytes, *, refresh: bool = False) -> TabletRecord:
        return TabletRecord(table_id, "t0", b"", None, location=f"127.0.0.1:{port}")

    locations.locate = locate  # type: ignore[method-assign]
    locations.cached = lambda table_id, key: TabletRecord(  # type: ignore[method-assign]
        table_id, "t0", b"", None, location=f"127.0.0.1:{port}"
    )
    client = AsyncClient(
        catalog=None,  # type: ignore[arg-type]
        transport=transport,
        admin=Admin(),  # type: ignore[arg-type]
        retry_deadline=5.0,
        locations=locations,  # type: ignore[arg-type]
        coalesce=True,
    )
    table = client.table("t")
    try:
        results = await asyncio.gather(
            *(table.mutate_row(b"r%d" % i, put()) for i in range(4)), return_exceptions=True
        )
    finally:
        await transport.close()
        server.close()
        await server.wait_closed()
    assert got_request.is_set()
    assert all(isinstance(r, Indeterminate) for r in results), results


@pytest.mark.parametrize("n", [1, 3])
async def test_worker_reads_several_keys_in_one_read_row(n: int) -> None:
    """The worker's side: ``read_row`` with several keys (embedded database, in-process)."""
    from tabletstore.embedded import Database
    from tabletstore.rpc.services import TABLET as SERVICE

    db = await Database.open(f"memory://coalesce-read-row-{n}")
    try:
        table = await db.create_table("t", ["f"])
        for k in (b"a", b"c"):
            await table.mutate_row(k, [SetCell("f", b"q", b"v" + k)])
        info = await db._info("t")
        rec = await db.locations.locate(info.table_id, b"a")
        assert rec.location is not None
        stub = SERVICE.client(db._transport, rec.location)
        keys = (b"c", b"b", b"a")[:n]
        reply = await stub.read_row(ReadRowsRequest(info.table_id, rec.tablet_id, keys=keys))
        assert isinstance(reply, RowBatch)
        assert [r.key for r in reply.rows] == [k for k in keys if k != b"b"]
        with pytest.raises(InvalidArgument):
            await stub.read_row(ReadRowsRequest(info.table_id, rec.tablet_id, keys=()))
    finally:
        await db.close()
