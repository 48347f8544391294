"""The services, one typed Protocol each: the tablet server's and the master's (§5, §5.2).

Each method of a service is declared once, here, as a method of its Protocol: its name, its
request type and its response type (for a streaming method, an ``AsyncIterator`` of its item
type). Everything else is derived from that declaration by :class:`Service`:

- the :class:`~tabletstore.rpc.transport.Method` values a transport carries (the name is the
  wire's routing key), found with :meth:`Service.method` from the Protocol's own function
  (``TABLET.method(TabletService.load_tablet)``), never from a string;
- the server side's dispatch table, :meth:`Service.handlers` (an implementation's bound methods,
  checked against the Protocol: unary or streaming as declared), which the TCP server, the
  in-process transport and the metrics wrapper all take;
- the client side's typed stub, :meth:`Service.client`: an object of the Protocol's type whose
  methods send the request through a transport to one address, generated once per service.

Requests and responses are the dataclasses of ``rpc/messages.py`` (and ``data.model.Row``).
"""

from __future__ import annotations

import inspect
import typing
from collections.abc import AsyncIterator, Callable
from typing import Any, Generic, Protocol, TypeVar, cast

from tabletstore.data.model import Row
from tabletstore.errors import InvalidArgument
from tabletstore.rpc.messages import (
    AdoptCompactionRequest,
    BackupIdRequest,
    BackupInfoMessage,
    BulkLoadRequest,
    BulkLoadResponse,
    BulkLoadTabletRequest,
    BulkLoadTabletResponse,
    CheckAndMutateRequest,
    CheckAndMutateResponse,
    CloneTableRequest,
    CompactTableRequest,
    CompactTabletRequest,
    CreateBackupRequest,
    CreateSnapshotRequest,
    CreateTableRequest,
    DeleteSnapshotRequest,
    HistoryDefaultMessage,
    HistoryDefaultRequest,
    LargeRow,
    ListBackupsRequest,
    ListBackupsResponse,
    ListSnapshotsRequest,
    ListSnapshotsResponse,
    ListTablesRequest,
    ListTablesResponse,
    LoadTabletAtRequest,
    LoadTabletRequest,
    ModifyFamiliesRequest,
    MutateRowsRequest,
    MutateRowsResponse,
    MutateTabletsRequest,
    PointReadsRequest,
    PointReadsResponse,
    ReadModifyWriteRequest,
    ReadRowsRequest,
    RestoreTableRequest,
    RowBatch,
    RowPiece,
    SampleRowKeysRequest,
    SampleRowKeysResponse,
    ScanProgress,
    ServerStatusRequest,
    ServerStatusResponse,
    SetAdminsRequest,
    SetChangesRequest,
    SetHistoryRequest,
    SetReplicaRequest,
    SnapshotHoldRequest,
    SnapshotInfoMessage,
    SnapshotWriteRequest,
    SnapshotWriteResponse,
    TableInfoMessage,
    TableNameRequest,
    UnloadTabletRequest,
    UpdateBackupRequest,
    UpdateSchemaRequest,
)
from tabletstore.rpc.transport import Handler, Method, Transport
from tabletstore.rpc.versions import (
    LOAD_TABLET_AT_VERSION,
    RESTORE_COPIED_VERSION,
    SET_REPLICA_VERSION,
)

__all__ = ["MASTER", "TABLET", "MasterService", "Service", "TabletService"]

P = TypeVar("P")


