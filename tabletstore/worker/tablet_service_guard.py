"""Authorization on a tablet server: per-family ACLs against the proven principal, control
RPCs for the cluster only, METADATA cut to what each caller may know (paper §2 "access
control", §5.1, §5.3).

:func:`guard` wraps a worker's dispatch table (``TABLET.handlers``). On a server with auth on,
each request runs with the principal the RPC layer proved (``rpc.auth.current_principal``):

- Data requests (reads and writes) run as the principal: their ``identity`` field is replaced
  by the principal's name before the tablet checks the families' ACLs (``data.validation``: a
  write to a family the principal may not write is refused, a read returns only the families
  it may read). Only a delegating principal (``Principal.may_delegate``: role ``function``,
  the front door) may name another identity there, acting for its caller; a worker or master
  certificate naming another identity is refused (PermissionDenied), and a client's is
  replaced by its own name.
- Writes to the METADATA table come only from cluster identities.
- Reads of METADATA by any other principal (clients locating tablets, §5.1) answer only what
  that principal may know (``security.table_visibility``): the METADATA tablets' rows and the
  rows of tables it has some right on, each cut to routing (range, location, epoch:
  ``metadata.rows.routing_only``) unless it may see the table's keys; the rows of other tables
  are left out. Such reads take no filter and no progress reports (a filter over the records'
  bytes would be an oracle on what the cut hides). Which tables a principal may know is read
  from the catalog (:class:`TableSchemas`: at most every 2 s, and at once for a table id not
  seen yet).
- Control requests (load, unload, compact, adopting a compaction run elsewhere, schema
  reloads, snapshot hold and write, bulk-load pieces) come only from cluster identities; ``server_status`` from anyone authenticated.

A refusal is PermissionDenied naming the principal, the table and the permission, and is
counted (``denied(method, permission)``; ``ops.metrics`` permission_denied_total). Without auth
(no principal: the embedded database, a loopback test cluster) everything passes unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from tabletstore.clock import monotonic
from tabletstore.data.model import Row
from tabletstore.errors import ErrorCode, PermissionDenied
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.rows import METADATA_TABLE_ID, routing_only, row_table_id
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import (
    LargeRow,
    MutateRowsResponse,
    MutateTabletsRequest,
    PointReadsResponse,
    RowBatch,
    RowPiece,
)
from tabletstore.rpc.row_pieces import STREAM_ITEM_BYTES, RowAssembler, row_bytes, split_row
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Handler
from tabletstore.security import table_visibility
from tabletstore.security.principal import Principal
from tabletstore.security.table_visibility import TableLike

if TYPE_CHECKING:
    from tabletstore.engine.tablet import Tablet

__all__ = ["CONTROL_METHODS", "DATA_METHODS", "TableSchemas", "guard", "may_see_keys"]


def _names(*fns: Callable[..., Any]) -> frozenset[str]:
    return frozenset(TABLET.method(fn).name for fn in fns)


_WRITES = _names(
    TabletService.mutate_rows,
    TabletService.mutate_tablets,
    TabletService.check_and_mutate,
    TabletService.read_modify_write,
)
#: Requests carrying a caller's ``identity``, checked against the families' ACLs.
DATA_METHODS = _WRITES | _names(
    TabletService.read_rows, TabletService.read_row, TabletService.read_points
)
#: Requests only the cluster's own identities may send.
CONTROL_METHODS = _names(
    TabletService.load_tablet,
    TabletService.load_tablet_at,
    TabletService.unload_tablet,
    TabletService.compact_tablet,
    TabletService.adopt_compaction,
    TabletService.update_schema,
    TabletService.snapshot_hold,
    TabletService.snapshot_write,
    TabletService.bulk_load_tablet,
)

Denied = Callable[[str, str], None]


_READ_ROWS = TABLET.method(TabletService.read_rows).name
_READ_ROW = TABLET.method(TabletService.read_row).name
_READ_POINTS = TABLET.method(TabletService.read_points).name


def may_see_keys(principal: Principal | None, tablet: Tablet) -> bool:
    """Whether ``principal`` may see ``tablet``'s row keys (its sample keys, its boundaries):
    no auth, a cluster identity, one that administers its table or may read some family of it
    (``security.table_visibility``). Row keys are data."""
    return table_visibility.may_see_keys(principal, tablet.schema)


class TableSchemas:
    """Every table's schema by table id, for deciding what a principal may know of METADATA:
    read through ``read`` at most every ``ttl`` seconds, and sooner when asked for a table id
    it does not know (a table made since) -- but not more often than every ``min_interval``
    seconds, so rows of tables that no longer exist cannot make every request read the
    catalog; concurrent requests share one read. A changed ACL takes effect on METADATA reads
    within ``ttl``."""

    def __init__(
        self,
        read: Callable[[], Awaitable[Mapping[str, TableLike]]],
        *,
        ttl: float = 2.0,
        min_interval: float = 0.2,
        clock: Callable[[], float] = monotonic,
    ) -> None:
        self._read = read
        self._ttl = ttl
        self._min_interval = min_interval
        self._clock = clock
        self._schemas: Mapping[str, TableLike] = {}
        self._read_at: float | None = None
        self._reading: asyncio.Future[None] | None = None

    @classmethod
    def of(cls, catalog: Catalog) -> TableSchemas:
        """The schemas of ``catalog``'s tables."""

        async def read() -> Mapping[str, TableLike]:
            return {info.table_id: info.schema for info in await catalog.list_tables()}

        return cls(read)

    async def get(self, table_id: str) -> TableLike | None:
        """The table's schema, or None if there is no such table."""
        age = None if self._read_at is None else self._clock() - self._read_at
        if (
            age is None
            or age >= self._ttl
            or (table_id not in self._schemas and age >= self._min_interval)
        ):
            await self._refresh()
        return self._schemas.get(table_id)

    async def _refresh(self) -> None:
        """One read of the catalog, shared by every request that needs it meanwhile (a
        request cancelled while waiting leaves the read to the others)."""
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._read_now())
            self._reading.add_done_callback(self._read_done)
        await asyncio.shield(self._reading)

    async def _read_now(self) -> None:
        started = self._clock()
        self._schemas = await self._read()
        self._read_at = started

    def _read_done(self, reading: asyncio.Future[None]) -> None:
        self._reading = None
        if not reading.cancelled():
            reading.exception()  # retrieved: each waiter has it raised already


