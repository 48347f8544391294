"""Who made a request, as proven by a certificate or a token (§5.3 authorization).

A :class:`Principal` is never built from a field the caller fills in: the RPC layer derives it
from the peer's verified certificate (the name is its Common Name, the role its Organizational
Unit) or from a bearer token the coordinator knows (``coordination/tokens.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["CLUSTER_ROLES", "DELEGATING_ROLES", "ROLES", "Principal", "Role"]

Role = Literal["client", "worker", "master", "function"]
#: Every role a certificate or token may carry.
ROLES: tuple[Role, ...] = ("client", "worker", "master", "function")
#: The cluster's own identities: only they may send control RPCs (load and unload tablets,
#: snapshots, bulk-load pieces, schema reloads) or write the METADATA table.
CLUSTER_ROLES: frozenset[str] = frozenset({"worker", "master", "function"})
#: Roles that may make a request on behalf of another principal (the REQUEST_AS frame,
#: rpc/frames.py): the front door's certificate (``certs issue frontdoor --role function``),
#: which serves token holders. The request is then authorized as that principal, exactly as
#: if it had connected itself; nobody else may assert another identity.
DELEGATING_ROLES: frozenset[str] = frozenset({"function"})


@dataclass(frozen=True, slots=True)
class Principal:
    """A proven caller: ``name`` (checked against ACLs) and ``role``; ``via`` says how it was
    proven ("certificate" or "token")."""

    name: str
    role: str
    via: str = "certificate"

    @property
    def is_cluster(self) -> bool:
        return self.role in CLUSTER_ROLES

    @property
    def may_delegate(self) -> bool:
        return self.role in DELEGATING_ROLES

    def __str__(self) -> str:
        return f"{self.name} ({self.role}, by {self.via})"
