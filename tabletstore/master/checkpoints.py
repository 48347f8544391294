"""Checkpoints of the tables that keep history, and how long their history costs.

A table with a history window (``TableSchema.history``, seconds; or, for a table without one,
the database's default, :func:`window_of`; a table whose window is ``HISTORY_OFF`` keeps none
whatever the default) can be restored as of any instant in the window
(``master/pitr_restore.py``): from the newest checkpoint at or before the instant plus the
commit log from that checkpoint up to it. A checkpoint is a snapshot
(``master/snapshots.py``: a consistent cut, its manifest pinning its SSTables) the master
takes every :func:`checkpoint_interval` while it leads, with a TTL of :func:`checkpoint_ttl`
so that one at or before any instant of the window is kept (garbage collection rule 5), even
if one round is missed. Garbage collection keeps every commit log whose newest object is
younger than :func:`retention` (rule 7 of ``master/gc_plan.py``): the log from
``CLOCK_MARGIN`` before the oldest kept checkpoint up to now. A table with a change retention
(``TableSchema.changes``) has its change stream read from the same retained log, kept
:func:`change_retention` (:func:`log_retention`: the longer of the two).

The master owns both settings: ``set_history`` and ``history_default`` are master RPCs (only a
table's admins change its window; only the cluster's own master identity the default,
master/master_service_guard.py). Nobody caches them: the checkpoint round, garbage collection
and a restore read the schema and the default each time, so a change governs them at once.
Setting a table's window takes its first checkpoint before the call returns (when the table
is served), so instants from then on can be restored.

``CLOCK_MARGIN`` bounds the skew between the master's clock (a checkpoint's time), the
workers' clocks (a segment's time) and the object store's (an object's age); skew beyond it
can make a restore near the window's far edge miss the start of the log, which the restore
then refuses rather than rebuild partly.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from tabletstore.clock import Clock
from tabletstore.data.schema import HISTORY_OFF, MAX_HISTORY, TableSchema
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.snapshot import SnapshotManifest, list_manifests
from tabletstore.storage_s3.base import ObjectStore

__all__ = [
    "CLOCK_MARGIN",
    "Checkpointer",
    "change_retention",
    "checkpoint_interval",
    "checkpoint_ttl",
    "log_retention",
    "retention",
    "set_changes",
    "set_history",
    "set_history_default",
    "window_of",
]

log = logging.getLogger(__name__)

#: Seconds of clock skew tolerated between masters, workers and the object store.
CLOCK_MARGIN = 300.0
#: The most seconds between two checkpoints of a table, whatever its window.
MAX_INTERVAL = 3600.0
#: The fewest seconds between two checkpoints of a table.
MIN_INTERVAL = 30.0
#: The fewest seconds between two rounds (a round reads every table's schema).
ROUND_SECONDS = 10.0


def window_of(history: float | None, default: float | None) -> float | None:
    """A table's history window: its own (``TableSchema.history``), else the database's
    ``default``; None: it keeps no history (neither is set, or the table opted out with
    ``HISTORY_OFF``)."""
    if history is None:
        return default
    return None if history == HISTORY_OFF else history


def checkpoint_interval(window: float) -> float:
    """Seconds between two checkpoints of a table with a ``window`` of history: a quarter of
    the window, between 30 seconds and an hour (a restore replays at most that much log)."""
    return min(MAX_INTERVAL, max(MIN_INTERVAL, window / 4))


def checkpoint_ttl(window: float) -> float:
    """How long a checkpoint is kept: the window, plus two intervals (the newest checkpoint
    at or before the window's far edge is still there if one round was missed)."""
    return window + 2 * checkpoint_interval(window)


def retention(window: float) -> float:
    """How long a commit log is kept after its newest object for a table with ``window``:
    as long as the oldest checkpoint kept, plus the clock margin before it."""
    return checkpoint_ttl(window) + CLOCK_MARGIN


def change_retention(window: float) -> float:
    """How long a commit log is kept after its newest object for a table with a change
    retention of ``window``: every segment written within the window, plus the clock margin
    (a segment's age is told by the object store's clock, its stamp by its writer's)."""
    return window + CLOCK_MARGIN


def log_retention(schema: TableSchema, default: float | None = None) -> float:
    """What garbage collection rule 7 keeps a finished log for, for this table's sake: the
    longer of its history window's (its own, else the database's ``default``) and its change
    stream's retention (0: neither)."""
    kept = 0.0
    window = window_of(schema.history, default)
    if window is not None:
        kept = retention(window)
    if schema.changes is not None:
        kept = max(kept, change_retention(schema.changes))
    return kept


#: Takes a checkpoint of a table with the given TTL (the master's snapshot, phase 1 and 2).
TakeCheckpoint = Callable[[TableInfo, float], Awaitable[SnapshotManifest]]


class Checkpointer:
    """Takes a checkpoint of every table with history once its interval has passed since its
    newest snapshot. The newest is read from the bucket the first time a table is seen (a
    master that just took over), then remembered."""

    def __init__(
        self,
        catalog: Catalog,
        store: Callable[[], Awaitable[ObjectStore]],
        take: TakeCheckpoint,
        *,
        clock: Clock,
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._take = take
        self._clock = clock
        self._newest: dict[str, float] = {}
        self._last_round: float | None = None

    async def run_round(self, *, force: bool = False) -> list[SnapshotManifest]:
        """One round over the tables, at most every ``ROUND_SECONDS`` (``force``: now, and
        every table with history whatever its interval); returns the checkpoints taken. A table whose checkpoint
        fails is logged and tried again next round (its history is then still whole as long
        as a later one succeeds within the TTL's spare interval)."""
        now = self._clock.monotonic()
        if not force and self._last_round is not None and now - self._last_round < ROUND_SECONDS:
            return []
        self._last_round = now
        taken: list[SnapshotManifest] = []
        default = await self._catalog.history_default()
        for info in await self._catalog.list_tables():
            window = window_of(info.schema.history, default)
            if window is None:
                continue
            try:
                manifest = await self._maybe_take(info, window, force)
            except TabletStoreError as exc:
                log.warning("checkpoint of table %s failed: %s", info.schema.name, exc)
                continue
            if manifest is not None:
                taken.append(manifest)
        return taken

    def wake(self) -> None:
        """Let the next :meth:`run_round` run at once (a window changed)."""
        self._last_round = None

    async def first_checkpoint(self, info: TableInfo, window: float) -> SnapshotManifest | None:
        """Checkpoint ``info`` now unless its newest checkpoint is within its interval (a
        window just set); a failure is logged, and the next round tries again."""
        try:
            return await self._maybe_take(info, window, False)
        except TabletStoreError as exc:
            log.warning("checkpoint of table %s failed: %s", info.schema.name, exc)
            return None

    async def _maybe_take(
        self, info: TableInfo, window: float, force: bool
    ) -> SnapshotManifest | None:
        newest = self._newest.get(info.table_id)
        if newest is None:
            manifests = await list_manifests(await self._store(), info.table_id)
            newest = max((m.created_at for m in manifests), default=float("-inf"))
            self._newest[info.table_id] = newest
        if not force and self._clock.time() - newest < checkpoint_interval(window):
            return None
        manifest = await self._take(info, checkpoint_ttl(window))
        self._newest[info.table_id] = manifest.created_at
        return manifest


async def set_history(catalog: Catalog, table: str, seconds: float | None) -> TableInfo:
    """Set the history window of ``table`` (None: its own setting ends and the database's
    default applies; ``HISTORY_OFF``: no history whatever the default): a schema change
    (compare-and-swap on the schema record), made by the master's ``set_history`` RPC, which
    then takes the first checkpoint; instants from then on can be restored. Shortening the
    window lets garbage collection free what falls out of it."""
    return await _set_seconds(catalog, table, "history", seconds)


async def set_changes(catalog: Catalog, table: str, seconds: float | None) -> TableInfo:
    """Set (or, with None, end) the change retention of ``table``: a schema change
    (compare-and-swap on the schema record). Its change stream can be read from then on, as
    far back as the retention (``client/change_stream.py``); shortening it lets garbage
    collection free the commit log that falls out of it."""
    return await _set_seconds(catalog, table, "changes", seconds)


async def _set_seconds(
    catalog: Catalog, table: str, field: str, seconds: float | None
) -> TableInfo:
    info = await catalog.get_table(table)
    try:
        schema = TableSchema.model_validate({**info.schema.model_dump(), field: seconds})
    except ValueError as exc:
        raise InvalidArgument(f"table {table!r}: {exc}") from exc
    return await catalog.update_schema(info, schema)


async def set_history_default(catalog: Catalog, seconds: float | None) -> float | None:
    """Set (or, with None, end) the database's default history window, which applies to every
    table without a window of its own. Returns it."""
    if seconds is not None and not 0 < seconds <= MAX_HISTORY:
        raise InvalidArgument(
            f"history window must be more than 0 and at most {MAX_HISTORY / 86400:.0f} days, "
            f"got {seconds:g} seconds"
        )
    await catalog.set_history_default(seconds)
    return seconds
