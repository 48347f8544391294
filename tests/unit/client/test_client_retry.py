"""The client's retries of writes, against a scripted worker.

A MutateRows response reports errors per entry. An entry refused because its tablet is
splitting, moving or being recovered (NotServing, Unavailable, Fenced, Closed answered for that
entry) was certainly not applied: it is sent again, alone if the others succeeded, after the
tablet is looked up again. An entry answered Indeterminate (or sent with no answer) may have
been applied: it is reported as Indeterminate unless it is idempotent, then sent again. A
whole call refused or never sent (any Unavailable: the transport's contract) was not applied
either and is sent again; a call sent with no answer is Indeterminate (the transport says so).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tabletstore.client.client import AsyncClient
from tabletstore.client.mutate_rows import MutationsFailed
from tabletstore.data.model import Cell as ApiCell
from tabletstore.data.model import DeleteRow, Mutation, Row, RowMutation, SetCell
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.errors import (
    Indeterminate,
    NotServing,
    TabletStoreError,
    Unavailable,
    Unreachable,
)
from tabletstore.metadata.catalog import TableInfo
from tabletstore.metadata.record import TabletRecord
from tabletstore.rpc.messages import (
    EntryError,
    MutateRowsRequest,
    MutateRowsResponse,
    ReadRowsRequest,
    RowBatch,
    TableInfoMessage,
    TableNameRequest,
)
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Method

SCHEMA = TableSchema(name="t", families={"f": ColumnFamily(name="f")})
INFO = TableInfo("tid", SCHEMA)

#: One scripted answer: a call-level error, or per-entry errors by row (absent: applied).
Answer = TabletStoreError | dict[bytes, TabletStoreError]


class ScriptedWorker:
    """A transport whose MutateRows answers follow a script, one answer per call; when the
    script runs out every entry is applied. Records the rows of each request."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[list[bytes]] = []

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        assert method is TABLET.method(TabletService.mutate_rows)
        assert isinstance(request, MutateRowsRequest)
        rows = [e.row for e in request.entries]
        self.requests.append(rows)
        answer = self.answers.pop(0) if self.answers else {}
        if isinstance(answer, TabletStoreError):
            raise answer
        return MutateRowsResponse(
            tuple(EntryError.of(i, answer[row]) for i, row in enumerate(rows) if row in answer)
        )

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        raise AssertionError("no streams here")

    async def close(self) -> None:
        pass


class OneTablet:
    """A location cache with one tablet holding every row; counts invalidations and lookups
    made again (refresh)."""

    def __init__(self) -> None:
        self.invalidations = 0

    async def locate(self, table_id: str, row: bytes, *, refresh: bool = False) -> TabletRecord:
        if refresh:
            self.invalidations += 1
        return TabletRecord(table_id, "t0", b"", None, location="w0")

    def cached(self, table_id: str, row: bytes) -> TabletRecord | None:
        return TabletRecord(table_id, "t0", b"", None, location="w0")

    def invalidate(self, table_id: str, row: bytes | None = None) -> None:
        self.invalidations += 1


class Admin:
    async def get_table(self, req: TableNameRequest) -> TableInfoMessage:
        return TableInfoMessage.of(INFO)


def client_of(worker: ScriptedWorker, *, deadline: float = 5.0) -> tuple[AsyncClient, OneTablet]:
    locations = OneTablet()
    client = AsyncClient(
        catalog=None,  # type: ignore[arg-type]  # not used by writes
        transport=worker,
        admin=Admin(),  # type: ignore[arg-type]
        retry_deadline=deadline,
        locations=locations,  # type: ignore[arg-type]
    )
    return client, locations


def put(value: bytes = b"v") -> tuple[Mutation, ...]:
    return (SetCell("f", b"c", value),)  # no timestamp: not idempotent


def put_at(value: bytes = b"v") -> tuple[Mutation, ...]:
    return (SetCell("f", b"c", value, 1000),)  # explicit timestamp: idempotent


async def test_mutate_row_refused_by_a_splitting_tablet_is_sent_again() -> None:
    worker = ScriptedWorker({b"a": NotServing("tablet t0 is splitting; look it up again")})
    client, locations = client_of(worker)
    await client.table("t").mutate_row(b"a", put())
    assert worker.requests == [[b"a"], [b"a"]]
    assert locations.invalidations >= 1  # looked up again


@pytest.mark.parametrize(
    "refusal",
    [
        "NotServing",
        "Unavailable",  # a log stopped after a failed PUT, a lease about to end
        "Fenced",  # the worker's log was fenced by the tablet's recovery
        "Closed",  # the worker's log is closing: it is stopping
    ],
)
async def test_mutate_row_refused_for_its_entry_is_sent_again(refusal: str) -> None:
    from tabletstore import errors

    worker = ScriptedWorker({b"a": getattr(errors, refusal)("refused")})
    client, _ = client_of(worker)
    await client.table("t").mutate_row(b"a", put())
    assert worker.requests == [[b"a"], [b"a"]]


async def test_mutate_rows_sends_again_only_the_refused_entries() -> None:
    worker = ScriptedWorker(
        {b"b": NotServing("splitting"), b"c": Indeterminate("log PUT failed")},
        {b"b": NotServing("still splitting")},
    )
    client, _ = client_of(worker)
    entries = [RowMutation(r, put()) for r in (b"a", b"b", b"c", b"d")]
    with pytest.raises(MutationsFailed) as caught:
        await client.table("t").mutate_rows(entries)
    # a and d applied at once; b refused twice, then applied; c may have been applied and is
    # not idempotent: reported, never sent again.
    assert worker.requests == [[b"a", b"b", b"c", b"d"], [b"b"], [b"b"]]
    [failure] = caught.value.failures
    assert (failure.index, failure.row) == (2, b"c")
    assert isinstance(failure.error, Indeterminate)
    assert caught.value.may_have_applied


