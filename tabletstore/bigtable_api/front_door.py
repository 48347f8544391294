"""The Cloud Bigtable API front door: a gRPC server that official Bigtable clients talk to (§3).

Size: over 800 lines because it holds one handler per method of ``google.bigtable.v2.Bigtable``
and the instance half of the admin API, each a few lines of request checks around a call to
the client; the conversions are pure functions elsewhere (``translate.py``, ``chunks.py``,
``admin.py``, ``instances.py``), and splitting the handlers by method would only scatter the
one servicer that grpc registers.

``google.bigtable.v2.Bigtable`` (ReadRows, SampleRowKeys, MutateRow, MutateRows,
CheckAndMutateRow, ReadModifyWriteRow, PingAndWarm, and the change streams'
GenerateInitialChangeStreamPartitions and ReadChangeStream: :mod:`~tabletstore.bigtable_api.
change_streams`) and the table half of
``google.bigtable.admin.v2.BigtableTableAdmin`` (:mod:`tabletstore.bigtable_api.admin`, its
backups :mod:`tabletstore.bigtable_api.backups`) are
served over any tabletstore :class:`~tabletstore.client.client.AsyncClient` -- the embedded
database or a cluster client. Point existing code at it with
``BIGTABLE_EMULATOR_HOST=host:port``, exactly as for Google's emulator.

``google-cloud-bigtable`` ships the message classes but no service descriptors, so handlers
are registered by method path with a generic handler. Every other method of both services
answers UNIMPLEMENTED with a message naming it; unknown services get gRPC's own UNIMPLEMENTED.

Errors: a tabletstore error becomes the status :func:`translate.status_code` names, with the
error's message; any other exception is logged and answered INTERNAL. No request can stop the
server. In MutateRows each entry gets its own status, as the API specifies.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import grpc
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as bta
from google.cloud.bigtable_v2.types import bigtable as bt
from google.protobuf import empty_pb2
from google.rpc import status_pb2

from tabletstore.bigtable_api import change_streams
from tabletstore.bigtable_api.admin import TableAdmin
from tabletstore.bigtable_api.chunks import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_ROWS_BYTES,
    DEFAULT_MAX_VALUE_CHUNK,
    ChunkEncoder,
    whole_row_response,
)
from tabletstore.bigtable_api.instances import PREFIX_IN_TEXT, InstanceAdmin, Namespaces
from tabletstore.bigtable_api.request_budget import (
    BudgetAdmission,
    BudgetInterceptor,
    RequestBudget,
)
from tabletstore.bigtable_api.tarpit import Tarpit
from tabletstore.bigtable_api.token_check import (
    TOKEN_RECHECK,
    BearerTokens,
    RememberedTokens,
    refuse,
    server_credentials,
)
from tabletstore.bigtable_api.translate import (
    filter_from_pb,
    mutations_from_pb,
    parse_instance_name,
    parse_table_name,
    rmw_rules_from_pb,
    row_set_from_pb,
    row_to_pb,
    server_timestamp,
    status_code,
)
from tabletstore.client.change_plan import Change, Heartbeat
from tabletstore.client.client import AsyncClient
from tabletstore.client.mutate_rows import MutationsFailed
from tabletstore.client.table import AsyncTable
from tabletstore.clock import Clock, SystemClock, stopwatch
from tabletstore.data.model import Mutation, Row, RowMutation
from tabletstore.data.validation import MAX_MUTATIONS_PER_ROW, check_row_key
from tabletstore.errors import InvalidArgument, TabletStoreError, Unimplemented
from tabletstore.limits import MAX_REQUEST_BYTES
from tabletstore.options import FRONT_DOOR_INFLIGHT_BYTES, FRONT_DOOR_MAX_CONCURRENT_CALLS
from tabletstore.rpc.auth import TokenVerifier
from tabletstore.rpc.messages import ScanProgress
from tabletstore.security import TlsConfig

__all__ = [
    "ADMIN_SERVICE",
    "DATA_SERVICE",
    "INSTANCE_ADMIN_SERVICE",
    "BackgroundServer",
    "BigtableApiServer",
    "BigtableData",
    "TlsFiles",
    "generic_handlers",
    "open_client",
]

DATA_SERVICE = "google.bigtable.v2.Bigtable"
ADMIN_SERVICE = "google.bigtable.admin.v2.BigtableTableAdmin"
INSTANCE_ADMIN_SERVICE = "google.bigtable.admin.v2.BigtableInstanceAdmin"
#: Methods of the two services tabletstore does not implement (answered UNIMPLEMENTED).
UNIMPLEMENTED_DATA = (
    "ExecuteQuery",
    "PrepareQuery",
)
UNIMPLEMENTED_ADMIN = (
    "CreateTableFromSnapshot",
    "UpdateTable",
    "UndeleteTable",
    "CreateAuthorizedView",
    "ListAuthorizedViews",
    "GetAuthorizedView",
    "UpdateAuthorizedView",
    "DeleteAuthorizedView",
    "SnapshotTable",
    "GetSnapshot",
    "ListSnapshots",
    "DeleteSnapshot",
    "GetIamPolicy",
    "SetIamPolicy",
    "TestIamPermissions",
    "CreateSchemaBundle",
    "UpdateSchemaBundle",
    "GetSchemaBundle",
    "ListSchemaBundles",
    "DeleteSchemaBundle",
)
UNIMPLEMENTED_INSTANCE_ADMIN = (
    "CreateCluster",
    "UpdateCluster",
    "PartialUpdateCluster",
    "DeleteCluster",
    "CreateAppProfile",
    "GetAppProfile",
    "ListAppProfiles",
    "UpdateAppProfile",
    "DeleteAppProfile",
    "GetIamPolicy",
    "SetIamPolicy",
    "TestIamPermissions",
    "ListHotTablets",
    "CreateLogicalView",
    "GetLogicalView",
    "ListLogicalViews",
    "UpdateLogicalView",
    "DeleteLogicalView",
    "CreateMaterializedView",
    "GetMaterializedView",
    "ListMaterializedViews",
    "UpdateMaterializedView",
    "DeleteMaterializedView",
    "GetMemoryLayer",
    "ListMemoryLayers",
    "UpdateMemoryLayer",
)
#: Bigtable's limit on mutations in one MutateRows request, over all entries.
MAX_MUTATIONS_PER_REQUEST = MAX_MUTATIONS_PER_ROW
#: Largest message either way: ``limits.MAX_REQUEST_BYTES``, what one maximal row mutation needs
#: (each entry is also checked against ``limits.MAX_MUTATION_BYTES``). gRPC refuses a larger
#: request with RESOURCE_EXHAUSTED from its length prefix, before buffering it; ReadRows
#: responses stay near ``DEFAULT_MAX_RESPONSE_BYTES`` whatever the row's size (chunks.py).
MAX_MESSAGE_BYTES = MAX_REQUEST_BYTES
#: Calls one connection may carry at once (HTTP/2 ``SETTINGS_MAX_CONCURRENT_STREAMS``): Cloud
#: Bigtable's own limit, for which its clients keep a pool of channels. A client queues calls
#: beyond it until one ends, so it bounds what one connection can hold in the tarpit.
STREAMS_PER_CONNECTION = 100
#: The tarpit's refusals a second, its burst, and the refusals it holds at most (``tarpit.py``):
#: 50 refusals a second are about 2.5% of a core; a held call takes about 20 KiB, and at most
#: 90 KiB with the request bytes its stream's window let in, so 1,024 of them at most 90 MiB.
TARPIT_RATE = 50.0
TARPIT_BURST = 50
TARPIT_CAPACITY = 1024

_log = logging.getLogger(__name__)

_MutateRowResponse: Any = bt.MutateRowResponse.pb()
_MutateRowsResponse: Any = bt.MutateRowsResponse.pb()
_CheckAndMutateRowResponse: Any = bt.CheckAndMutateRowResponse.pb()
_ReadModifyWriteRowResponse: Any = bt.ReadModifyWriteRowResponse.pb()
_SampleRowKeysResponse: Any = bt.SampleRowKeysResponse.pb()
_PingAndWarmResponse: Any = bt.PingAndWarmResponse.pb()
_ReadRowsResponse: Any = bt.ReadRowsResponse.pb()
_REQUEST_STATS_FULL = int(bt.ReadRowsRequest.RequestStatsView.REQUEST_STATS_FULL)
_OK = grpc.StatusCode.OK.value[0]
#: Table names whose handles BigtableData keeps (the cache starts over when full).
_TABLE_CACHE = 1024


class BigtableData:
    """The data RPCs; each takes a raw request message and returns (or yields) responses."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        clock: Clock | None = None,
        max_value_chunk: int = DEFAULT_MAX_VALUE_CHUNK,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_rows_bytes: int = DEFAULT_MAX_ROWS_BYTES,
        namespaces: Namespaces | None = None,
    ) -> None:
        self._client = client
        self._ns = namespaces or Namespaces()
        #: Table handles by request table name (a handle holds nothing but the name).
        self._tables: dict[str, AsyncTable] = {}
        self._clock = clock or SystemClock()
        self._max_value_chunk = max_value_chunk
        self._max_response_bytes = max_response_bytes
        self._max_rows_bytes = max_rows_bytes

    def _table(self, req: Any, *, views: bool = True) -> AsyncTable:
        if not req.table_name:
            if views and (req.authorized_view_name or getattr(req, "materialized_view_name", "")):
                raise Unimplemented("authorized and materialized views are not supported")
            raise InvalidArgument("request has no table_name")
        name: str = req.table_name
        table = self._tables.get(name)
        if table is None:
            if len(self._tables) >= _TABLE_CACHE:
                self._tables.clear()
            table = self._tables[name] = self._client.table(self._ns.table(parse_table_name(name)))
        return table

    def _now(self) -> int:
        return server_timestamp(self._clock.time())

    def _encoder(self) -> ChunkEncoder:
        return ChunkEncoder(
            max_value_chunk=self._max_value_chunk,
            max_response_bytes=self._max_response_bytes,
            max_rows_bytes=self._max_rows_bytes,
        )

    async def read_one_row(self, req: Any) -> list[Any] | None:
        """A ReadRows naming one row key and no range (what clients' ``read_row`` sends),
        served as the unary point read -- no stream to the tablet server, none of a scan's
        setup here: its responses (none if the row has no matching cells; one unless the row
        is larger than a response), or None if ``req`` is not such a read (:meth:`read_rows`
        serves it, checks included). The tablet server reads a large row through a stream by
        itself."""
        rows = req.rows
        if (
            len(rows.row_keys) != 1
            or rows.row_ranges
            or req.rows_limit < 0
            or req.request_stats_view == _REQUEST_STATS_FULL
        ):
            return None
        key: bytes = rows.row_keys[0]
        if not key:
            return None
        table = self._table(req)
        row_filter = filter_from_pb(req.filter) if req.HasField("filter") else None
        row = await table.read_row(key, filter=row_filter)
        if row is None:
            return []
        whole = whole_row_response(row, self._max_value_chunk, self._max_response_bytes)
        if whole is not None:
            return [whole]
        encoder = self._encoder()
        out = list(encoder.add(row))
        last = encoder.flush()
        if last is not None:
            out.append(last)
        return out

    async def read_rows(self, req: Any) -> AsyncIterator[Any]:
        point = await self.read_one_row(req)
        if point is not None:
            for resp in point:
                yield resp
            return
        table = self._table(req)
        if req.rows_limit < 0:
            raise InvalidArgument(f"rows_limit must be >= 0, got {req.rows_limit}")
        rows = row_set_from_pb(req.HasField("rows"), req.rows)
        row_filter = filter_from_pb(req.filter) if req.HasField("filter") else None
        if rows.is_empty():
            return
        encoder = self._encoder()
        limit = req.rows_limit or None
        full_stats = req.request_stats_view == _REQUEST_STATS_FULL
        if row_filter is None and not full_stats:
            # Nothing is filtered out and no stats are asked for: the plain, fastest path.
            async for row in table.read_rows(
                row_set=rows, filter=None, limit=limit, reverse=req.reversed
            ):
                for resp in encoder.add(row):
                    yield resp
            last = encoder.flush()
            if last is not None:
                yield last
            return
        started = stopwatch()
        returned = _Returned()
        items = table.read_rows_with_stats(
            row_set=rows, filter=row_filter, limit=limit, reverse=req.reversed
        )
        async for resp in _with_progress(items, encoder, returned):
            yield resp
        if full_stats:
            yield _stats_response(returned, stopwatch() - started)

    async def sample_row_keys(self, req: Any) -> AsyncIterator[Any]:
        samples = await self._table(req).sample_row_keys()
        # The API's last sample is the empty key: "the end of the table".
        if not samples or samples[-1][0] != b"":
            samples.append((b"", samples[-1][1] if samples else 0))
        for key, offset in samples:
            yield _SampleRowKeysResponse(row_key=key, offset_bytes=offset)

    async def mutate_row(self, req: Any) -> Any:
        table = self._table(req)
        check_row_key(req.row_key)
        await table.mutate_row(req.row_key, mutations_from_pb(req.mutations, self._now()))
        return _MutateRowResponse()

    async def mutate_rows(self, req: Any) -> AsyncIterator[Any]:
        table = self._table(req)
        if not req.entries:
            raise InvalidArgument("MutateRows needs at least one entry")
        total = sum(len(e.mutations) for e in req.entries)
        if total > MAX_MUTATIONS_PER_REQUEST:
            raise InvalidArgument(
                f"MutateRows has {total} mutations; the limit is {MAX_MUTATIONS_PER_REQUEST}"
            )
        now = self._now()
        statuses: list[tuple[int, str]] = [(_OK, "")] * len(req.entries)
        batch: list[RowMutation] = []
        positions: list[int] = []  # batch index -> request index
        for i, entry in enumerate(req.entries):
            try:
                batch.append(RowMutation(entry.row_key, mutations_from_pb(entry.mutations, now)))
                positions.append(i)
            except TabletStoreError as exc:
                statuses[i] = (status_code(exc).value[0], str(exc))
        if batch:
            try:
                await table.mutate_rows(batch)
            except MutationsFailed as exc:
                for f in exc.failures:
                    statuses[positions[f.index]] = (status_code(f.error).value[0], str(f.error))
        if not any(code for code, _ in statuses):
            yield _all_ok(len(statuses))
            return
        resp = _MutateRowsResponse()
        add = resp.entries.add
        for i, (code, message) in enumerate(statuses):
            if code == _OK:
                add(index=i).status.SetInParent()  # OK: an empty Status (code 0)
            else:
                add(index=i, status=status_pb2.Status(code=code, message=message))
        yield resp

    async def check_and_mutate_row(self, req: Any) -> Any:
        table = self._table(req)
        check_row_key(req.row_key)
        predicate = (
            filter_from_pb(req.predicate_filter) if req.HasField("predicate_filter") else None
        )
        now = self._now()
        true_muts: tuple[Mutation, ...] = ()
        false_muts: tuple[Mutation, ...] = ()
        if req.true_mutations:
            true_muts = mutations_from_pb(req.true_mutations, now)
        if req.false_mutations:
            false_muts = mutations_from_pb(req.false_mutations, now)
        if not true_muts and not false_muts:
            # Nothing to apply: the answer is just whether the predicate matches now.
            matched = await table.read_row(req.row_key, filter=predicate) is not None
        else:
            matched = await table.check_and_mutate_row(
                req.row_key, predicate, true_mutations=true_muts, false_mutations=false_muts
            )
        return _CheckAndMutateRowResponse(predicate_matched=matched)

    async def read_modify_write_row(self, req: Any) -> Any:
        table = self._table(req)
        check_row_key(req.row_key)
        row = await table.read_modify_write_row(req.row_key, rmw_rules_from_pb(req.rules))
        return _ReadModifyWriteRowResponse(row=row_to_pb(row))

    async def generate_initial_change_stream_partitions(self, req: Any) -> AsyncIterator[Any]:
        """The table's change-stream partitions now (``client/change_stream.py``)."""
        for p in await self._table(req, views=False).change_partitions():
            yield change_streams.partition_response(p)

    async def read_change_stream(self, req: Any) -> AsyncIterator[Any]:
        """One partition's changes, heartbeats and its close (``bigtable_api/change_streams.py``
        says how they map)."""
        table = self._table(req, views=False)
        partition = change_streams.partition_from_pb(req.HasField("partition"), req.partition)
        if partition is None:
            raise InvalidArgument("ReadChangeStream needs a partition")
        # start_time and continuation_tokens are one oneof: a request has one or neither.
        tokens = [t.token for t in req.continuation_tokens.tokens]
        start = change_streams.seconds_of(req.HasField("start_time"), req.start_time)
        end = change_streams.seconds_of(req.HasField("end_time"), req.end_time)
        beat = change_streams.seconds_of(req.HasField("heartbeat_duration"), req.heartbeat_duration)
        watermark = 0.0
        async for item in table.read_changes(
            partition,
            tokens=tokens,
            start_time=start,
            end_time=end,
            heartbeat=beat if beat else 2.0,
        ):
            if isinstance(item, Change):
                yield change_streams.change_response(item, watermark)
            elif isinstance(item, Heartbeat):
                watermark = item.watermark
                yield change_streams.heartbeat_response(item, partition)
            else:
                yield change_streams.close_response(item)

    async def ping_and_warm(self, req: Any) -> Any:
        parse_instance_name(req.name)
        return _PingAndWarmResponse()


