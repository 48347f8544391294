"""The front door's authentication: TLS and per-request bearer tokens.

Google's clients send ``authorization: Bearer <token>`` metadata with every call. With a token
verifier (``coordination.tokens.TokenStore``), :class:`BearerTokens` checks it on the call's
metadata, before the request message is read: a missing token is UNAUTHENTICATED, an unknown
or revoked one PERMISSION_DENIED -- answered by a handler that takes its request as a stream
and never reads it, so gRPC receives no more of a refused call's message than HTTP/2 flow
control lets the client send before the answer (the stream's window: KiBs to a few MiB as
gRPC's bandwidth probing grows it, not the message limit), and nothing of it is decoded; the
refusal waits its turn in the front door's tarpit (``tarpit.py``), so refused calls take CPU at
a bounded rate however fast they come. The call otherwise runs acting for the token's principal (``client.client.ACTING_FOR``), so
the cluster's servers check the families' ACLs against that caller. For the workers to accept
"acting for", the front door's own certificate must carry a cluster role (``function``:
``tabletstore certs issue frontdoor --role function``; worker/tablet_service_guard.py). Tokens
only travel over TLS: the server is started with ``--tls-cert``/``--tls-key``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from tabletstore.bigtable_api.tarpit import Tarpit, source_of
from tabletstore.client.client import ACTING_FOR
from tabletstore.errors import PermissionDenied, TabletStoreError
from tabletstore.rpc.auth import TokenVerifier
from tabletstore.security import TlsConfig

__all__ = ["BearerTokens", "bearer_token", "refusal", "server_credentials"]


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS with this process's certificate; client certificates are not required (callers
    prove who they are with tokens)."""
    ca, cert, key = tls.read()
    if cert is None or key is None:
        raise PermissionDenied("the front door's TLS needs --tls-cert and --tls-key")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca)


def bearer_token(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The token of an ``authorization: Bearer ...`` metadata entry, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def refusal(handler: Any, code: grpc.StatusCode, message: str, tarpit: Tarpit | None = None) -> Any:
    """``handler`` with its behaviour replaced by an abort that never reads the request: a
    request-streaming handler (gRPC reads a unary handler's message whole, and decodes it,
    before calling it; a streaming one only when it iterates), with no deserializer. With a
    ``tarpit``, the abort first waits for its turn there (``tarpit.py``)."""

    async def abort_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if tarpit is not None:
            await tarpit.turn(source_of(context.peer()))
        await context.abort(code, message)

    async def abort_stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if tarpit is not None:
            await tarpit.turn(source_of(context.peer()))
        await context.abort(code, message)
        yield  # pragma: no cover (abort raises)

    streaming = handler.response_streaming
    return handler._replace(
        request_streaming=True,
        request_deserializer=None,
        unary_unary=None,
        unary_stream=None,
        stream_unary=None if streaming else abort_unary,
        stream_stream=abort_stream if streaming else None,
    )


#: What an unauthenticated call of a method the front door does not serve is refused with
#: (it waits in the tarpit like any other: a method name costs nothing to make up).
_NO_METHOD = grpc.unary_unary_rpc_method_handler(lambda request, context: None)


class BearerTokens(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Checks each call's bearer token and runs it acting for its principal (a refused call is
    never charged to the front door's request budget: only accepted ones reach ``admit``).
    Refusals wait their turn in ``tarpit`` (``tarpit.py``), those of calls to methods that do
    not exist too; an authenticated call of such a method is UNIMPLEMENTED at once."""

    def __init__(
        self,
        tokens: TokenVerifier,
        admit: Callable[[Any, str], Awaitable[Any]] | None = None,
        tarpit: Tarpit | None = None,
    ) -> None:
        self._tokens = tokens
        #: What an accepted call goes through next, with its principal (the front door's
        #: request budget: ``request_budget.BudgetAdmission``); it returns the handler to run.
        self._admit = admit
        self.tarpit = tarpit

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(details)
        token = bearer_token(details.invocation_metadata)
        if token is None:
            return refusal(
                handler or _NO_METHOD,
                grpc.StatusCode.UNAUTHENTICATED,
                "tabletstore: send an `authorization: Bearer <token>` header "
                "(tabletstore tokens create NAME)",
                self.tarpit,
            )
        try:
            principal = await self._tokens.verify(token)
        except TabletStoreError as exc:
            return refusal(
                handler or _NO_METHOD, grpc.StatusCode.PERMISSION_DENIED, str(exc), self.tarpit
            )
        if handler is None:
            return None
        ACTING_FOR.set(principal.name)
        if self._admit is not None:
            return await self._admit(handler, principal.name)
        return handler
