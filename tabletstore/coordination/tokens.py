"""Bearer tokens: a principal for clients where mutual TLS does not fit (issue 16 item 1).

``tabletstore tokens create NAME`` makes a random token for principal NAME and stores only
its SHA-256 in the coordinator (``tokens/<hex digest>``: the principal's name, role and
creation time as JSON, paths.py), so reading etcd does not reveal a usable token. The token is
shown once, to its creator. A server checks a token by looking its digest up
(:meth:`TokenStore.verify`); ``tokens revoke NAME`` deletes every token of a principal, and
connections authenticated afterwards are refused (a connection already authenticated keeps its
principal until it closes). Tokens travel only over TLS (the RPC wire's AUTH frame, the front
door's ``authorization: Bearer`` metadata, the status endpoint's ``Authorization`` header).
"""

from __future__ import annotations

import hashlib
import json
import secrets
from dataclasses import dataclass

from tabletstore.clock import wall_time
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import InvalidArgument, NotFound, PermissionDenied
from tabletstore.security.principal import ROLES, Principal

__all__ = ["TOKEN_PREFIX", "TokenInfo", "TokenStore", "token_digest"]

#: Every token starts with this, so a leaked one is recognisable (secret scanners).
TOKEN_PREFIX = "tst_"


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What the coordinator keeps of a token: never the token."""

    digest: str
    name: str
    role: str
    created: float


class TokenStore:
    """Tokens in the coordinator: create, verify, list and revoke."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator

    async def create(self, name: str, *, role: str = "client") -> str:
        """A new token for principal ``name``; returns the token (shown once)."""
        if not name or any(c.isspace() for c in name):
            raise InvalidArgument(f"bad principal name {name!r} for a token")
        if role not in ROLES:
            raise InvalidArgument(f"unknown role {role!r}: expected one of {', '.join(ROLES)}")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        record = {"name": name, "role": role, "created": wall_time()}
        await self._coordinator.put(paths.TOKENS + token_digest(token), json.dumps(record).encode())
        return token

    async def verify(self, token: str) -> Principal:
        """The principal of ``token``; PermissionDenied if it is unknown or revoked."""
        kv = await self._coordinator.get(paths.TOKENS + token_digest(token.strip()))
        if kv is None:
            raise PermissionDenied("the bearer token is unknown or was revoked")
        record = json.loads(kv.value)
        return Principal(str(record["name"]), str(record["role"]), "token")

    async def list(self) -> list[TokenInfo]:
        out = []
        for kv in await self._coordinator.get_prefix(paths.TOKENS):
            record = json.loads(kv.value)
            out.append(
                TokenInfo(
                    kv.key[len(paths.TOKENS) :],
                    str(record["name"]),
                    str(record["role"]),
                    float(record["created"]),
                )
            )
        return out

    async def revoke(self, name_or_token: str) -> int:
        """Delete every token of principal ``name_or_token`` (or that one token); returns how
        many. NotFound if there was none."""
        digests = [t.digest for t in await self.list() if t.name == name_or_token]
        if name_or_token.startswith(TOKEN_PREFIX):
            digests.append(token_digest(name_or_token))
        deleted = 0
        for digest in digests:
            deleted += int(await self._coordinator.delete(paths.TOKENS + digest))
        if not deleted:
            raise NotFound(f"no token for {name_or_token!r}")
        return deleted
