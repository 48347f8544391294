"""The RPC face of a tablet server: one object serving ``rpc.services.TabletService``.

As HBase's ``RSRpcServices`` stands beside ``HRegionServer``, the request handlers stand
beside the server's lifecycle (``worker/tablet_server.py``): the data requests are
:class:`~tabletstore.worker.data_service.DataService`'s, the control requests
:class:`~tabletstore.worker.admin_service.AdminService`'s, and :class:`TabletRpcServices` is
both, so that ``TABLET.handlers(server.services)`` builds the one dispatch table every
transport serves (in-process or TCP, wrapped by ``worker/tablet_service_guard.py`` and
``ops.metrics``). Each handler is a method of one of the two, bound once: serving a request
adds no call between the transport and the handler.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tabletstore.worker.admin_service import AdminService
from tabletstore.worker.data_service import DataService

if TYPE_CHECKING:
    from tabletstore.worker.tablet_server import TabletServer

__all__ = ["TabletRpcServices"]


class TabletRpcServices(DataService, AdminService):
    """``TabletService`` for one tablet server: its data and admin services together."""

    def __init__(self, server: TabletServer) -> None:
        DataService.__init__(self, server)
        AdminService.__init__(self, server)
