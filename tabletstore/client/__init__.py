"""The client library (§5.1): locating tablets, talking to workers, the async and sync APIs."""

from __future__ import annotations

from tabletstore.client.client import Admin, AsyncClient, AsyncTable, MutationError, MutationsFailed

__all__ = ["Admin", "AsyncClient", "AsyncTable", "MutationError", "MutationsFailed"]
