"""The in-process transport: the embedded default's "network" (DESIGN.md §8).

The client library talks to workers through a :class:`~tabletstore.rpc.transport.Transport`;
in the embedded default the worker lives in the same process and a call is a direct call of
its handler, with no serialization. An address names a dispatch table registered here
(``services.TABLET.handlers(worker.services)``, possibly wrapped by ``ops.metrics``): the same
table the TCP server serves, so the client, master and worker code paths are the same in both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine
from typing import Any

from tabletstore.rpc.transport import Handlers, Method, Transport, call_handler, stream_handler

__all__ = ["InProcessTransport", "Transport"]


class InProcessTransport:
    """Addresses name dispatch tables registered in this process. ``timeout`` is the default
    bound of each call (None: unbounded; the Transport contract's errors otherwise)."""

    def __init__(self, *, timeout: float | None = None) -> None:
        self._services: dict[str, Handlers] = {}
        self._timeout = timeout

    def register(self, address: str, handlers: Handlers) -> None:
        self._services[address] = handlers

    def unregister(self, address: str) -> None:
        self._services.pop(address, None)

    def call(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> Coroutine[Any, Any, Any]:
        return call_handler(
            self._services.get(address),
            address,
            method,
            request,
            self._timeout if timeout is None else timeout,
        )

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        return stream_handler(
            self._services.get(address),
            address,
            method,
            request,
            self._timeout if timeout is None else timeout,
        )

    async def close(self) -> None:
        self._services.clear()
