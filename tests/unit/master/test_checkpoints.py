"""Checkpointer: a checkpoint per table with history once its interval has passed since its
newest snapshot (read from the bucket the first time), none for tables without history, a
failed one tried again next round."""

from __future__ import annotations

from tabletstore.clock import ManualClock
from tabletstore.data.schema import TableSchema
from tabletstore.errors import Unavailable
from tabletstore.master.checkpoints import (
    ROUND_SECONDS,
    Checkpointer,
    checkpoint_interval,
    checkpoint_ttl,
    window_of,
)
from tabletstore.metadata.catalog import TableInfo
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot, write_manifest
from tabletstore.storage_s3.base import ObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore


class _Catalog:
    def __init__(self, infos: list[TableInfo]) -> None:
        self.infos = infos
        self.default: float | None = None

    async def list_tables(self) -> list[TableInfo]:
        return self.infos

    async def history_default(self) -> float | None:
        return self.default


def _manifest(info: TableInfo, at: float, ttl: float | None = None) -> SnapshotManifest:
    tablet = TabletSnapshot("t0", b"", None, 1, {})
    expires = None if ttl is None else at + ttl
    return SnapshotManifest(
        f"s{at:.0f}", info.schema.name, info.table_id, at, expires, info.schema, (tablet,)
    )


async def test_a_checkpoint_per_interval_per_table_with_history() -> None:
    clock = ManualClock(1_800_000_000.0)
    store = MemoryObjectStore()
    hist = TableInfo("h-1", TableSchema(name="h", history=3600.0))
    plain = TableInfo("p-1", TableSchema(name="p"))
    await write_manifest(store, _manifest(hist, clock.time() - 100))  # a snapshot a while ago
    taken: list[tuple[str, float]] = []
    failing = [True]

    async def take(info: TableInfo, ttl: float) -> SnapshotManifest:
        if failing[0]:
            failing[0] = False
            raise Unavailable("a tablet is moving")
        taken.append((info.table_id, ttl))
        return _manifest(info, clock.time(), ttl)

    async def the_store() -> ObjectStore:
        return store

    cp = Checkpointer(_Catalog([hist, plain]), the_store, take, clock=clock)  # type: ignore[arg-type]
    interval = checkpoint_interval(3600.0)
    assert await cp.run_round() == []  # the snapshot 100 s ago is recent enough
    clock.advance(interval - 100)
    assert await cp.run_round() == []  # the take failed: logged, nothing taken
    clock.advance(ROUND_SECONDS)
    assert [m.table_id for m in await cp.run_round()] == ["h-1"]
    assert taken == [("h-1", 3600.0 + 2 * interval)]
    clock.advance(ROUND_SECONDS)
    assert await cp.run_round() == []  # the interval has not passed again
    assert [m.table_id for m in await cp.run_round(force=True)] == ["h-1"]


async def test_the_default_window_checkpoints_tables_without_their_own() -> None:
    clock = ManualClock(1_800_000_000.0)
    store = MemoryObjectStore()
    own = TableInfo("h-1", TableSchema(name="h", history=7200.0))
    plain = TableInfo("p-1", TableSchema(name="p"))
    taken: list[tuple[str, float]] = []

    async def take(info: TableInfo, ttl: float) -> SnapshotManifest:
        taken.append((info.table_id, ttl))
        return _manifest(info, clock.time(), ttl)

    async def the_store() -> ObjectStore:
        return store

    catalog = _Catalog([own, plain])
    cp = Checkpointer(catalog, the_store, take, clock=clock)  # type: ignore[arg-type]
    assert [m.table_id for m in await cp.run_round()] == ["h-1"]
    catalog.default = 3600.0
    assert await cp.run_round() == []  # within ROUND_SECONDS of the last round
    cp.wake()  # the default changed: the next round runs at once
    assert [m.table_id for m in await cp.run_round()] == ["p-1"]
    assert taken == [
        ("h-1", checkpoint_ttl(7200.0)),  # a table's own window wins over the default
        ("p-1", checkpoint_ttl(3600.0)),
    ]
    assert window_of(None, 3600.0) == 3600.0 and window_of(60.0, 3600.0) == 60.0
    assert window_of(None, None) is None


def test_garbage_collection_keeps_the_log_for_the_longer_of_history_and_changes() -> None:
    from tabletstore.master.checkpoints import (
        CLOCK_MARGIN,
        change_retention,
        log_retention,
        retention,
    )

    assert log_retention(TableSchema(name="p")) == 0.0
    assert log_retention(TableSchema(name="c", changes=86400.0)) == 86400.0 + CLOCK_MARGIN
    assert change_retention(86400.0) == 86400.0 + CLOCK_MARGIN
    both = TableSchema(name="b", changes=7 * 86400.0, history=3600.0)
    assert log_retention(both) == max(retention(3600.0), change_retention(7 * 86400.0))
