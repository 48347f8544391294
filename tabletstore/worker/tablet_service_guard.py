"""Authorization on a tablet server: per-family ACLs against the proven principal, control
RPCs for the cluster only (paper §2 "access control", §5.3; issue 16 item 2).

:func:`guard` wraps a worker's dispatch table (``TABLET.handlers``). On a server with auth on,
each request runs with the principal the RPC layer proved (``rpc.auth.current_principal``):

- Data requests (reads and writes) have their ``identity`` field replaced by the principal's
  name before the tablet checks the families' ACLs (``data.validation``: a write to a family
  the principal may not write is refused, a read returns only the families it may read). A
  cluster identity (worker, master, function) may act for a named identity: its ``identity``
  is kept (a front door or a function forwarding a user's request).
- Writes to the METADATA table come only from cluster identities.
- Control requests (load, unload, compact, adopting a compaction run elsewhere, schema
  reloads, snapshot hold and write, bulk-load pieces) come only from cluster identities; ``server_status`` from anyone authenticated.

A refusal is PermissionDenied naming the principal, the table and the permission, and is
counted (``denied(method, permission)``; ``ops.metrics`` permission_denied_total). Without auth
(no principal: the embedded database, a loopback test cluster) everything passes unchanged.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from typing import TYPE_CHECKING, Any

from tabletstore.errors import ErrorCode, PermissionDenied
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.rpc.auth import current_principal
from tabletstore.rpc.messages import MutateRowsResponse, MutateTabletsRequest
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Handler
from tabletstore.security.principal import Principal

if TYPE_CHECKING:
    from tabletstore.engine.tablet import Tablet

__all__ = ["CONTROL_METHODS", "DATA_METHODS", "guard", "may_see_keys"]


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
    TabletService.unload_tablet,
    TabletService.compact_tablet,
    TabletService.adopt_compaction,
    TabletService.update_schema,
    TabletService.snapshot_hold,
    TabletService.snapshot_write,
    TabletService.bulk_load_tablet,
)

Denied = Callable[[str, str], None]


def may_see_keys(principal: Principal | None, tablet: Tablet) -> bool:
    """Whether ``principal`` may see ``tablet``'s row keys (its sample keys, its boundaries):
    no auth, a cluster identity, or one that may read some family of its table. Row keys are
    data."""
    return principal is None or principal.is_cluster or tablet.may_read_some(principal.name)


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
    if principal.is_cluster and request.identity is not None:
        return request  # a cluster member acting for a user (module docstring)
    if request.identity == principal.name:
        return request
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
    handlers: Mapping[str, Handler], *, where: str = "this worker", denied: Denied = _no_count
) -> dict[str, Handler]:
    """``handlers`` with authorization in front (module docstring)."""
    return {name: _guarded(name, fn, where, denied) for name, fn in handlers.items()}


def _permission(method: str) -> str:
    if method in CONTROL_METHODS:
        return "cluster"
    return "write" if method in _WRITES else "read"


def _guarded(method: str, fn: Handler, where: str, denied: Denied) -> Handler:
    permission = _permission(method)
    if inspect.isasyncgenfunction(fn):
        stream_fn: Callable[[Any], AsyncIterator[Any]] = fn  # type: ignore[assignment]

        async def stream(request: Any) -> AsyncIterator[Any]:
            try:
                request = authorize(method, request, current_principal(), where)
            except PermissionDenied:
                denied(method, permission)
                raise
            async with contextlib.aclosing(stream_fn(request)) as items:  # type: ignore[type-var]
                async for item in items:
                    yield item

        return stream

    unary_fn: Callable[[Any], Any] = fn

    async def unary(request: Any) -> Any:
        try:
            request = authorize(method, request, current_principal(), where)
            response = await unary_fn(request)
        except PermissionDenied:
            denied(method, permission)
            raise
        _count_entries(method, response, denied)
        return response

    return unary
