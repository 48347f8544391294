"""A refused call leaves nothing of its request behind in the front door.

The attack: a token holder sends ReadRows requests of about 270 KB that the front door refuses
(a filter of 500 regexes, or any other InvalidArgument), back to back. Each refusal was
``context.abort``, and gRPC's handling of the exception it raises left the handler's frame,
the request it held included, in a garbage cycle. A server process collects such cycles
rarely (``ops/process_warmup.py`` raises the collector's thresholds), so the front door's
resident memory grew by the request's size with every refusal: 2,000 refused requests took it
from 202 MiB to 788 MiB. Now a refusal sets the call's status and returns.

The front door's own gRPC handlers (``front_door.generic_handlers``), on a real ``grpc.aio``
server on loopback, over a data service whose reads all fail; the collector is off while the
calls run, and a collection afterwards must find no frame holding a request.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest
from google.cloud.bigtable_v2.types import bigtable as bt
from google.cloud.bigtable_v2.types import data

from tabletstore.bigtable_api.front_door import generic_handlers
from tabletstore.bigtable_api.translate import filter_from_pb
from tabletstore.errors import InvalidArgument
from tests.security.test_filter_cost import heavy_pattern

READ_ROWS = "/google.bigtable.v2.Bigtable/ReadRows"
MUTATE_ROW = "/google.bigtable.v2.Bigtable/MutateRow"
CALLS = 20


class _Refusing:
    """A data service whose every read and write is refused as the front door refuses a
    filter over its limits."""

    async def read_one_row(self, req: Any) -> list[Any] | None:
        filter_from_pb(req.filter)  # refused: 500 regexes
        return None

    async def read_rows(self, req: Any) -> AsyncIterator[Any]:
        filter_from_pb(req.filter)
        yield None

    async def mutate_row(self, req: Any) -> Any:
        raise InvalidArgument("refused")

    @property
    def backups(self) -> _Refusing:
        return self

    def __getattr__(self, name: str) -> Any:
        async def refused(req: Any) -> Any:
            raise InvalidArgument(f"{name} refused")

        return refused


@pytest.fixture
def collector_off() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _frames_holding_requests(garbage: list[Any]) -> list[str]:
    kinds = (bt.ReadRowsRequest.pb(), bt.MutateRowRequest.pb())
    return [
        f"{o.f_code.co_name} ({o.f_code.co_filename.rsplit('/', 1)[-1]})"
        for o in garbage
        if type(o).__name__ == "frame" and any(type(v) in kinds for v in o.f_locals.values())
    ]


@pytest.mark.parametrize("streams_as_unary", [True, False])
async def test_refused_requests_are_not_kept_in_garbage_cycles(
    collector_off: None, streams_as_unary: bool
) -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        generic_handlers(_Refusing(), _Refusing(), streams_as_unary=streams_as_unary)  # type: ignore[arg-type]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    hostile = data.RowFilter(
        interleave=data.RowFilter.Interleave(
            filters=[data.RowFilter(value_regex_filter=heavy_pattern(i)) for i in range(500)]
        )
    )
    point = bt.ReadRowsRequest(
        table_name="projects/p/instances/i/tables/t",
        rows=data.RowSet(row_keys=[b"k"]),
        filter=hostile,
    )
    scan = bt.ReadRowsRequest(table_name="projects/p/instances/i/tables/t", filter=hostile)
    write = bt.MutateRowRequest(table_name="projects/p/instances/i/tables/t", row_key=b"k")
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            read = channel.unary_stream(READ_ROWS)
            mutate = channel.unary_unary(MUTATE_ROW)
            for _ in range(CALLS):
                for request in (point, scan):
                    with pytest.raises(grpc.aio.AioRpcError) as info:
                        async for _ in read(bt.ReadRowsRequest.serialize(request), timeout=30):
                            pass
                    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                    assert "MAX_FILTER_REGEXES=64" in (info.value.details() or "")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await mutate(bt.MutateRowRequest.serialize(write), timeout=30)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        await server.stop(None)
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        gc.collect()
        held = _frames_holding_requests(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert not held, f"{len(held)} frames in garbage cycles hold a request: {held[:4]}"
