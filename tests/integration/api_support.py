"""Fixtures and helpers shared by the public-API tests (``tests/integration/test_api_*.py``).

Every API test runs against each embedded URL a user can pass to ``tabletstore.connect``:
``memory://<name>`` (a fresh name per test) and ``file://<tmp_path>``. The fixtures go through
the public entry points only (``tabletstore.connect_async`` / ``tabletstore.connect``); a test
that needs a second identity opens the same database again with ``identity=`` after closing
the first handle (:func:`reopen`), exactly as a second program would.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterable
from pathlib import Path

import pytest

import tabletstore
from tabletstore import AsyncClient, AsyncTable, Row

#: The embedded URL kinds every API test is parametrized over.
URL_KINDS = ("memory", "file")


def make_url(kind: str, tmp_path: Path) -> str:
    if kind == "memory":
        return f"memory://api-{uuid.uuid4().hex}"
    return f"file://{tmp_path / 'db'}"


@pytest.fixture(params=URL_KINDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh database URL of each embedded kind."""
    return make_url(request.param, tmp_path)


@pytest.fixture
async def db(db_url: str) -> AsyncIterator[AsyncClient]:
    """An open asyncio database (anonymous identity), closed after the test."""
    client = await tabletstore.connect_async(db_url)
    try:
        yield client
    finally:
        await client.close()


async def reopen(client: AsyncClient, url: str, *, identity: str | None = None) -> AsyncClient:
    """Close ``client`` and open ``url`` again (as another identity, or after a restart)."""
    await client.close()
    return await tabletstore.connect_async(url, identity=identity)


async def rows_of(table: AsyncTable, **kw: object) -> list[Row]:
    """Every row ``table.read_rows(**kw)`` yields, in order."""
    return [r async for r in table.read_rows(**kw)]  # type: ignore[arg-type]


async def keys_of(table: AsyncTable, **kw: object) -> list[bytes]:
    return [r.key for r in await rows_of(table, **kw)]


def values(row: Row | None) -> list[tuple[str, bytes, int, bytes]]:
    """(family, qualifier, timestamp, value) of every cell, in the row's order."""
    if row is None:
        return []
    return [(c.family, c.qualifier, c.timestamp, c.value) for c in row.cells]


def cells_by_row(rows: Iterable[Row]) -> dict[bytes, list[tuple[str, bytes, int, bytes]]]:
    return {r.key: values(r) for r in rows}
