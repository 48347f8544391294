"""The catalog over a coordinator: table creation, schema compare-and-swap, and tablet record
updates fenced by epoch (docs/architecture/design.md §6 rule 2)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace

import pytest

from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.filters import RowFilter, apply_filter
from tabletstore.data.model import Cell, Mutation, Row
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.errors import (
    AlreadyExists,
    Fenced,
    Indeterminate,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
)
from tabletstore.metadata import rows as mt
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


class _SlowMetadataRow:
    """One METADATA row behind a server whose first check-and-mutate is still being logged
    when its caller's deadline passes: the caller hears Indeterminate, a read right after still
    shows the old row, and the write lands before the next request on the row is served (the
    tablet's row lock orders them)."""

    def __init__(self, record: TabletRecord) -> None:
        self.cells = {m.qualifier: m.value for m in mt.record_mutations(record)}  # type: ignore[union-attr]
        self.pending: Sequence[Mutation] | None = None
        self.calls = 0

    def _row(self) -> Row:
        return Row(b"", [Cell(mt.FAMILY, q, 0, v) for q, v in sorted(self.cells.items())])

    def _land(self) -> None:
        if self.pending is not None:
            self.cells.update({m.qualifier: m.value for m in self.pending})  # type: ignore[union-attr]
            self.pending = None

    async def read_rows(self, start: bytes, end: bytes, **_: object) -> list[Row]:
        row = self._row()
        return [Row(start, row.cells)]

    async def check_and_mutate(
        self,
        key: bytes,
        predicate: RowFilter | None,
        true_mutations: Sequence[Mutation],
        false_mutations: Sequence[Mutation],
    ) -> bool:
        self.calls += 1
        if self.calls == 1:
            self.pending = true_mutations
            raise Indeterminate("no answer within the METADATA request deadline")
        self._land()
        matched = apply_filter(predicate, key, self._row().cells)
        if matched:
            self.cells.update({m.qualifier: m.value for m in true_mutations})  # type: ignore[union-attr]
        return matched

    async def mutate_row(self, key: bytes, mutations: Sequence[Mutation]) -> None:
        raise AssertionError("not used")


async def test_a_takeover_whose_first_attempt_lands_late_is_ours_not_fenced() -> None:
    """A load's epoch takeover whose first request got no answer, and was still being logged
    when the row was read back, then landed: the retry finds the row at the new epoch. That
    epoch is this load's claim (unique to it), so the takeover is done; reporting it Fenced
    (``is at epoch <ours>, not <old>``) failed every load of a slow METADATA tablet and left
    the row naming a worker that released its claim."""
    coord = MemoryCoordinator()
    try:
        old = TabletRecord("web-1", "t0", b"", b"m", epoch=96, location="w8:1")
        rows = _SlowMetadataRow(old)
        catalog = Catalog(coord, metadata=rows, retry_deadline=1.0)
        mine = replace(old, epoch=109, location="w6:1").with_event(5.0, "assigned", "w6")
        assert await catalog.update(old, mine) == mine
        assert rows.calls == 2
        got = mt.decode_row(Row(old.row_key, rows._row().cells))
        assert got is not None and got.record == mine
        # Another owner's epoch is still refused.
        with pytest.raises(Fenced, match="epoch 109, not 96"):
            await catalog.update(old, replace(old, epoch=120))
    finally:
        await coord.close()


class _SilentMetadataRow(_SlowMetadataRow):
    """A METADATA row whose server never answers a check-and-mutate and never applies one."""

    async def check_and_mutate(
        self,
        key: bytes,
        predicate: RowFilter | None,
        true_mutations: Sequence[Mutation],
        false_mutations: Sequence[Mutation],
    ) -> bool:
        self.calls += 1
        await asyncio.sleep(0)  # a request suspends its caller
        raise Indeterminate("no answer within the METADATA request deadline")


async def test_an_update_that_is_never_answered_is_indeterminate_after_the_deadline() -> None:
    """Each unanswered attempt reads the row back, finds the old epoch and tries again; the
    attempts share the catalog's retry deadline, after which the update is Indeterminate
    (before, the caller retried for ever)."""
    coord = MemoryCoordinator()
    try:
        old = TabletRecord("web-1", "t0", b"", b"m", epoch=96, location="w8:1")
        rows = _SilentMetadataRow(old)
        catalog = Catalog(coord, metadata=rows, retry_deadline=0.3)
        mine = replace(old, epoch=109, location="w6:1")
        async with asyncio.timeout(10):
            with pytest.raises(Indeterminate, match="may still be applied"):
                await catalog.update(old, mine)
        assert rows.calls >= 2
        got = mt.decode_row(Row(old.row_key, rows._row().cells))
        assert got is not None and got.record == old
    finally:
        await coord.close()
