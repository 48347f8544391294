"""Connecting to a cluster: ``etcd://host:port/<namespace>`` (§5.1, §5.2).

A cluster client reads from the coordinator the root tablet's location (the first level of
the tablet location hierarchy, ``client.location``; the other two are METADATA rows served by
workers) and the elected master's address (the master lock's value) for administration: its
admin API is a ``MasterService`` stub over :class:`ElectedMaster`. Data goes straight to
workers over TCP (``rpc.tcp.TcpTransport``); nothing but admin requests reaches the master.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

from tabletstore.client.client import AsyncClient
from tabletstore.client.location import LocationCache
from tabletstore.coordination import open_coordinator, paths
from tabletstore.coordination.base import Coordinator, KeyValue
from tabletstore.coordination.election import Election
from tabletstore.coordination.tokens import TokenStore
from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    TabletStoreError,
    Unavailable,
    Unimplemented,
)
from tabletstore.metadata.catalog import Catalog
from tabletstore.rpc.auth import ClientAuth
from tabletstore.rpc.services import MASTER, MasterService, TabletService
from tabletstore.rpc.tcp import TcpTransport
from tabletstore.rpc.transport import Method, Transport
from tabletstore.rpc.wire import register_all
from tabletstore.security import TlsConfig

__all__ = ["CALL_TIMEOUT", "ClusterClient", "ElectedMaster", "master_client"]

#: Seconds a client waits for one worker call (or one streamed item) before retrying.
CALL_TIMEOUT = 15.0


async def _first_leader(election: Election, wait: float) -> KeyValue | None:
    """The first leader ``election`` has within ``wait`` seconds (None if none by then)."""
    try:
        async with asyncio.timeout(wait), election.observe() as leaders:
            async for leader in leaders:
                if leader is not None:
                    return leader
    except TimeoutError:
        pass
    return None


class ElectedMaster:
    """A Transport to whichever master is elected (its address, the master lock's value, is
    looked up and replaces the one a call names): a call made while none is elected (a
    cluster starting, a master failing over) waits for the election, watching it, and a call
    refused by a master that stopped leading, or never sent, goes to the new one, until the
    deadline.

    A call that got no answer (Indeterminate: the master died with it in flight) is sent
    again too, because every MasterService method is safe to repeat: reads and compactions
    are idempotent, and each change is guarded by the catalog (a table created or deleted, a
    family created or dropped, is so once; a repeat fails AlreadyExists / NotFound /
    InvalidArgument). A repeat that fails after an attempt that got no answer is reported as
    Indeterminate, since the earlier attempt may be what made it fail."""

    def __init__(
        self, coordinator: Coordinator, transport: Transport, *, deadline: float = 30.0
    ) -> None:
        self._coord = coordinator
        self._transport = transport
        self._address: str | None = None
        self._deadline = deadline

    async def address(self, *, refresh: bool = False, wait: float = 0.0) -> str:
        """The elected master's address. With none elected, wait up to ``wait`` seconds."""
        if self._address is None or refresh:
            self._address = None
            election = self._coord.election(paths.MASTER_ELECTION)
            leader = await election.leader()
            if leader is None and wait > 0:
                leader = await _first_leader(election, wait)
            if leader is None:
                raise Unavailable(f"no master was elected in this cluster within {wait:g} s")
            self._address = leader.value.decode()
        return self._address

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (passed on: the Transport contract)
    ) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._deadline
        refresh = False
        ambiguous: Indeterminate | None = None
        for attempt in itertools.count():
            try:
                elected = await self.address(refresh=refresh, wait=deadline - loop.time())
                return await self._transport.call(elected, method, request, timeout=timeout)
            except Indeterminate as exc:  # safe to repeat (class docstring)
                ambiguous = exc
                if loop.time() >= deadline:
                    raise
            except TabletStoreError as exc:
                # Unavailable (NotServing and Unreachable included) applied nothing: retried.
                if isinstance(exc, Unavailable) and loop.time() < deadline:
                    pass
                elif ambiguous is not None:
                    raise Indeterminate(
                        f"{method!r} may have been applied by an attempt that got no answer "
                        f"({ambiguous}); sent again, it failed: {type(exc).__name__}: {exc}"
                    ) from exc
                else:
                    raise
            refresh = True
            await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
        raise AssertionError("unreachable")

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        raise Unimplemented(f"the master serves no streams ({method!r})")

    async def close(self) -> None:
        await self._transport.close()