async def _visible_metadata(
    rows: Sequence[Row], principal: Principal, tables: TableSchemas | None
) -> list[Row]:
    """The METADATA ``rows`` ``principal`` (not a cluster identity) may know, each cut to
    routing unless it may see the table's keys (module docstring)."""
    out = []
    for row in rows:
        table_id = row_table_id(row.key)
        schema = None
        if table_id is not None and table_id != METADATA_TABLE_ID and tables is not None:
            schema = await tables.get(table_id)
        if table_id == METADATA_TABLE_ID or (
            schema is not None and table_visibility.may_know_table(principal, schema)
        ):
            if schema is not None and table_visibility.may_see_keys(principal, schema):
                out.append(row)
                continue
            cut = routing_only(row)
            if cut is not None:
                out.append(cut)
    return out


def _stream_items(rows: Sequence[Row]) -> Iterator[RowBatch | RowPiece]:
    """``rows`` as stream items again: small rows in one batch, a row past one item's bound
    alone in pieces (rpc.row_pieces), in order."""
    batch: list[Row] = []
    for row in rows:
        if row_bytes(row) <= STREAM_ITEM_BYTES:
            batch.append(row)
            continue
        if batch:
            yield RowBatch(tuple(batch))
            batch = []
        yield from split_row(row)
    if batch:
        yield RowBatch(tuple(batch))


def _reads_metadata(method: str, request: Any) -> bool:
    if method in (_READ_ROWS, _READ_ROW):
        return bool(request.table_id == METADATA_TABLE_ID)
    if method == _READ_POINTS:
        return any(part.table_id == METADATA_TABLE_ID for part in request.parts)
    return False


def _check_metadata_read(method: str, request: Any, principal: Principal) -> None:
    if getattr(request, "filter", None) is not None or getattr(request, "stats", False):
        raise PermissionDenied(
            f"{principal.name} may not call {method} on table METADATA with a filter or "
            "progress reports: only the cluster's own identities may (permission: cluster)"
        )


async def _metadata_reply(
    method: str, request: Any, response: Any, principal: Principal, tables: TableSchemas | None
) -> Any:
    """A unary read's reply with its METADATA rows cut for ``principal``."""
    if method == _READ_POINTS:
        assert isinstance(response, PointReadsResponse)
        answers = []
        for part, answer in zip(request.parts, response.answers, strict=True):
            if part.table_id == METADATA_TABLE_ID:
                answer = await _metadata_answer(answer, principal, tables)
            answers.append(answer)
        return PointReadsResponse(tuple(answers))
    return await _metadata_answer(response, principal, tables)