class TabletService(Protocol):
    """What a tablet server (worker) serves: data requests for the tablets it holds, which
    name the tablet so that a worker no longer serving it answers ``NotServing`` (§5.1), and
    the master's assignment requests (§5.2)."""

    async def mutate_rows(self, req: MutateRowsRequest) -> MutateRowsResponse:
        """Each row mutation atomic on its own (§3 batches); failures reported per entry."""
        ...

    async def mutate_tablets(self, req: MutateTabletsRequest) -> MutateRowsResponse:
        """Row mutations of several tablets in one request (a cluster client's coalesced
        ``mutate_row`` calls); failures reported per entry, numbered across the parts."""
        ...

    def read_rows(self, req: ReadRowsRequest) -> AsyncIterator[RowBatch | RowPiece | ScanProgress]:
        """The rows, in key order, in items of bounded size (``rpc/row_pieces.py``); with
        ``ScanProgress`` items when ``req.stats``."""
        ...

    async def read_row(self, req: ReadRowsRequest) -> RowBatch | LargeRow:
        """A point read in one reply; ``LargeRow`` for a row too large for one."""
        ...

    async def read_points(self, req: PointReadsRequest) -> PointReadsResponse:
        """Plain point reads of several tablets in one reply (a cluster client's coalesced
        ``read_row`` calls); each part answered as ``read_row`` would, or with its own error."""
        ...

    async def check_and_mutate(self, req: CheckAndMutateRequest) -> CheckAndMutateResponse:
        """A single-row transaction (§2)."""
        ...

    async def read_modify_write(self, req: ReadModifyWriteRequest) -> Row:
        """Appends and increments of one row, atomically; returns the new values."""
        ...

    async def sample_row_keys(self, req: SampleRowKeysRequest) -> SampleRowKeysResponse: ...

    async def load_tablet(self, req: LoadTabletRequest) -> None:
        """Master to worker: claim and serve this tablet (§5.2)."""
        ...

    async def load_tablet_at(self, req: LoadTabletAtRequest) -> None:
        """``load_tablet``, naming the tablet's METADATA row too (protocol version 8: a
        caller falls back to ``load_tablet`` for an older worker)."""
        ...

    async def unload_tablet(self, req: UnloadTabletRequest) -> None:
        """Master to worker: stop serving this tablet (§5.2)."""
        ...

    async def compact_tablet(self, req: CompactTabletRequest) -> None: ...

    async def adopt_compaction(self, req: AdoptCompactionRequest) -> None:
        """Commit a major compaction of the tablet run elsewhere, or refuse it (§5.4)."""
        ...

    async def update_schema(self, req: UpdateSchemaRequest) -> None: ...

    async def server_status(self, req: ServerStatusRequest) -> ServerStatusResponse: ...

    async def snapshot_hold(self, req: SnapshotHoldRequest) -> None:
        """Master to worker: hold writes to these tablets and take their side of a
        snapshot's cut (master/snapshots.py: the first of two calls)."""
        ...

    async def snapshot_write(self, req: SnapshotWriteRequest) -> SnapshotWriteResponse:
        """Master to worker: end the hold; unless aborted, write the memtables' part of
        the cut and answer with the tablets' snapshot SSTables."""
        ...

    async def bulk_load_tablet(self, req: BulkLoadTabletRequest) -> BulkLoadTabletResponse:
        """Master to worker: add a bulk load's SSTable cells to one tablet (§8)."""
        ...


class MasterService(Protocol):
    """What the master serves: table administration (§5). The one implementation is
    ``master.Master``; the client's admin calls are this Protocol (the embedded database calls
    its Master directly, a cluster client through a stub to the elected master). Schemas
    travel as their JSON (``messages.CreateTableRequest.of`` and friends)."""

    async def create_table(self, req: CreateTableRequest) -> TableInfoMessage: ...

    async def delete_table(self, req: TableNameRequest) -> None: ...

    async def list_tables(self, req: ListTablesRequest) -> ListTablesResponse: ...

    async def get_table(self, req: TableNameRequest) -> TableInfoMessage: ...

    async def modify_families(self, req: ModifyFamiliesRequest) -> TableInfoMessage: ...

    async def compact_table(self, req: CompactTableRequest) -> None: ...

    async def set_admins(self, req: SetAdminsRequest) -> TableInfoMessage:
        """Replace who administers a table (``TableSchema.admins``;
        master/master_service_guard.py)."""
        ...

    async def create_snapshot(self, req: CreateSnapshotRequest) -> SnapshotInfoMessage:
        """A consistent cut of a table, readable straight from the bucket (§8)."""
        ...

    async def list_snapshots(self, req: ListSnapshotsRequest) -> ListSnapshotsResponse: ...

    async def delete_snapshot(self, req: DeleteSnapshotRequest) -> None: ...

    async def bulk_load(self, req: BulkLoadRequest) -> BulkLoadResponse:
        """Load SSTables written outside the cluster into a table (§8)."""
        ...

    async def create_backup(self, req: CreateBackupRequest) -> BackupInfoMessage:
        """A table's cut kept in the database's bucket for restores (master/backups.py)."""
        ...

    async def list_backups(self, req: ListBackupsRequest) -> ListBackupsResponse: ...

    async def get_backup(self, req: BackupIdRequest) -> BackupInfoMessage: ...

    async def update_backup(self, req: UpdateBackupRequest) -> BackupInfoMessage: ...

    async def delete_backup(self, req: BackupIdRequest) -> None: ...

    async def restore_table(self, req: RestoreTableRequest) -> TableInfoMessage:
        """A new table from a backup of the database's bucket, naming its SSTables."""
        ...

    async def restore_copied(self, req: RestoreTableRequest) -> TableInfoMessage:
        """``restore_table`` of a backup the client has just copied into the database's
        bucket, with what its copy verified (``req.copied``; protocol version 8)."""
        ...

    async def clone_table(self, req: CloneTableRequest) -> TableInfoMessage:
        """A new writable table sharing a table's SSTables as of now (zero-copy)."""
        ...

    async def set_history(self, req: SetHistoryRequest) -> TableInfoMessage:
        """Set a table's history window (master/checkpoints.py)."""
        ...

    async def history_default(self, req: HistoryDefaultRequest) -> HistoryDefaultMessage:
        """Read or set the database's default history window."""
        ...

    async def set_changes(self, req: SetChangesRequest) -> TableInfoMessage:
        """Set a table's change retention (client/change_stream.py)."""
        ...

    async def set_replica(self, req: SetReplicaRequest) -> TableInfoMessage:
        """Make a table a replica, or a primary again (client/replicator.py)."""
        ...


