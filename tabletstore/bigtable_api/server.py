"""The Cloud Bigtable API front door: a gRPC server that official Bigtable clients talk to (§3).

``google.bigtable.v2.Bigtable`` (ReadRows, SampleRowKeys, MutateRow, MutateRows,
CheckAndMutateRow, ReadModifyWriteRow, PingAndWarm) and the table half of
``google.bigtable.admin.v2.BigtableTableAdmin`` (:mod:`tabletstore.bigtable_api.admin`) are
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
import logging
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as bta
from google.cloud.bigtable_v2.types import bigtable as bt
from google.protobuf import empty_pb2
from google.rpc import status_pb2

from tabletstore.bigtable_api.admin import TableAdmin
from tabletstore.bigtable_api.auth import BearerTokens, server_credentials
from tabletstore.bigtable_api.chunks import (
    DEFAULT_MAX_RESPONSE_BYTES,
    DEFAULT_MAX_VALUE_CHUNK,
    ChunkEncoder,
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
from tabletstore.client.client import AsyncClient, AsyncTable, MutationsFailed
from tabletstore.clock import Clock, SystemClock
from tabletstore.data.model import Mutation, RowMutation
from tabletstore.data.validation import MAX_MUTATIONS_PER_ROW, check_row_key
from tabletstore.errors import InvalidArgument, TabletStoreError, Unimplemented
from tabletstore.rpc.auth import TokenVerifier
from tabletstore.security import TlsConfig

__all__ = [
    "ADMIN_SERVICE",
    "DATA_SERVICE",
    "BackgroundServer",
    "BigtableApiServer",
    "BigtableData",
    "generic_handlers",
    "open_client",
]

DATA_SERVICE = "google.bigtable.v2.Bigtable"
ADMIN_SERVICE = "google.bigtable.admin.v2.BigtableTableAdmin"
#: Methods of the two services tabletstore does not implement (answered UNIMPLEMENTED).
UNIMPLEMENTED_DATA = (
    "ExecuteQuery",
    "PrepareQuery",
    "ReadChangeStream",
    "GenerateInitialChangeStreamPartitions",
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
    "CreateBackup",
    "GetBackup",
    "UpdateBackup",
    "DeleteBackup",
    "ListBackups",
    "RestoreTable",
    "CopyBackup",
    "GetIamPolicy",
    "SetIamPolicy",
    "TestIamPermissions",
    "CreateSchemaBundle",
    "UpdateSchemaBundle",
    "GetSchemaBundle",
    "ListSchemaBundles",
    "DeleteSchemaBundle",
)
#: Bigtable's limit on mutations in one MutateRows request, over all entries.
MAX_MUTATIONS_PER_REQUEST = MAX_MUTATIONS_PER_ROW
#: Largest message either way: requests of several row mutations (each at most
#: ``model.MAX_MUTATION_BYTES``, checked per entry); ReadRows responses stay near
#: ``DEFAULT_MAX_RESPONSE_BYTES`` whatever the row's size (chunks.py).
MAX_MESSAGE_BYTES = 256 * 1024 * 1024

_log = logging.getLogger(__name__)

_MutateRowResponse: Any = bt.MutateRowResponse.pb()
_MutateRowsResponse: Any = bt.MutateRowsResponse.pb()
_CheckAndMutateRowResponse: Any = bt.CheckAndMutateRowResponse.pb()
_ReadModifyWriteRowResponse: Any = bt.ReadModifyWriteRowResponse.pb()
_SampleRowKeysResponse: Any = bt.SampleRowKeysResponse.pb()
_PingAndWarmResponse: Any = bt.PingAndWarmResponse.pb()
_OK = grpc.StatusCode.OK.value[0]


class BigtableData:
    """The data RPCs; each takes a raw request message and returns (or yields) responses."""

    def __init__(
        self,
        client: AsyncClient,
        *,
        clock: Clock | None = None,
        max_value_chunk: int = DEFAULT_MAX_VALUE_CHUNK,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ) -> None:
        self._client = client
        self._clock = clock or SystemClock()
        self._max_value_chunk = max_value_chunk
        self._max_response_bytes = max_response_bytes

    def _table(self, req: Any, *, views: bool = True) -> AsyncTable:
        if not req.table_name:
            if views and (req.authorized_view_name or getattr(req, "materialized_view_name", "")):
                raise Unimplemented("authorized and materialized views are not supported")
            raise InvalidArgument("request has no table_name")
        return self._client.table(parse_table_name(req.table_name).table)

    def _now(self) -> int:
        return server_timestamp(self._clock.time())

    async def read_rows(self, req: Any) -> AsyncIterator[Any]:
        table = self._table(req)
        if req.reversed:
            raise Unimplemented("reversed scans are not supported")
        if req.rows_limit < 0:
            raise InvalidArgument(f"rows_limit must be >= 0, got {req.rows_limit}")
        rows = row_set_from_pb(req.HasField("rows"), req.rows)
        row_filter = filter_from_pb(req.filter) if req.HasField("filter") else None
        if rows.is_empty():
            return
        encoder = ChunkEncoder(
            max_value_chunk=self._max_value_chunk, max_response_bytes=self._max_response_bytes
        )
        async for row in table.read_rows(
            row_set=rows, filter=row_filter, limit=req.rows_limit or None
        ):
            for resp in encoder.add(row):
                yield resp
        last = encoder.flush()
        if last is not None:
            yield last

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
        resp = _MutateRowsResponse()
        for i, (code, message) in enumerate(statuses):
            resp.entries.add(index=i, status=status_pb2.Status(code=code, message=message))
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

    async def ping_and_warm(self, req: Any) -> Any:
        parse_instance_name(req.name)
        return _PingAndWarmResponse()


# -- gRPC wiring -------------------------------------------------------------------------------
def _abort_args(exc: BaseException, method: str) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, TabletStoreError):
        return status_code(exc), str(exc) or type(exc).__name__
    _log.exception("bigtable-api: %s failed unexpectedly", method)
    return grpc.StatusCode.INTERNAL, f"internal error in {method}: {type(exc).__name__}: {exc}"


def _unary(method: str, fn: Callable[[Any], Awaitable[Any]]) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            return await fn(request)
        except Exception as exc:  # every failure becomes a status; the server stays up
            code, message = _abort_args(exc, method)
        await context.abort(code, message)

    return handle


def _streaming(method: str, fn: Callable[[Any], AsyncIterator[Any]]) -> Any:
    async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            async for item in fn(request):
                yield item
            return
        except Exception as exc:  # every failure becomes a status; the server stays up
            code, message = _abort_args(exc, method)
        await context.abort(code, message)

    return handle


def _unimplemented(service: str, method: str) -> Any:
    async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(
            grpc.StatusCode.UNIMPLEMENTED, f"tabletstore does not implement {service}.{method}"
        )

    # No deserializer: the request stays raw bytes, so any message is accepted.
    return grpc.unary_unary_rpc_method_handler(handle)


def _pb(cls: Any) -> Any:
    return cls.pb()


def generic_handlers(data: BigtableData, admin: TableAdmin) -> list[grpc.GenericRpcHandler]:
    """The two services' handlers, registered by method path."""
    uu, us = grpc.unary_unary_rpc_method_handler, grpc.unary_stream_rpc_method_handler

    def unary(name: str, fn: Any, req: Any, resp: Any) -> Any:
        return uu(
            _unary(name, fn),
            request_deserializer=_pb(req).FromString,
            response_serializer=_pb(resp).SerializeToString,
        )

    def stream(name: str, fn: Any, req: Any, resp: Any) -> Any:
        return us(
            _streaming(name, fn),
            request_deserializer=_pb(req).FromString,
            response_serializer=_pb(resp).SerializeToString,
        )

    def empty(name: str, fn: Any, req: Any) -> Any:
        return uu(
            _unary(name, fn),
            request_deserializer=_pb(req).FromString,
            response_serializer=empty_pb2.Empty.SerializeToString,
        )

    data_methods = {
        "ReadRows": stream("ReadRows", data.read_rows, bt.ReadRowsRequest, bt.ReadRowsResponse),
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
    admin_methods.update({m: _unimplemented(ADMIN_SERVICE, m) for m in UNIMPLEMENTED_ADMIN})
    return [
        grpc.method_handlers_generic_handler(DATA_SERVICE, data_methods),
        grpc.method_handlers_generic_handler(ADMIN_SERVICE, admin_methods),
    ]


class BigtableApiServer:
    """A grpc.aio server serving the Bigtable API over ``client`` on ``host:port``.

    ``port`` 0 picks a free port; :attr:`port` tells which after :meth:`start`.
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
        tls: TlsConfig | None = None,
        tokens: TokenVerifier | None = None,
    ) -> None:
        if tokens is not None and tls is None:
            raise InvalidArgument("bearer tokens travel only over TLS: give --tls-cert/--tls-key")
        self.host = host
        self.port = port
        self.tls = tls
        self.tokens = tokens
        self.data = BigtableData(
            client,
            clock=clock,
            max_value_chunk=max_value_chunk,
            max_response_bytes=max_response_bytes,
        )
        self.admin = TableAdmin(client)
        self._server: grpc.aio.Server | None = None

    @property
    def address(self) -> str:
        """``host:port``: the value for ``BIGTABLE_EMULATOR_HOST``."""
        return f"{self.host}:{self.port}"

    async def start(self) -> int:
        """Bind and start serving; returns the bound port."""
        server = grpc.aio.server(
            interceptors=[BearerTokens(self.tokens)] if self.tokens is not None else None,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.so_reuseport", 0),
            ]
        )
        server.add_generic_rpc_handlers(generic_handlers(self.data, self.admin))
        where = f"{self.host}:{self.port}"
        port: int = (
            server.add_secure_port(where, server_credentials(self.tls))
            if self.tls is not None
            else server.add_insecure_port(where)
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
