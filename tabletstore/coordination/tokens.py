"""Bearer tokens: a principal for clients where mutual TLS does not fit.

``tabletstore tokens create NAME`` makes a random token for principal NAME and stores only
its SHA-256 in the coordinator (``tokens/<hex digest>``: the principal's name, role, creation
and expiry times as JSON, paths.py), so reading etcd does not reveal a usable token. The token
is shown once, to its creator. A server checks a token by looking its digest up
(:meth:`TokenStore.verify`). Every token expires: ``DEFAULT_TTL`` (30 days) after its creation
unless ``tokens create --days`` says otherwise; an expired token is refused like a revoked one
(a record without an expiry, made before tokens had one, expires ``DEFAULT_TTL`` after its
creation). ``tokens revoke NAME`` deletes every token of a principal. Servers check a live
connection's token again every few seconds (rpc/auth.py), so revocation and expiry both end
connections already authenticated. Tokens travel only over TLS (the RPC wire's AUTH frame, the front
door's ``authorization: Bearer`` metadata, the status endpoint's ``Authorization`` header).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import secrets
from dataclasses import dataclass

from tabletstore.clock import wall_time
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import InvalidArgument, NotFound, PermissionDenied
from tabletstore.security.principal import ROLES, Principal

__all__ = ["DEFAULT_TTL", "TOKEN_PREFIX", "TokenInfo", "TokenStore", "token_digest"]

#: Every token starts with this, so a leaked one is recognisable (secret scanners).
TOKEN_PREFIX = "tst_"
#: Seconds a token is valid unless created with another lifetime: 30 days.
DEFAULT_TTL = 30 * 24 * 3600.0


def token_digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class TokenInfo:
    """What the coordinator keeps of a token: never the token."""

    digest: str
    name: str
    role: str
    created: float
    expires: float


def _expires(record: dict[str, object]) -> float:
    expires = record.get("expires")
    if isinstance(expires, (int, float)):
        return float(expires)
    return float(record["created"]) + DEFAULT_TTL  # type: ignore[arg-type]


class TokenStore:
    """Tokens in the coordinator: create, verify, list and revoke."""

    def __init__(self, coordinator: Coordinator) -> None:
        self._coordinator = coordinator

    async def create(self, name: str, *, role: str = "client", ttl: float = DEFAULT_TTL) -> str:
        """A new token for principal ``name``, valid for ``ttl`` seconds; returns the token
        (shown once)."""
        if not name or any(c.isspace() for c in name):
            raise InvalidArgument(f"bad principal name {name!r} for a token")
        if role not in ROLES:
            raise InvalidArgument(f"unknown role {role!r}: expected one of {', '.join(ROLES)}")
        if not ttl > 0:
            raise InvalidArgument(f"a token's lifetime must be positive, got {ttl} s")
        token = TOKEN_PREFIX + secrets.token_urlsafe(32)
        now = wall_time()
        record = {"name": name, "role": role, "created": now, "expires": now + ttl}
        await self._coordinator.put(paths.TOKENS + token_digest(token), json.dumps(record).encode())
        return token

    async def verify(self, token: str) -> Principal:
        """The principal of ``token``; PermissionDenied if it is unknown, revoked or expired."""
        kv = await self._coordinator.get(paths.TOKENS + token_digest(token.strip()))
        if kv is None:
            raise PermissionDenied("the bearer token is unknown or was revoked")
        record = json.loads(kv.value)
        expires = _expires(record)
        if wall_time() >= expires:
            raise PermissionDenied(
                f"the bearer token of {record['name']!r} expired at "
                f"{datetime.datetime.fromtimestamp(expires, datetime.UTC):%Y-%m-%d %H:%M:%S}Z: "
                "ask for a new one (tabletstore tokens create)"
            )
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
                    _expires(record),
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
