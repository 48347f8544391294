"""The in-process transport: the embedded default's "network" (DESIGN.md §8).

The client library talks to workers through a :class:`Transport`; in the embedded default the
worker lives in the same process and a call is a direct method call on it, with no
serialization. The TCP transport (``tabletstore.rpc.tcp``) has the same shape, so the client,
master and worker code paths are the same in both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from tabletstore.errors import NotServing, Unavailable

__all__ = ["InProcessTransport", "Transport"]


class Transport(Protocol):
    """How a client reaches the worker at an address."""

    async def call(self, address: str, method: str, request: Any) -> Any:
        """One request, one response. Unavailable if the address does not answer."""
        ...

    def stream(self, address: str, method: str, request: Any) -> AsyncIterator[Any]:
        """One request, a stream of responses."""
        ...

    async def close(self) -> None: ...


class InProcessTransport:
    """Addresses name services registered in this process."""

    def __init__(self) -> None:
        self._services: dict[str, Any] = {}

    def register(self, address: str, service: Any) -> None:
        self._services[address] = service

    def unregister(self, address: str) -> None:
        self._services.pop(address, None)

    def _service(self, address: str, method: str) -> Any:
        service = self._services.get(address)
        if service is None:
            raise NotServing(f"no worker at {address} (it may have stopped)")
        fn = getattr(service, method, None)
        if fn is None or method.startswith("_"):
            raise Unavailable(f"worker at {address} has no method {method!r}")
        return fn

    async def call(self, address: str, method: str, request: Any) -> Any:
        return await self._service(address, method)(request)

    async def stream(self, address: str, method: str, request: Any) -> AsyncIterator[Any]:
        async for item in self._service(address, method)(request):
            yield item

    async def close(self) -> None:
        self._services.clear()
