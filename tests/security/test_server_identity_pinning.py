"""A server certificate of the wrong role, or for another host, taken for a worker or master.

The attack: a process holding any certificate of a cluster role -- the front door's
``function`` certificate, say -- listens where clients expect a worker (or the master). Clients
only checked that the server's certificate named a cluster role, so they sent it their reads,
writes and tokens. Now a client dialling the tablet service accepts only a ``worker``
certificate, the master's service only a ``master`` one, and where a certificate names hosts
of its own (issued with ``--host``) the host dialled must be one of them. Bounded: a handful of
calls on loopback.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tabletstore.errors import PermissionDenied
from tabletstore.rpc.auth import ClientAuth, ServerAuth
from tabletstore.rpc.messages import (
    ListTablesRequest,
    ListTablesResponse,
    ServerStatusRequest,
    ServerStatusResponse,
)
from tabletstore.rpc.services import MASTER, TABLET, MasterService, TabletService
from tabletstore.rpc.tcp import RpcServer, TcpTransport
from tabletstore.rpc.wire import register_all
from tabletstore.security import TlsConfig
from tests.security.transport_support import Certs

pytestmark = pytest.mark.timeout(120)

register_all()
STATUS = TABLET.method(TabletService.server_status)
LIST = MASTER.method(MasterService.list_tables)


async def _server_status(request: ServerStatusRequest) -> ServerStatusResponse:
    return ServerStatusResponse(worker_id="impostor", address="", tablets=())


async def _list_tables(request: ListTablesRequest) -> ListTablesResponse:
    return ListTablesResponse(tables=())


@contextlib.asynccontextmanager
async def _serving(tls: TlsConfig, host: str = "127.0.0.1") -> AsyncIterator[str]:
    handlers = {STATUS.name: _server_status, LIST.name: _list_tables}
    async with RpcServer(handlers, host=host, auth=ServerAuth(tls)) as server:  # type: ignore[arg-type]
        yield server.address


async def _calls(certs: Certs, address: str) -> dict[str, str]:
    """What a client with a certificate of its own gets calling each service at ``address``."""
    transport = TcpTransport(timeout=10, auth=ClientAuth(certs.tls("u1")))
    said = {}
    try:
        for method, request in ((STATUS, ServerStatusRequest()), (LIST, ListTablesRequest())):
            try:
                await transport.call(address, method, request)
                said[method.service] = "served"
            except PermissionDenied as exc:
                said[method.service] = f"refused: {exc}"
    finally:
        await transport.close()
    return said


async def test_a_function_certificate_is_taken_for_no_server(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    async with _serving(certs.tls("frontdoor", "function")) as address:
        said = await _calls(certs, address)
    assert said["TabletService"].startswith("refused") and "function" in said["TabletService"]
    assert said["MasterService"].startswith("refused")


async def test_each_service_takes_only_its_own_role(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    async with _serving(certs.tls("w1", "worker")) as address:
        said = await _calls(certs, address)
    assert said["TabletService"] == "served"
    assert said["MasterService"].startswith("refused") and "master" in said["MasterService"]
    async with _serving(certs.tls("m1", "master")) as address:
        said = await _calls(certs, address)
    assert said["MasterService"] == "served"
    assert said["TabletService"].startswith("refused")


async def test_a_certificate_for_another_host_is_refused(tmp_path: Path) -> None:
    certs = Certs(tmp_path)
    async with _serving(certs.tls("w2", "worker", hosts=("10.9.8.7",)), "127.0.0.2") as address:
        said = await _calls(certs, address)
    assert said["TabletService"].startswith("refused") and "10.9.8.7" in said["TabletService"]
    async with _serving(certs.tls("w3", "worker", hosts=("127.0.0.2",)), "127.0.0.2") as address:
        said = await _calls(certs, address)
    assert said["TabletService"] == "served"
