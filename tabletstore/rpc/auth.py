"""Who is calling: a connection's principal, proven by its certificate or a bearer token
(paper §5.3: authorization needs an identity the caller cannot forge).

A server with auth on (``RpcServer(auth=ServerAuth(...))``) speaks TLS only. When a
connection is up, its principal is:

- the name and role of the client's certificate (Common Name and Organizational Unit), when
  the client presented one the cluster CA signed (mutual TLS; ``security/tls.py``); else
- the principal of the bearer token in the connection's first frame, AUTH (frames.py), looked
  up by the server's :class:`TokenVerifier` (``coordination/tokens.py``); a bad token fails the
  connection with PermissionDenied;
- nothing otherwise: a request on a connection with neither fails the connection with
  PermissionDenied.

A token is checked again while its connection lives: the first request more than
``ServerAuth.token_recheck`` seconds (default 2) after the last check starts a new one in the
background, so ``tokens revoke`` ends a live connection's service within that bound plus one
etcd read (the check refuses the connection: later requests fail PermissionDenied). Requests
never wait on etcd while the last good check is younger than ``token_stale_limit`` (30 s);
past that, they wait for a check and fail Unavailable if the coordinator cannot answer.

Each request's handler runs with the connection's principal in a context variable
(:func:`current_principal`), which the servers' guards read
(``worker/tablet_service_guard.py``, ``master/master_service_guard.py``); never a field of the
request. A server without auth (the embedded database, a loopback test cluster) runs handlers
with no principal: everything is allowed, as before.

Delegation: a process serving other principals (the Cloud Bigtable front door, which proves
its callers by bearer token) sets :data:`ACTING_FOR` while it serves one caller. Its requests
to the master then travel as REQUEST_AS frames naming that caller (``rpc/frames.py``), and its
data requests carry the caller in their ``identity`` field (per request, so it survives the
client's coalescing of writes and point reads). The server accepts REQUEST_AS only from a
connection whose own principal may delegate (``Principal.may_delegate``) and then runs the
handler as :func:`delegated` principal: a plain ``client`` principal named by the caller,
authorized by the guards exactly as if it had connected itself; from any other principal the
request fails PermissionDenied.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Protocol

from tabletstore.errors import InvalidArgument, PermissionDenied
from tabletstore.security.principal import DELEGATING_ROLES, Principal
from tabletstore.security.tls import TlsConfig, principal_from_peercert

__all__ = [
    "ACTING_FOR",
    "ClientAuth",
    "Principal",
    "ServerAuth",
    "TokenVerifier",
    "current_principal",
    "delegated",
    "peer_principal",
    "principal_scope",
]

_PRINCIPAL: ContextVar[Principal | None] = ContextVar("tabletstore_principal", default=None)
#: The principal a front door acts for while it serves one caller's request (the Cloud Bigtable
#: API's bearer token, bigtable_api/front_door.py); None: the process's own identity.
ACTING_FOR: ContextVar[str | None] = ContextVar("tabletstore_acting_for", default=None)


def current_principal() -> Principal | None:
    """The proven principal of the request being handled; None on a server without auth."""
    return _PRINCIPAL.get()


def set_principal(principal: Principal | None) -> None:
    """Set the current request's principal (the RPC server does, in each request's task)."""
    _PRINCIPAL.set(principal)


@contextlib.contextmanager
def principal_scope(principal: Principal | None) -> Iterator[None]:
    """Run a block as ``principal`` (in-process callers and tests)."""
    token = _PRINCIPAL.set(principal)
    try:
        yield
    finally:
        _PRINCIPAL.reset(token)


class TokenVerifier(Protocol):
    """Turns a bearer token into its principal (``coordination.tokens.TokenStore``)."""

    async def verify(self, token: str) -> Principal:
        """The token's principal; PermissionDenied if unknown or revoked."""
        ...


@dataclass(frozen=True, slots=True)
class ServerAuth:
    """A server's authentication: its TLS files and, optionally, a token verifier (then a
    client may connect without a certificate and send a token instead)."""

    tls: TlsConfig
    tokens: TokenVerifier | None = None
    #: Seconds after which a token connection's next request checks its token again.
    token_recheck: float = 2.0
    #: Seconds a token's last good check holds while the coordinator cannot answer.
    token_stale_limit: float = 30.0
    _context: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not 0 < self.token_recheck <= self.token_stale_limit:
            raise InvalidArgument(
                f"need 0 < token_recheck <= token_stale_limit, got {self.token_recheck} and "
                f"{self.token_stale_limit}"
            )

    def ssl_context(self) -> ssl.SSLContext:
        if not self._context:
            self._context.append(self.tls.server_context(require_client_cert=self.tokens is None))
        return self._context[0]


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """A client's side: the cluster CA (and its certificate), or a bearer token, or both."""

    tls: TlsConfig
    token: str | None = None
    _context: list[ssl.SSLContext] = field(default_factory=list, compare=False, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        if not self._context:
            self._context.append(self.tls.client_context())
        return self._context[0]


def delegated(connection: Principal | None, on_behalf: str | None) -> Principal | None:
    """Who a request runs as: ``connection`` (the connection's proven principal) or, for a
    request made on behalf of another (REQUEST_AS), that principal as a plain client.
    PermissionDenied unless ``connection`` may delegate. A server without auth (``connection``
    None) has nobody to authorize: the request runs with no principal, as every other."""
    if on_behalf is None or connection is None:
        return connection
    if not connection.may_delegate:
        raise PermissionDenied(
            f"{connection} may not make requests on behalf of {on_behalf!r}: only the "
            f"delegating roles ({', '.join(sorted(DELEGATING_ROLES))}) may"
        )
    return Principal(on_behalf, "client", via=f"delegation by {connection.name}")


def peer_principal(peercert: object, peer: str) -> Principal | None:
    """The principal of a verified peer certificate (None: none presented);
    PermissionDenied naming the peer if the certificate names no valid principal."""
    try:
        return principal_from_peercert(peercert)
    except InvalidArgument as exc:
        raise PermissionDenied(f"refusing {peer}: {exc}") from exc
