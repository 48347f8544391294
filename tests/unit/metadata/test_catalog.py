"""The catalog over a coordinator: table creation, schema compare-and-swap, and tablet record
updates fenced by epoch (DESIGN.md §6 rule 2)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.errors import AlreadyExists, Fenced, InvalidArgument, NotFound, PreconditionFailed
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import TabletRecord

SCHEMA = TableSchema(name="web", families={"a": ColumnFamily(name="a")})


@pytest.fixture
async def catalog() -> AsyncIterator[Catalog]:
    coord = MemoryCoordinator()
    yield Catalog(coord)
    await coord.close()


def records(table_id: str) -> list[TabletRecord]:
    return [
        TabletRecord(table_id, "t1", b"m", None),
        TabletRecord(table_id, "t0", b"", b"m"),
    ]


async def test_create_table_once(catalog: Catalog) -> None:
    info = await catalog.create_table(SCHEMA, records("web-1"))
    assert info.table_id == "web-1" and info.schema == SCHEMA and info.revision > 0
    assert [r.tablet_id for r in await catalog.list_tablets("web-1")] == ["t0", "t1"]
    with pytest.raises(AlreadyExists):
        await catalog.create_table(SCHEMA, records("web-2"))
    assert await catalog.list_tablets("web-2") == []  # nothing of the failed create stayed
    with pytest.raises(InvalidArgument):
        await catalog.create_table(SCHEMA.model_copy(update={"name": "x"}), [])
    with pytest.raises(NotFound):
        await catalog.get_table("missing")
    with pytest.raises(NotFound):
        await catalog.get_tablet("web-1", "t9")


async def test_tablet_update_is_fenced_by_epoch(catalog: Catalog) -> None:
    await catalog.create_table(SCHEMA, records("web-1"))
    rec = await catalog.get_tablet("web-1", "t0")
    owner1 = await catalog.update(rec, replace(rec, epoch=10, location="w1"))
    owner1 = await catalog.update(owner1, replace(owner1, redo_seq=5))
    # Worker 2 takes the tablet over: a new epoch.
    owner2 = await catalog.update(owner1, replace(owner1, epoch=11, location="w2"))
    # The zombie's late update (it still holds epoch 10) is rejected, and changes nothing.
    with pytest.raises(Fenced, match="epoch 11, not 10"):
        await catalog.update(owner1, replace(owner1, redo_seq=99))
    assert await catalog.get_tablet("web-1", "t0") == owner2
    await catalog.update(owner2, replace(owner2, redo_seq=7))
    assert (await catalog.get_tablet("web-1", "t0")).redo_seq == 7


async def test_updates_of_the_same_owner_racing_both_apply_in_turn(catalog: Catalog) -> None:
    await catalog.create_table(SCHEMA, records("web-1"))
    rec = await catalog.get_tablet("web-1", "t0")
    a, b = await asyncio.gather(
        catalog.update(rec, replace(rec, redo_seq=1)),
        catalog.update(rec, replace(rec, redo_seq=2)),
    )
    assert (a.redo_seq, b.redo_seq) == (1, 2)
    assert await catalog.get_tablet("web-1", "t0") in (a, b)


async def test_update_of_a_deleted_tablet_is_fenced(catalog: Catalog) -> None:
    await catalog.create_table(SCHEMA, records("web-1"))
    rec = await catalog.get_tablet("web-1", "t0")
    await catalog.delete_table("web")
    with pytest.raises(Fenced, match="no longer exists"):
        await catalog.update(rec, replace(rec, redo_seq=1))
    with pytest.raises(NotFound):
        await catalog.get_table("web")


async def test_schema_changes_are_compare_and_swap(catalog: Catalog) -> None:
    info = await catalog.create_table(SCHEMA, records("web-1"))
    wider = SCHEMA.model_copy(update={"families": {**SCHEMA.families, "b": ColumnFamily(name="b")}})
    new = await catalog.update_schema(info, wider)
    assert set(new.schema.families) == {"a", "b"}
    with pytest.raises(PreconditionFailed, match="changed concurrently"):
        await catalog.update_schema(info, SCHEMA)  # stale revision
    assert (await catalog.get_table("web")).schema == wider


async def test_replace_tablets_checks_every_epoch(catalog: Catalog) -> None:
    await catalog.create_table(SCHEMA, records("web-1"))
    t0 = await catalog.get_tablet("web-1", "t0")
    left = TabletRecord("web-1", "t0", b"", b"g", epoch=t0.epoch)
    right = TabletRecord("web-1", "t2", b"g", b"m")
    stale = replace(t0, epoch=t0.epoch + 1)
    with pytest.raises(Fenced):
        await catalog.replace_tablets([stale], [left, right])
    await catalog.replace_tablets([t0], [left, right])
    assert [r.tablet_id for r in await catalog.list_tablets("web-1")] == ["t0", "t2", "t1"]