def master_client(
    coordinator: Coordinator, transport: Transport, *, deadline: float = 30.0
) -> MasterService:
    """The client's view of the master: a MasterService stub to the elected master."""
    return MASTER.client(ElectedMaster(coordinator, transport, deadline=deadline), "elected")


async def _proven_identity(
    coordinator: Coordinator, tls: TlsConfig | None, token: str | None, identity: str | None
) -> str | None:
    """The name the servers will know us by: the certificate's, else the token's
    (PermissionDenied if the token is unknown or revoked). A cluster identity (a front door,
    a function) may act for ``identity`` (worker/tablet_service_guard.py)."""
    principal = tls.principal() if tls is not None else None
    if principal is not None and principal.is_cluster and identity is not None:
        return identity
    if principal is None and token is not None:
        principal = await TokenStore(coordinator).verify(token)
    return principal.name if principal is not None else None


class ClusterClient(AsyncClient):
    """An :class:`AsyncClient` connected to a cluster through its coordinator URL."""

    def __init__(
        self,
        url: str,
        coordinator: Coordinator,
        transport: TcpTransport,
        *,
        identity: str | None = None,
        authenticated: bool = False,
    ) -> None:
        locations = LocationCache(coordinator, transport)
        super().__init__(
            catalog=Catalog(coordinator, metadata=locations),
            transport=transport,
            admin=master_client(coordinator, transport),
            identity=identity,
            locations=locations,
            coalesce=True,  # every request crosses a socket: share them (client/coalesce.py)
        )
        self.url = url
        self.coordinator = coordinator
        self._authenticated = authenticated

    @classmethod
    async def open(
        cls,
        url: str,
        *,
        identity: str | None = None,
        tls: TlsConfig | None = None,
        token: str | None = None,
    ) -> ClusterClient:
        """Connect to the cluster at ``url``. On a cluster with auth on, ``tls`` (the cluster
        CA, and this client's certificate) and/or a bearer ``token`` prove who the client is;
        the servers then take the identity from them, and ``identity`` is ignored."""
        if token is not None and tls is None:
            raise InvalidArgument("a bearer token travels only over TLS: give tls (--tls-ca)")
        auth = ClientAuth(tls, token) if tls is not None else None
        register_all()
        coordinator = open_coordinator(url)
        try:
            await coordinator.check()
            if auth is not None:
                # What the servers will take us for: our own checks (ACLs) use the same name.
                identity = await _proven_identity(coordinator, tls, token, identity)
        except BaseException:
            await coordinator.close()
            raise
        # A call to a worker that stopped answering (paused, partitioned) gives up after this
        # long and is retried at the tablet's new location; its lease (seconds) moves the
        # tablet long before that.
        transport = TcpTransport(timeout=CALL_TIMEOUT, auth=auth)
        return cls(url, coordinator, transport, identity=identity, authenticated=auth is not None)

    def _staging_principal(self) -> str:
        # With auth on, the servers run our requests as the proven identity.
        if self._authenticated and self.identity is not None:
            return self.identity
        return super()._staging_principal()

    def tablet_server(self, address: str) -> TabletService:
        """A stub of the tablet server at ``address`` (what a serverless job that hands its
        work to a worker calls: ``master.remote_compaction``)."""
        return self._worker(address)

    async def close(self) -> None:
        await self._transport.close()
        await self.coordinator.close()

    async def __aenter__(self) -> ClusterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
