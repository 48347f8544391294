"""The front door's authentication: TLS and per-request bearer tokens.

Google's clients send ``authorization: Bearer <token>`` metadata with every call. With a token
verifier (``coordination.tokens.TokenStore``), :class:`BearerTokens` checks it on the call's
metadata, before the request message is read: a missing token is UNAUTHENTICATED, an unknown
or revoked one PERMISSION_DENIED -- answered by a handler that takes its request as a stream
and never reads it, so gRPC receives no more of a refused call's message than HTTP/2 flow
control lets the client send before the answer (the stream's window: KiBs to a few MiB as
gRPC's bandwidth probing grows it, not the message limit), and nothing of it is decoded; the
refusal waits its turn in the front door's tarpit (``tarpit.py``), so refused calls take CPU at
a bounded rate however fast they come. The call otherwise runs acting for the token's principal
(``client.client.ACTING_FOR``), so the cluster's servers check the families' ACLs against that
caller.

A token's good answer is kept for :data:`TOKEN_RECHECK` seconds (:class:`RememberedTokens`), so
a caller's steady stream of calls costs one coordinator read every two seconds rather than one
per call: a revoked or expired token is refused at the latest :data:`TOKEN_RECHECK` seconds
after its revocation or expiry (the bound a live RPC connection's token has too,
``rpc/auth.py``). Refusals are never kept: a new token works at once, and a refused token is
looked up again on its next call. For the workers to accept
"acting for", the front door's own certificate must carry a cluster role (``function``:
``tabletstore certs issue frontdoor --role function``; worker/tablet_service_guard.py). Tokens
only travel over TLS: the server is started with ``--tls-cert``/``--tls-key``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from tabletstore.bigtable_api.tarpit import Tarpit, source_of
from tabletstore.client.client import ACTING_FOR
from tabletstore.clock import Clock, SystemClock
from tabletstore.errors import PermissionDenied, TabletStoreError
from tabletstore.rpc.auth import TokenVerifier
from tabletstore.security import Principal, TlsConfig

__all__ = [
    "TOKEN_RECHECK",
    "BearerTokens",
    "RememberedTokens",
    "bearer_token",
    "refusal",
    "refuse",
    "server_credentials",
]

#: Seconds a token's good answer serves the front door's calls before the token is looked up
#: again: the longest a revoked or expired token goes on working.
TOKEN_RECHECK = 2.0
#: Good answers kept at most; past it the oldest half is forgotten (a token then costs one
#: more lookup). Only tokens that are good take a place: unknown ones are never kept.
REMEMBERED_TOKENS = 4096


def server_credentials(tls: TlsConfig) -> grpc.ServerCredentials:
    """TLS with this process's certificate; client certificates are not required (callers
    prove who they are with tokens)."""
    ca, cert, key = tls.read()
    if cert is None or key is None:
        raise PermissionDenied("the front door's TLS needs --tls-cert and --tls-key")
    return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca)


class RememberedTokens:
    """A :class:`~tabletstore.rpc.auth.TokenVerifier` that keeps ``tokens``' good answers for
    ``recheck`` seconds of ``clock``'s monotonic time.

    An answer's age counts from the moment its lookup *started*, so a lookup that began after
    a revocation always sees it: a call made ``recheck`` seconds or more after a token was
    revoked (or expired) is refused. Calls with the same token while its lookup is under way
    wait for that one lookup, and a call that goes away meanwhile does not cancel it for the
    others. A refusal, or a coordinator that cannot answer, is the call's answer and is not
    kept."""

    def __init__(
        self,
        tokens: TokenVerifier,
        *,
        recheck: float = TOKEN_RECHECK,
        clock: Clock | None = None,
        capacity: int = REMEMBERED_TOKENS,
    ) -> None:
        if recheck < 0:
            raise ValueError(f"recheck must be >= 0 seconds, got {recheck}")
        self._tokens = tokens
        self._recheck = recheck
        self._clock = clock or SystemClock()
        self._capacity = capacity
        #: token -> (monotonic time its lookup started, its principal); oldest first.
        self._good: dict[str, tuple[float, Principal]] = {}
        #: token -> the lookup under way.
        self._lookups: dict[str, asyncio.Task[Principal]] = {}
        #: Lookups made (each one coordinator read), for tests and benchmarks.
        self.lookups = 0

    async def verify(self, token: str) -> Principal:
        """The principal of ``token``; PermissionDenied if unknown, revoked or expired (at
        most ``recheck`` seconds late)."""
        good = self._good.get(token)
        if good is not None and self._clock.monotonic() - good[0] < self._recheck:
            return good[1]
        lookup = self._lookups.get(token)
        if lookup is None:
            lookup = asyncio.ensure_future(self._look_up(token))
            self._lookups[token] = lookup
            lookup.add_done_callback(lambda done: self._ended(token, done))
        return await asyncio.shield(lookup)

    async def _look_up(self, token: str) -> Principal:
        started = self._clock.monotonic()
        self.lookups += 1
        try:
            principal = await self._tokens.verify(token)
        except BaseException:
            self._good.pop(token, None)
            raise
        good = self._good
        good.pop(token, None)  # re-inserted last: the dict's order is the answers' age
        if len(good) >= self._capacity:
            for old in list(good)[: max(1, len(good) // 2)]:
                del good[old]
        good[token] = (started, principal)
        return principal

    def _ended(self, token: str, lookup: asyncio.Task[Principal]) -> None:
        if self._lookups.get(token) is lookup:
            del self._lookups[token]
        if not lookup.cancelled():
            lookup.exception()  # retrieved: every waiter has it, or none is left to


def bearer_token(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The token of an ``authorization: Bearer ...`` metadata entry, if any."""
    for key, value in metadata or ():
        if key.lower() == "authorization":
            text = value.decode() if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


def refuse(
    context: grpc.aio.ServicerContext[Any, Any], code: grpc.StatusCode, message: str
) -> None:
    """End the call with status ``code`` and ``message`` once its handler returns (it then
    returns None, or simply ends if it streams): every refusal of the front door goes this way.
    ``context.abort`` would raise instead, and gRPC's handling of that exception leaves the
    handler's frame, the request it holds included, in a garbage cycle; with the collector's
    thresholds of a server process (``ops/process_warmup.py``) such cycles are collected
    rarely, so each refused call of a large request would hold its bytes for minutes."""
    context.set_code(code)
    context.set_details(message)


def refusal(handler: Any, code: grpc.StatusCode, message: str, tarpit: Tarpit | None = None) -> Any:
    """``handler`` with its behaviour replaced by a refusal that never reads the request: a
    request-streaming handler (gRPC reads a unary handler's message whole, and decodes it,
    before calling it; a streaming one only when it iterates), with no deserializer. With a
    ``tarpit``, the refusal first waits for its turn there (``tarpit.py``)."""

    async def abort_unary(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if tarpit is not None:
            await tarpit.turn(source_of(context.peer()))
        refuse(context, code, message)

    async def abort_stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        if tarpit is not None:
            await tarpit.turn(source_of(context.peer()))
        refuse(context, code, message)
        return
        yield  # an async generator that yields nothing

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