@functools.lru_cache(maxsize=16)
def _all_ok(entries: int) -> bytes:
    """The serialized MutateRows response of ``entries`` entries that all succeeded (the same
    bytes for every request of that many: clients send batches of a few sizes)."""
    resp = _MutateRowsResponse()
    add = resp.entries.add
    for i in range(entries):
        add(index=i).status.SetInParent()  # OK: an empty Status (code 0)
    data: bytes = resp.SerializeToString()
    return data


class _Returned:
    """What a ReadRows call sent and what its scan saw (for ``request_stats``)."""

    __slots__ = ("cells", "cells_seen", "rows", "rows_seen")

    def __init__(self) -> None:
        self.rows = self.cells = self.rows_seen = self.cells_seen = 0


async def _with_progress(
    items: AsyncIterator[Row | ScanProgress], encoder: ChunkEncoder, returned: _Returned
) -> AsyncIterator[Any]:
    """The responses of a read with scan progress: each row's chunks, and a
    ``last_scanned_row_key`` response whenever the scan got past the last key sent (a filter
    dropped the rows in between), so a client cut off resumes from there."""
    last_key = b""  # in a reversed read, progress has no last_scanned: none is sent
    async for item in items:
        if type(item) is ScanProgress:
            returned.rows_seen, returned.cells_seen = item.rows_seen, item.cells_seen
            if item.last_scanned > last_key:
                last_key = item.last_scanned
                rows = encoder.flush()  # the rows before the scanned key go out first
                if rows is not None:
                    yield rows
                yield _ReadRowsResponse(last_scanned_row_key=item.last_scanned)
            continue
        row = cast(Row, item)
        returned.rows += 1
        returned.cells += len(row.cells)
        if row.key > last_key:
            last_key = row.key
        for resp in encoder.add(row):
            yield resp
    rows = encoder.flush()
    if rows is not None:
        yield rows


