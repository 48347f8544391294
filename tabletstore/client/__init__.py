"""The client library (§5.1): locating tablets, talking to workers, the async and sync APIs."""

from __future__ import annotations

from tabletstore.client.client import AsyncClient
from tabletstore.client.mutate_rows import MutationError, MutationsFailed
from tabletstore.client.table import AsyncTable
from tabletstore.client.table_admin import Admin

__all__ = ["Admin", "AsyncClient", "AsyncTable", "MutationError", "MutationsFailed"]