async def test_an_idempotent_entry_that_may_have_applied_is_sent_again() -> None:
    worker = ScriptedWorker({b"a": Indeterminate("log PUT failed"), b"b": Indeterminate("same")})
    client, _ = client_of(worker)
    entries = [RowMutation(b"a", put_at()), RowMutation(b"b", (DeleteRow(),))]
    await client.table("t").mutate_rows(entries)
    assert worker.requests == [[b"a", b"b"], [b"a", b"b"]]


async def test_no_answer_for_a_non_idempotent_write_is_indeterminate_at_once() -> None:
    worker = ScriptedWorker(Indeterminate("connection to w0 lost with the request in flight"))
    client, locations = client_of(worker)
    with pytest.raises(Indeterminate):
        await client.table("t").mutate_row(b"a", put())
    assert worker.requests == [[b"a"]]
    assert locations.invalidations == 1  # the owner may be dead: its location is forgotten


async def test_a_refusal_after_an_ambiguous_attempt_is_still_indeterminate() -> None:
    """An idempotent write sent with no answer, then refused until the deadline: the first
    attempt may have applied, so the caller hears Indeterminate, not Unavailable."""
    refusals: list[Answer] = [{b"a": NotServing("moving")}] * 1000
    worker = ScriptedWorker(Indeterminate("connection lost"), *refusals)
    client, _ = client_of(worker, deadline=0.3)
    with pytest.raises(Indeterminate):
        await client.table("t").mutate_row(b"a", put_at())
    assert len(worker.requests) > 2


async def test_refused_until_the_deadline_is_unavailable_and_not_applied() -> None:
    refusals: list[Answer] = [{b"a": NotServing("splitting")}] * 1000
    worker = ScriptedWorker(*refusals)
    client, _ = client_of(worker, deadline=0.3)
    with pytest.raises(Unavailable, match="not served within the retry deadline") as caught:
        await client.table("t").mutate_row(b"a", put())
    assert not caught.value.may_have_applied
    with pytest.raises(MutationsFailed) as batch:
        await client.table("t").mutate_rows([RowMutation(b"a", put())])
    assert not batch.value.may_have_applied


async def test_an_entry_error_that_is_not_a_refusal_is_reported_at_once() -> None:
    worker = ScriptedWorker({b"a": TabletStoreError("boom")})
    client, _ = client_of(worker)
    with pytest.raises(TabletStoreError, match="boom"):
        await client.table("t").mutate_row(b"a", put())
    assert worker.requests == [[b"a"]]


@pytest.mark.parametrize(
    "refusal",
    [
        Unavailable("server 10.0.0.1:7000 is shutting down"),  # refused before it ran
        Unreachable("cannot connect to 10.0.0.1:7000"),  # never sent
        NotServing("tablet t0 moved"),
    ],
)
async def test_a_refused_call_is_sent_again_even_when_not_idempotent(
    refusal: TabletStoreError,
) -> None:
    """A whole call answered with a refusal (or never sent) applied nothing: the transport
    reports a request sent with no answer as Indeterminate, so a plain Unavailable is safe to
    send again whatever the mutation, and the write is applied exactly once."""
    worker = ScriptedWorker(refusal)
    client, _ = client_of(worker)
    await client.table("t").mutate_row(b"a", put())
    assert worker.requests == [[b"a"], [b"a"]]


async def test_an_indeterminate_entry_of_a_non_idempotent_write_is_reported() -> None:
    worker = ScriptedWorker({b"a": Indeterminate("log PUT in flight when the log failed")})
    client, _ = client_of(worker)
    with pytest.raises(Indeterminate):
        await client.table("t").mutate_row(b"a", put())
    assert worker.requests == [[b"a"]]


class ScriptedReader(ScriptedWorker):
    """A transport whose read_row answers follow the script (an error to raise, or the
    reply); when it runs out, the row is found. Records each request's tablet and keys."""

    def __init__(self, *answers: TabletStoreError) -> None:
        super().__init__(*answers)
        self.reads: list[tuple[str, tuple[bytes, ...]]] = []

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        assert method is TABLET.method(TabletService.read_row)
        assert isinstance(request, ReadRowsRequest)
        self.reads.append((request.tablet_id, request.keys))
        if self.answers:
            answer = self.answers.pop(0)
            assert isinstance(answer, TabletStoreError)
            raise answer
        return RowBatch((Row(request.keys[0], [ApiCell("f", b"c", 7, b"v")]),))


async def test_a_point_read_with_its_tablet_cached_goes_straight_to_the_worker() -> None:
    worker = ScriptedReader()
    client, locations = client_of(worker)
    client._tables["t"] = INFO  # the table known, as after a first request
    row = await client.table("t").read_row(b"r")
    assert row is not None and row.cells[0].value == b"v"
    assert worker.reads == [("t0", (b"r",))] and locations.invalidations == 0


@pytest.mark.parametrize(
    ("error", "invalidated"),
    [
        (NotServing("moved"), 1),  # refused: looked up again (refresh), sent again
        (Indeterminate("no answer"), 3),  # no answer: forgotten each time, then looked up
    ],
)
async def test_a_point_read_refused_or_unanswered_on_its_first_try_is_sent_again(
    error: TabletStoreError, invalidated: int
) -> None:
    worker = ScriptedReader(error, error)
    client, locations = client_of(worker)
    client._tables["t"] = INFO
    row = await client.table("t").read_row(b"r")
    assert row is not None and row.key == b"r"
    assert len(worker.reads) == 3  # the first try, then the retry loop's two
    assert locations.invalidations == invalidated
