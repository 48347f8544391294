"""What a principal may learn of a table: that it exists, and its row keys (§5.3: access
control is per column family; a table's shape is data too).

Two questions, asked by the master (which tables a principal may list and describe, whose
snapshots it may list), the workers (whose sample keys, status lines and METADATA rows it may
read) and the status pages (whose tablet boundaries they show):

- :func:`may_see_keys`: the table's row keys -- its sample keys, its tablets' boundaries, its
  split events, its snapshots' manifests. A principal that administers the table or may read
  one of its families (a table without families: anyone).
- :func:`may_know_table`: that the table exists -- its name in a listing, its schema, where its
  tablets are served. Any right on it: admin, or read or write on one of its families. A
  writer needs its tablets' locations to write, so a writer-only principal learns the
  boundaries of the tablets it writes to (routing needs them) but nothing else of their keys.
  A table without an admin list (made without auth) may be administered by anyone
  authenticated, so anyone may know of it.

The cluster's own identities (worker, master, function) see everything: they serve, assign
and compact every table. No principal (a server without auth) sees everything, as every other
check there allows everything. Structural types keep this module below the data layer: a
``TableSchema`` is a :class:`TableLike`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from tabletstore.security.principal import Principal

__all__ = ["TableLike", "may_know_table", "may_see_keys"]


class _AclLike(Protocol):
    def may_read(self, identity: str | None) -> bool: ...

    def may_write(self, identity: str | None) -> bool: ...


class _FamilyLike(Protocol):
    @property
    def acl(self) -> _AclLike: ...


class TableLike(Protocol):
    """What the answers read of a table's schema (``data.schema.TableSchema``)."""

    @property
    def admins(self) -> Sequence[str] | None: ...

    @property
    def families(self) -> Mapping[str, _FamilyLike]: ...


def _administers(principal: Principal, schema: TableLike) -> bool:
    return schema.admins is not None and principal.name in schema.admins


def may_see_keys(principal: Principal | None, schema: TableLike) -> bool:
    """Whether ``principal`` may see the table's row keys (module docstring)."""
    if principal is None or principal.is_cluster or _administers(principal, schema):
        return True
    families = schema.families.values()
    return not families or any(f.acl.may_read(principal.name) for f in families)


def may_know_table(principal: Principal | None, schema: TableLike) -> bool:
    """Whether ``principal`` may learn that the table exists (module docstring)."""
    if schema.admins is None or may_see_keys(principal, schema):
        return True
    assert principal is not None
    return any(f.acl.may_write(principal.name) for f in schema.families.values())