def _stats_response(returned: _Returned, seconds: float) -> Any:
    """The last response of a read asking for ``REQUEST_STATS_FULL``."""
    resp = _ReadRowsResponse()
    view = resp.request_stats.full_read_stats_view
    it = view.read_iteration_stats
    it.rows_seen_count = returned.rows_seen
    it.rows_returned_count = returned.rows
    it.cells_seen_count = returned.cells_seen
    it.cells_returned_count = returned.cells
    view.request_latency_stats.frontend_server_latency.FromNanoseconds(int(seconds * 1e9))
    return resp


# -- gRPC wiring -------------------------------------------------------------------------------
def _abort_args(exc: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, TabletStoreError):
        # Name tables as the client does: without their instance's prefix.
        return status_code(exc), PREFIX_IN_TEXT.sub("", str(exc)) or type(exc).__name__
    _log.exception("bigtable-api: %s failed unexpectedly", method)
    return grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}: {exc}"


def _unary(method: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await fn(request)
        except Exception as exc:  # every failure becomes a status; the server stays up
            code, message = _abort_args(exc, method)
        return refuse(context, code, message)

    return handle


def _streaming(method: str, fn: Callable[[Any], AsyncIterator[Any]]) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            async for item in fn(request):
                yield item
            return
        except Exception as exc:  # every failure becomes a status; the server stays up
            code, message = _abort_args(exc, method)
        refuse(context, code, message)

    return handle


def _streaming_as_unary(
    method: str,
    fn: Callable[[Any], AsyncIterator[Any]],
    serialize: Callable[[Any], bytes],
    shortcut: Callable[[Any], Awaitable[list[Any] | None]] | None = None,
) -> Any:
    """A server-streaming method served by a unary-unary handler: every response but the last
    is written as it comes, and the last one is returned, so gRPC sends it together with the
    call's status in one batch (a streamed handler sends the status in a batch of its own: one
    more round trip through grpc.aio's completion queue, about a quarter of a one-response
    call's server CPU). On the wire this is the same stream: gRPC does not tell a client how
    a method is registered. A call with no response sends one empty message (a ReadRows
    response with no chunks, a MutateRows response with no entries), which clients skip.

    ``shortcut`` answers the requests it can without an async generator: all their responses
    at once (ReadRows of one row: :meth:`BigtableData.read_one_row`), or None for ``fn``."""

    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if shortcut is not None:
            try:
                answer = await shortcut(request)
            except Exception as exc:  # every failure becomes a status; the server stays up
                code, message = _abort_args(exc, method)
                return refuse(context, code, message)
            if answer is not None:
                if not answer:
                    return _EMPTY_RESPONSE
                for item in answer[:-1]:
                    await context.write(serialize(item))
                return answer[-1]
        items = aiter(fn(request))
        last: Any = None
        while True:
            try:
                item = await anext(items)
            except StopAsyncIteration:
                return last if last is not None else _EMPTY_RESPONSE
            except Exception as exc:  # every failure becomes a status; the server stays up
                code, message = _abort_args(exc, method)
                break
            if last is not None:
                # A unary context has no serializer of its own: it writes bytes as given. Its
                # errors (the client went away) are gRPC's to handle, as for a streamed one.
                await context.write(serialize(last))
            last = item
        return refuse(context, code, message)

    return handle


#: The last "response" of a server-streaming call that produced none (serialized: empty).
_EMPTY_RESPONSE = b""


def _unimplemented(service: str, method: str) -> Any:
    async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        return refuse(
            context,
            grpc.StatusCode.UNIMPLEMENTED,
            f"tabletstore does not implement {service}.{method}",
        )

    # No deserializer: the request stays raw bytes, so any message is accepted.
    return grpc.unary_unary_rpc_method_handler(handle)


def _pb(cls: Any) -> Any:
    return cls.pb()


def _bytes_or(serialize: Callable[[Any], bytes]) -> Callable[[Any], bytes]:
    """A response serializer that sends ``bytes`` as they are (already serialized)."""

    def serializer(message: Any) -> bytes:
        return message if type(message) is bytes else serialize(message)

    return serializer


def generic_handlers(
    data: BigtableData,
    admin: TableAdmin,
    instances: InstanceAdmin | None = None,
    *,
    streams_as_unary: bool = False,
) -> list[grpc.GenericRpcHandler]:
    """The three services' handlers, registered by method path.

    ``streams_as_unary`` registers the server-streaming data methods (ReadRows, SampleRowKeys,
    MutateRows) as unary-unary handlers that write all but their last response and return
    that one with the status (:func:`_streaming_as_unary`): the same stream on the wire, one
    round trip fewer inside the server. Interceptors that wrap ``handler.unary_stream`` need
    it False."""
    uu, us = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler

    def unary(name: str, fn: Any, req: Any, resp: Any) -> Any:
        return uu(
            _unary(name, fn),
            request_deserializer=_pb(req).FromString,
            response_serializer=_pb(resp).SerializeToString,
        )

    def stream(name: str, fn: Any, req: Any, resp: Any, shortcut: Any = None) -> Any:
        # Streams may yield responses already serialized (ReadRows' packed rows): bytes go
        # out as they are.
        serialize = _bytes_or(_pb(resp).SerializeToString)
        if streams_as_unary:
            return uu(
                _streaming_as_unary(name, fn, serialize, shortcut),
                request_deserializer=_pb(req).FromString,
                response_serializer=serialize,
            )
        return us(
            _streaming(name, fn),
            request_deserializer=_pb(req).FromString,
            response_serializer=serialize,
        )

    def empty(name: str, fn: Any, req: Any) -> Any:
        return uu(
            _unary(name, fn),
            request_deserializer=_pb(req).FromString,
            response_serializer=empty_pb2.Empty.SerializeToString,
        )

    data_methods = {
        "ReadRows": stream(
            "ReadRows",
            data.read_rows,
            bt.ReadRowsRequest,
            bt.ReadRowsResponse,
            shortcut=data.read_one_row,
        ),
        "SampleRowKeys": stream(
            "SampleRowKeys",
            data.sample_row_keys,
            bt.SampleRowKeysRequest,
            bt.SampleRowKeysResponse,
        ),
        "MutateRow": unary("MutateRow", data.mutate_row, bt.MutateRowRequest, bt.MutateRowResponse),
        "MutateRows": stream(
            "MutateRows", data.mutate_rows, bt.MutateRowsRequest, bt.MutateRowsResponse
        ),
        "CheckAndMutateRow": unary(
            "CheckAndMutateRow",
            data.check_and_mutate_row,
            bt.CheckAndMutateRowRequest,
            bt.CheckAndMutateRowResponse,
        ),
        "ReadModifyWriteRow": unary(
            "ReadModifyWriteRow",
            data.read_modify_write_row,
            bt.ReadModifyWriteRowRequest,
            bt.ReadModifyWriteRowResponse,
        ),
        "PingAndWarm": unary(
            "PingAndWarm", data.ping_and_warm, bt.PingAndWarmRequest, bt.PingAndWarmResponse
        ),
        "GenerateInitialChangeStreamPartitions": stream(
            "GenerateInitialChangeStreamPartitions",
            data.generate_initial_change_stream_partitions,
            bt.GenerateInitialChangeStreamPartitionsRequest,
            bt.GenerateInitialChangeStreamPartitionsResponse,
        ),
        "ReadChangeStream": stream(
            "ReadChangeStream",
            data.read_change_stream,
            bt.ReadChangeStreamRequest,
            bt.ReadChangeStreamResponse,
        ),
    }
    data_methods.update({m: _unimplemented(DATA_SERVICE, m) for m in UNIMPLEMENTED_DATA})
    from google.cloud.bigtable_admin_v2.types import table as admin_table

    admin_methods = {
        "CreateTable": unary(
            "CreateTable", admin.create_table, bta.CreateTableRequest, admin_table.Table
        ),
        "GetTable": unary("GetTable", admin.get_table, bta.GetTableRequest, admin_table.Table),
        "ListTables": unary(
            "ListTables", admin.list_tables, bta.ListTablesRequest, bta.ListTablesResponse
        ),
        "DeleteTable": empty("DeleteTable", admin.delete_table, bta.DeleteTableRequest),
        "ModifyColumnFamilies": unary(
            "ModifyColumnFamilies",
            admin.modify_column_families,
            bta.ModifyColumnFamiliesRequest,
            admin_table.Table,
        ),
        "DropRowRange": empty("DropRowRange", admin.drop_row_range, bta.DropRowRangeRequest),
        "GenerateConsistencyToken": unary(
            "GenerateConsistencyToken",
            admin.generate_consistency_token,
            bta.GenerateConsistencyTokenRequest,
            bta.GenerateConsistencyTokenResponse,
        ),
        "CheckConsistency": unary(
            "CheckConsistency",
            admin.check_consistency,
            bta.CheckConsistencyRequest,
            bta.CheckConsistencyResponse,
        ),
    }
    admin_methods.update(_backup_methods(admin, unary, empty))
    admin_methods.update({m: _unimplemented(ADMIN_SERVICE, m) for m in UNIMPLEMENTED_ADMIN})
    handlers = [
        grpc.method_handlers_generic_handler(DATA_SERVICE, data_methods),
        grpc.method_handlers_generic_handler(ADMIN_SERVICE, admin_methods),
    ]
    handlers.append(_metrics_sink())
    if instances is not None:
        handlers.append(
            grpc.method_handlers_generic_handler(
                INSTANCE_ADMIN_SERVICE, _instance_methods(instances, unary, empty)
            )
        )
    return handlers


#: Google's clients outside emulator mode (e.g. over TLS) export their built-in metrics to
#: the endpoint they use; the front door takes them and drops them.
METRICS_SERVICE = "google.monitoring.v3.MetricService"


def _metrics_sink() -> grpc.GenericRpcHandler:
    async def drop(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return b""  # an empty message: google.protobuf.Empty

    sink = grpc.unary_unary_rpc_method_handler(drop)
    return grpc.method_handlers_generic_handler(
        METRICS_SERVICE, {"CreateServiceTimeSeries": sink, "CreateTimeSeries": sink}
    )


class _Operation:  # unary() takes proto-plus classes; Operation is a plain protobuf
    @staticmethod
    def pb() -> Any:
        from google.longrunning import operations_pb2

        return operations_pb2.Operation


def _backup_methods(admin: TableAdmin, unary: Any, empty: Any) -> dict[str, Any]:
    from google.cloud.bigtable_admin_v2.types import table as admin_table

    b = admin.backups
    return {
        "CreateBackup": unary("CreateBackup", b.create_backup, bta.CreateBackupRequest, _Operation),
        "GetBackup": unary("GetBackup", b.get_backup, bta.GetBackupRequest, admin_table.Backup),
        "ListBackups": unary(
            "ListBackups", b.list_backups, bta.ListBackupsRequest, bta.ListBackupsResponse
        ),
        "UpdateBackup": unary(
            "UpdateBackup", b.update_backup, bta.UpdateBackupRequest, admin_table.Backup
        ),
        "DeleteBackup": empty("DeleteBackup", b.delete_backup, bta.DeleteBackupRequest),
        "RestoreTable": unary("RestoreTable", b.restore_table, bta.RestoreTableRequest, _Operation),
        "CopyBackup": unary("CopyBackup", b.copy_backup, bta.CopyBackupRequest, _Operation),
    }


def _instance_methods(instances: InstanceAdmin, unary: Any, empty: Any) -> dict[str, Any]:
    from google.cloud.bigtable_admin_v2.types import bigtable_instance_admin as bia
    from google.cloud.bigtable_admin_v2.types import instance as inst

    methods = {
        "CreateInstance": unary(
            "CreateInstance", instances.create_instance, bia.CreateInstanceRequest, _Operation
        ),
        "GetInstance": unary(
            "GetInstance", instances.get_instance, bia.GetInstanceRequest, inst.Instance
        ),
        "ListInstances": unary(
            "ListInstances",
            instances.list_instances,
            bia.ListInstancesRequest,
            bia.ListInstancesResponse,
        ),
        "UpdateInstance": unary(
            "UpdateInstance", instances.update_instance, inst.Instance, inst.Instance
        ),
        "PartialUpdateInstance": unary(
            "PartialUpdateInstance",
            instances.partial_update_instance,
            bia.PartialUpdateInstanceRequest,
            _Operation,
        ),
        "DeleteInstance": empty(
            "DeleteInstance", instances.delete_instance, bia.DeleteInstanceRequest
        ),
        "GetCluster": unary(
            "GetCluster", instances.get_cluster, bia.GetClusterRequest, inst.Cluster
        ),
        "ListClusters": unary(
            "ListClusters",
            instances.list_clusters,
            bia.ListClustersRequest,
            bia.ListClustersResponse,
        ),
    }
    methods.update(
        {m: _unimplemented(INSTANCE_ADMIN_SERVICE, m) for m in UNIMPLEMENTED_INSTANCE_ADMIN}
    )
    return methods


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The front door's TLS certificate chain and private key (PEM files)."""

    cert: str
    key: str

    def credentials(self) -> grpc.ServerCredentials:
        """Server credentials; InvalidArgument naming the file that cannot be used."""
        pems = []
        for what, path in (("certificate", self.cert), ("private key", self.key)):
            try:
                with open(path, "rb") as f:
                    data = f.read()
            except OSError as exc:
                raise InvalidArgument(f"cannot read the TLS {what} {path!r}: {exc}") from None
            if b"-----BEGIN " not in data:
                raise InvalidArgument(f"the TLS {what} {path!r} is not a PEM file")
            pems.append(data)
        cert, key = pems
        if b"PRIVATE KEY-----" not in key:
            raise InvalidArgument(f"the TLS private key {self.key!r} holds no private key")
        return grpc.ssl_server_credentials([(key, cert)])


class BigtableApiServer:
    """A grpc.aio server serving the Bigtable API over ``client`` on ``host:port``.

    ``port`` 0 picks a free port; :attr:`port` tells which after :meth:`start`. A message
    larger than ``max_message_bytes`` (default :data:`MAX_MESSAGE_BYTES`) either way is refused
    by gRPC with RESOURCE_EXHAUSTED, a request before it is buffered.
    ReadRows packs whole small rows into one response up to ``max_rows_bytes`` (0: one
    response per row, as Google's emulator sends them; :mod:`tabletstore.bigtable_api.chunks`).
    ``tls`` serves TLS instead of plaintext (clients then connect with TLS and trust the
    certificate, instead of ``BIGTABLE_EMULATOR_HOST``). ``plain_instance`` is the instance
    id whose tables are the database's own, unprefixed
    tables (:mod:`tabletstore.bigtable_api.instances`). ``interceptors`` are grpc.aio server
    interceptors, run around every call (tests use one
    to cut ReadRows streams in the middle). ``tokens``: bearer tokens are checked on each
    call's metadata before its request is read (:mod:`tabletstore.bigtable_api.token_check`);
    a token's good answer serves its calls for ``token_recheck`` seconds of ``clock``'s
    monotonic time, the longest a revoked or expired token goes on working.
    ``max_concurrent_calls``: authenticated calls served at once (more: RESOURCE_EXHAUSTED);
    ``streams_per_connection``: calls one connection carries at once (a client queues more).
    ``tarpit``: where refusals of unauthenticated calls wait their turn (default: one of
    :data:`TARPIT_RATE` a second, :data:`TARPIT_BURST`, :data:`TARPIT_CAPACITY`; ``tarpit.py``).
    ``max_inflight_bytes``: the request bytes all calls in flight may hold, each caller (token
    principal) at most half; a call that finds no room within ``budget_wait`` seconds is
    RESOURCE_EXHAUSTED before its message is read (:mod:`tabletstore.bigtable_api.request_budget`;
    :attr:`budget` has its figures). Both bound this server only: processes sharing a port
    (``share_port``) each have their own.
    ``share_port``: bind with SO_REUSEPORT, so that several processes of this user serve one
    port and the kernel spreads new connections over them. Off by default: with it any
    process of the same user could bind the port too and take a share of the connections.
    """

    def __init__(
        self,
        client: AsyncClient,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
        max_value_chunk: int = DEFAULT_MAX_VALUE_CHUNK,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        max_rows_bytes: int = DEFAULT_MAX_ROWS_BYTES,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
        plain_instance: str | None = None,
        tls: TlsFiles | TlsConfig | None = None,
        tokens: TokenVerifier | None = None,
        token_recheck: float = TOKEN_RECHECK,
        max_concurrent_calls: int = FRONT_DOOR_MAX_CONCURRENT_CALLS,
        max_inflight_bytes: int = FRONT_DOOR_INFLIGHT_BYTES,
        budget_wait: float = 10.0,
        share_port: bool = False,
        streams_per_connection: int = STREAMS_PER_CONNECTION,
        tarpit: Tarpit | None = None,
    ) -> None:
        if max_message_bytes < DEFAULT_MAX_RESPONSE_BYTES:
            raise InvalidArgument(
                f"max_message_bytes must be at least {DEFAULT_MAX_RESPONSE_BYTES} (one ReadRows "
                f"response), got {max_message_bytes}"
            )
        if tokens is not None and tls is None:
            raise InvalidArgument("bearer tokens travel only over TLS: give --tls-cert/--tls-key")
        if max_concurrent_calls < 1:
            raise InvalidArgument(
                f"max_concurrent_calls must be at least 1, got {max_concurrent_calls}"
            )
        self.max_message_bytes = max_message_bytes
        self.max_concurrent_calls = max_concurrent_calls
        self.streams_per_connection = streams_per_connection
        self.tarpit = tarpit or Tarpit(TARPIT_RATE, TARPIT_BURST, TARPIT_CAPACITY)
        self.share_port = share_port
        self.host = host
        self.port = port
        self.tls = tls
        self.tokens = tokens
        self.budget = RequestBudget(max_inflight_bytes, max_message_bytes, wait=budget_wait)
        #: Admitted calls in flight, against max_concurrent_calls, and their request bytes.
        self.admission = BudgetAdmission(self.budget, max_concurrent_calls)
        self._user_interceptors = bool(interceptors)
        # First the token (a refused call is charged nothing and takes no place), then the
        # budget.
        first: grpc.aio.ServerInterceptor = (
            BudgetInterceptor(self.admission)
            if tokens is None
            else BearerTokens(
                RememberedTokens(tokens, recheck=token_recheck, clock=clock),
                self.admission,
                self.tarpit,
            )
        )
        self._interceptors = (first, *interceptors)
        self._tls: grpc.ServerCredentials | None = None
        if isinstance(tls, TlsFiles):
            self._tls = tls.credentials()
        elif tls is not None:
            self._tls = server_credentials(tls)
        namespaces = Namespaces(plain_instance)
        self.data = BigtableData(
            client,
            clock=clock,
            max_value_chunk=max_value_chunk,
            max_response_bytes=max_response_bytes,
            max_rows_bytes=max_rows_bytes,
            namespaces=namespaces,
        )
        self.instances = InstanceAdmin(client, namespaces, clock=clock)
        self.admin = TableAdmin(client, namespaces, self.instances)
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        """``host:port``: the value for ``BIGTABLE_EMULATOR_HOST``."""
        return f"{self.host}:{self.port}"

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        # No maximum_concurrent_rpcs: gRPC would count refusals waiting in the tarpit too; the
        # admission counts admitted calls only (request_budget.BudgetAdmission).
        server = grpc.aio.server(
            interceptors=self._interceptors,
            options=[
                ("grpc.max_concurrent_streams", self.streams_per_connection),
                # A stream's window stays at HTTP/2's 64 KiB: with bandwidth probing gRPC grows
                # it to the size of the messages (MiBs), which a refused call held in the
                # tarpit would then hold unread (tarpit.py). Large uploads over long round
                # trips are slower for it; on a LAN the difference is within noise.
                ("grpc.http2.bdp_probe", 0),
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", self.max_message_bytes),
                ("grpc.so_reuseport", 1 if self.share_port else 0),
                # No channelz bookkeeping on every call: nothing here serves channelz (a
                # do-nothing server's call cost 5-10% less without it).
                ("grpc.enable_channelz", 0),
            ],
        )
        # Interceptors given by the caller may wrap the streaming methods' unary_stream
        # behaviour (tests cut ReadRows streams so): only without them are the streams served
        # by unary handlers (generic_handlers). BearerTokens takes either kind.
        server.add_generic_rpc_handlers(
            generic_handlers(
                self.data, self.admin, self.instances, streams_as_unary=not self._user_interceptors
            )
        )
        address = f"{self.host}:{self.port}"
        port: int = (
            server.add_insecure_port(address)
            if self._tls is None
            else server.add_secure_port(address, self._tls)
        )
        if port == 0:
            raise InvalidArgument(f"cannot listen on {self.host}:{self.port}")
        await server.start()
        self._server, self.port = server, port
        return port

    async def stop(self, grace: float | None = 1.0) -> None:
        """Stop accepting calls; calls in flight get ``grace`` seconds to finish."""
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def wait_for_termination(self) -> None:
        if self._server is not None:
            await self._server.wait_for_termination()


async def open_client(url: str | None) -> AsyncClient:
    """The database at ``url`` (see :func:`tabletstore.embedded.connect_async`)."""
    # Imported here: embedded pulls in the whole serving stack, which only the runner needs.
    from tabletstore.embedded import connect_async

    return await connect_async(url)


class BackgroundServer:
    """The front door over ``tabletstore``'s database at ``url``, run on its own thread and
    event loop, for synchronous programs and tests. Use as a context manager or call
    :meth:`start` / :meth:`stop`."""

    def __init__(self, url: str | None, *, host: str = "127.0.0.1", port: int = 0, **kw: Any):
        self.url = url
        self.host = host
        self.port = port
        self._kw = kw
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="bigtable-api", daemon=True)

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout: float = 60.0) -> BackgroundServer:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError(f"bigtable-api did not start within {timeout}s")
        if self._error is not None:
            raise self._error
        return self

    def stop(self, timeout: float = 60.0) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); the thread ends either way
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        client = await open_client(self.url)
        try:
            server = BigtableApiServer(client, host=self.host, port=self.port, **self._kw)
            self.port = await server.start()
            self._ready.set()
            try:
                await self._stopping.wait()
            finally:
                await server.stop()
        finally:
            await client.close()
