"""The typed sync faces (tabletstore.client.sync): every public method of the async client and
table is declared, typed, on its sync face, so no name falls back to the untyped proxy."""

from __future__ import annotations

import inspect

from tabletstore.client.client import AsyncClient
from tabletstore.client.sync import SyncClient, SyncTable
from tabletstore.client.table import AsyncTable
from tabletstore.embedded import Database, SyncDatabase


def _public_methods(cls: type) -> set[str]:
    return {
        name
        for name, member in vars(cls).items()
        if not name.startswith("_") and inspect.isfunction(member)
    }


def _declared(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ for name in vars(klass) if not name.startswith("_")}


def test_every_async_client_method_is_typed_on_the_sync_client() -> None:
    assert _public_methods(AsyncClient) <= _declared(SyncClient)


def test_every_async_table_method_is_typed_on_the_sync_table() -> None:
    assert _public_methods(AsyncTable) <= _declared(SyncTable)


def test_every_database_method_is_typed_on_the_sync_database() -> None:
    assert _public_methods(Database) <= _declared(SyncDatabase)


def test_sync_methods_keep_the_async_signatures() -> None:
    for sync, cls in [(SyncClient, AsyncClient), (SyncTable, AsyncTable)]:
        for name in _public_methods(cls):
            assert inspect.signature(getattr(sync, name)) == inspect.signature(getattr(cls, name))