async def _metadata_answer(answer: Any, principal: Principal, tables: TableSchemas | None) -> Any:
    if isinstance(answer, RowBatch):
        return RowBatch(tuple(await _visible_metadata(answer.rows, principal, tables)))
    if isinstance(answer, LargeRow):
        # A METADATA row this large is read by streaming it: decide on its key alone.
        table_id = row_table_id(answer.key)
        if table_id == METADATA_TABLE_ID:
            return answer
        schema = await tables.get(table_id) if tables is not None and table_id else None
        if schema is not None and table_visibility.may_know_table(principal, schema):
            return answer
        return RowBatch(())
    return answer  # an EntryError


def _no_count(method: str, permission: str) -> None:
    return None


def authorize(method: str, request: Any, principal: Principal | None, where: str) -> Any:
    """The request to serve as ``principal`` (its identity replaced), or PermissionDenied."""
    if principal is None:
        return request
    if method in CONTROL_METHODS and not principal.is_cluster:
        table = getattr(request, "table_id", None) or getattr(request, "table_name", "-")
        raise PermissionDenied(
            f"{principal.name} may not call {method} on {where} (table {table}): control "
            "requests are for the cluster's own identities (permission: cluster)"
        )
    if method not in DATA_METHODS:
        return request
    if method in _WRITES and _writes_metadata(request) and not principal.is_cluster:
        raise PermissionDenied(
            f"{principal.name} may not write table METADATA (permission: write; only the "
            "cluster's own identities write it)"
        )
    if request.identity == principal.name:
        return request
    if principal.may_delegate and request.identity is not None:
        return request  # the front door acting for its caller (module docstring)
    if principal.is_cluster and request.identity is not None:
        raise PermissionDenied(
            f"{principal} may not make requests on behalf of {request.identity!r}: only the "
            "delegating roles (function) may (permission: delegate)"
        )
    return dataclasses.replace(request, identity=principal.name)


def _writes_metadata(request: Any) -> bool:
    """Whether a write request (one tablet's, or ``mutate_tablets``' parts) writes METADATA."""
    if isinstance(request, MutateTabletsRequest):
        return any(part.table_id == METADATA_TABLE_ID for part in request.parts)
    return bool(request.table_id == METADATA_TABLE_ID)


def _count_entries(method: str, response: Any, denied: Denied) -> None:
    if isinstance(response, MutateRowsResponse):
        for error in response.errors:
            if error.code == ErrorCode.PERMISSION_DENIED:
                denied(method, "write")


def guard(
    handlers: Mapping[str, Handler],
    *,
    where: str = "this worker",
    denied: Denied = _no_count,
    tables: TableSchemas | None = None,
) -> dict[str, Handler]:
    """``handlers`` with authorization in front (module docstring). ``tables``: the schemas
    METADATA reads are decided by (without it, a principal other than the cluster's reads
    only the METADATA tablets' own rows)."""
    return {name: _guarded(name, fn, where, denied, tables) for name, fn in handlers.items()}


def _permission(method: str) -> str:
    if method in CONTROL_METHODS:
        return "cluster"
    return "write" if method in _WRITES else "read"


def _restricted(method: str, request: Any, principal: Principal | None) -> Principal | None:
    """The principal whose METADATA read this is, if it must be cut (else None)."""
    if principal is None or principal.is_cluster or not _reads_metadata(method, request):
        return None
    _check_metadata_read(method, request, principal)
    return principal


def _guarded(
    method: str, fn: Handler, where: str, denied: Denied, tables: TableSchemas | None
) -> Handler:
    permission = _permission(method)
    if inspect.isasyncgenfunction(fn):
        stream_fn: Callable[[Any], AsyncIterator[Any]] = fn  # type: ignore[assignment]

        async def stream(request: Any) -> AsyncIterator[Any]:
            principal = current_principal()
            try:
                request = authorize(method, request, principal, where)
                cut = _restricted(method, request, principal)
            except PermissionDenied:
                denied(method, permission)
                raise
            async with contextlib.aclosing(stream_fn(request)) as items:  # type: ignore[type-var]
                if cut is None:
                    async for item in items:
                        yield item
                    return
                assembler = RowAssembler(where)
                async for item in items:
                    rows = await _visible_metadata(assembler.rows(item), cut, tables)
                    for out in _stream_items(rows):
                        yield out
                assembler.finish()

        return stream

    unary_fn: Callable[[Any], Any] = fn

    async def unary(request: Any) -> Any:
        principal = current_principal()
        try:
            request = authorize(method, request, principal, where)
            cut = _restricted(method, request, principal)
            response = await unary_fn(request)
        except PermissionDenied:
            denied(method, permission)
            raise
        _count_entries(method, response, denied)
        if cut is not None:
            response = await _metadata_reply(method, request, response, cut, tables)
        return response

    return unary