def _types_of(annotation: Any) -> tuple[type, ...]:
    """The classes a value of ``annotation`` (a class, a union of classes, None) may be."""
    if annotation is None or annotation is type(None):
        return (type(None),)
    args = typing.get_args(annotation)
    if args and typing.get_origin(annotation) in (typing.Union, type(int | None)):
        return tuple(t for a in args for t in _types_of(a))
    if isinstance(annotation, type):
        return (annotation,)
    raise InvalidArgument(f"an RPC response must be a class or a union of classes: {annotation!r}")


def _method(service: str, fn: Callable[..., Any]) -> Method:
    """The Method a Protocol function declares: one request parameter, a response type."""
    hints = typing.get_type_hints(fn)
    params = [p for p in inspect.signature(fn).parameters if p != "self"]
    if len(params) != 1 or params[0] not in hints or "return" not in hints:
        raise InvalidArgument(f"{service}.{fn.__name__} must take one typed request and be typed")
    response = hints["return"]
    streaming = not inspect.iscoroutinefunction(fn)
    if streaming:
        if typing.get_origin(response) is not AsyncIterator:
            raise InvalidArgument(f"{service}.{fn.__name__}: async def, or AsyncIterator[...]")
        (response,) = typing.get_args(response)
    return Method(
        service,
        fn.__name__,
        hints[params[0]],
        response,
        _types_of(response),
        streaming,
        since=_SINCE.get(fn, 0),
    )


class Service(Generic[P]):
    """A service as declared by its Protocol ``P`` (module docstring)."""

    def __init__(self, protocol: type) -> None:
        self.name = protocol.__name__
        self.protocol = protocol
        functions = [
            fn
            for name, fn in vars(protocol).items()
            if not name.startswith("_") and inspect.isfunction(fn)
        ]
        self._by_function: dict[Callable[..., Any], Method] = {
            fn: _method(self.name, fn) for fn in functions
        }
        #: Every method, in declaration order.
        self.methods: tuple[Method, ...] = tuple(self._by_function.values())
        self._stub = _stub_class(self)

    def method(self, fn: Callable[..., Any]) -> Method:
        """The Method of the Protocol's function ``fn`` (e.g. ``TabletService.load_tablet``)."""
        method = self._by_function.get(fn)
        if method is None:
            raise InvalidArgument(f"{fn!r} is not a method of {self.name}")
        return method

    def handlers(self, implementation: P) -> dict[str, Handler]:
        """The dispatch table serving ``implementation``: each method's bound method, checked
        to be a coroutine function (unary) or an async generator function (streaming) as the
        Protocol declares."""
        table: dict[str, Handler] = {}
        for method in self.methods:
            fn = getattr(implementation, method.name, None)
            kind_ok = (
                inspect.isasyncgenfunction(fn)
                if method.streaming
                else inspect.iscoroutinefunction(fn)
            )
            if fn is None or not kind_ok:
                kind = "an async generator" if method.streaming else "an async function"
                raise InvalidArgument(
                    f"{type(implementation).__name__}.{method.name} must be {kind} to serve "
                    f"{method!r}"
                )
            table[method.name] = fn
        return table

    def client(self, transport: Transport, address: str, *, timeout: float | None = None) -> P:
        """A stub of type ``P`` whose methods send their request through ``transport`` to
        ``address``, each call bounded by ``timeout`` (None: the transport's default)."""
        return cast(P, self._stub(transport, address, timeout))


def _stub_class(service: Service[Any]) -> type:
    """The stub class of ``service``: one method per Method, each returning the transport's
    awaitable (unary) or async iterator (streaming) directly, so a stub adds no frame."""

    def __init__(self: Any, transport: Transport, address: str, timeout: float | None) -> None:
        self._transport = transport
        self._address = address
        self._timeout = timeout

    namespace: dict[str, Any] = {
        "__slots__": ("_address", "_timeout", "_transport"),
        "__init__": __init__,
        "__repr__": lambda self: f"<{service.name} at {self._address}>",
        "__doc__": f"A {service.name} stub (rpc.services.Service.client).",
    }
    for method in service.methods:
        namespace[method.name] = _stub_method(method)
    return type(f"{service.name}Client", (), namespace)


def _stub_method(method: Method) -> Callable[..., Any]:
    if method.streaming:

        def stream(self: Any, request: Any) -> Any:
            return self._transport.stream(self._address, method, request, timeout=self._timeout)

        stream.__name__ = method.name
        return stream

    def call(self: Any, request: Any) -> Any:
        return self._transport.call(self._address, method, request, timeout=self._timeout)

    call.__name__ = method.name
    return call


#: The methods a protocol version added, and that version (``versions.require`` gates them):
#: a caller of one falls back to the method it replaces when its peer is older.
_SINCE: dict[Callable[..., Any], int] = {
    TabletService.load_tablet_at: LOAD_TABLET_AT_VERSION,
    MasterService.set_replica: SET_REPLICA_VERSION,
    MasterService.restore_copied: RESTORE_COPIED_VERSION,
}

#: The tablet server's service.
TABLET: Service[TabletService] = Service(TabletService)
#: The master's service.
MASTER: Service[MasterService] = Service(MasterService)
