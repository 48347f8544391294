"""Replication: a replica table follows a table of another cluster through its change stream
(the shell around ``client/replication_plan.py``, which says how a change is applied exactly
once and what progress is kept).

:class:`TableReplicator` is what ``tabletstore replicate`` runs for each table, in a process
of the replica cluster's operator (beside its workers and master, like them a client of both
clusters): it reads every partition of the source table's change stream
(``client/change_stream.py``, straight from the source's bucket and catalog), applies each
change to the replica table with the source's timestamps as the replicator identity
(``data.validation.REPLICATOR``: a replica table refuses every other writer), and saves its
progress in the replica's coordinator, after the changes it covers. Killed at any moment,
it resumes from the saved tokens; the changes it applies again are harmless (the plan says
why). A split or merge on the source ends a partition and starts its successors with the
tokens it handed them, a merge once both halves have ended, also across a restart.

When the source cannot be read (its etcd, bucket or workers gone) the replicator keeps
retrying and records why in its progress (``replication status``, the status page, the
``replication_errors`` metric); the replica table keeps serving reads. A source table deleted
there is such a case: its logs stay in the bucket and its stream goes on yielding heartbeats,
so at most every ``heartbeat`` seconds the replicator looks the table up in the source's
catalog, and a table gone (or another table made under its name) stops the stream and is
recorded as ``source table T is gone``; it retries until it is promoted. A source table without a change retention, a token the
source refuses (another table of the same name, one older than the retention) and a
promoted replica end its following with the error.

:func:`promote` makes a replica a primary (failover); ``TableReplicator(..., attach=True)``
makes a former primary follow the table that was promoted in its place (failback), from the
instant of that promotion.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from tabletstore.client.change_plan import (
    CLOCK_SKEW,
    Change,
    ChangePartition,
    Heartbeat,
    PartitionEnd,
)
from tabletstore.client.client import AsyncClient
from tabletstore.client.replication_plan import (
    MARKER_FAMILY,
    Progress,
    applied_predicate,
    guarded,
    marker_cell,
    marker_family,
    mutations_of,
    replica_schema,
    starting,
)
from tabletstore.clock import Clock, SystemClock
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator, Put, PutResult, mod_revision_is
from tabletstore.data.schema import ReplicaOf
from tabletstore.data.validation import REPLICATOR
from tabletstore.errors import (
    Indeterminate,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)

__all__ = [
    "TableReplicator",
    "load_progress",
    "promote",
    "read_progress",
    "replication_progress",
    "save_progress",
]

_T = TypeVar("_T")

#: A fresh replica of a table starts this far inside the source's change retention.
START_MARGIN = 60.0
#: Most changes of a partition applied as one run (read ahead of the replica's writes).
APPLY_BATCH = 512
#: Rows of a run whose changes are applied at once.
APPLY_CONCURRENCY = 32


async def load_progress(client: AsyncClient, table: str) -> Progress | None:
    """Table ``table``'s replication progress in ``client``'s cluster (None: none)."""
    return (await _load(client, table))[0]


async def _load(client: AsyncClient, table: str) -> tuple[Progress | None, int]:
    """The progress and its record's revision (0: none)."""
    key = paths.replication(table)
    kv = await client.catalog.coordinator.get(key)
    if kv is None:
        return None, 0
    return Progress.from_bytes(kv.value, where=f"coordinator key {key}"), kv.mod_revision


async def save_progress(
    client: AsyncClient, table: str, progress: Progress, *, revision: int | None = None
) -> int:
    """Write the progress record; with ``revision``, only if it is still that one (else
    PreconditionFailed: someone else, a promotion, wrote it). Returns its new revision."""
    key = paths.replication(table)
    coordinator = client.catalog.coordinator
    if revision is None:
        return await coordinator.put(key, progress.to_bytes())
    result = await coordinator.txn(
        [mod_revision_is(key, revision)], [Put(key, progress.to_bytes())], []
    )
    if not result.succeeded:
        raise PreconditionFailed(f"the replication progress of table {table!r} changed")
    put = result.results[0]
    assert isinstance(put, PutResult)
    return put.revision


async def replication_progress(client: AsyncClient) -> dict[str, Progress]:
    """Every table of ``client``'s cluster with replication progress, by name."""
    return await read_progress(client.catalog.coordinator)


async def read_progress(coordinator: Coordinator) -> dict[str, Progress]:
    """Every table with replication progress in ``coordinator``'s namespace, by name."""
    out: dict[str, Progress] = {}
    for kv in await coordinator.get_prefix(paths.REPLICATION):
        name = paths.parse_replication(kv.key)
        out[name] = Progress.from_bytes(kv.value, where=f"coordinator key {kv.key}")
    return out


class TableReplicator:
    """Follows table ``table`` of ``source`` (a client of the source cluster, whose URL is
    ``source_url``) into the table of the same name of ``replica`` (a client of this cluster
    whose identity is the replicator's)."""

    def __init__(
        self,
        source: AsyncClient,
        source_url: str,
        replica: AsyncClient,
        table: str,
        *,
        start_time: float | None = None,
        attach: bool = False,
        poll: float = 0.5,
        heartbeat: float = 2.0,
        save_every: float = 1.0,
        clock: Clock | None = None,
        log: Callable[[str], object] = lambda line: None,
        applied: Callable[[Change], object] | None = None,
    ) -> None:
        if replica.identity != REPLICATOR:
            raise InvalidArgument(f"a replicator writes as {REPLICATOR!r}")
        self.source = source
        self.source_url = source_url
        self.replica = replica
        self.table = table
        self.start_time = start_time
        self.attach = attach
        self.poll = poll
        self.heartbeat = heartbeat
        self.save_every = save_every
        self.clock = clock or SystemClock()
        self.log = log
        #: Called with each change once the replica acknowledged it (``bench.changes`` times
        #: the replication lag with it).
        self.applied = applied
        self.progress: Progress | None = None
        self._saving = asyncio.Lock()
        self._saved_at = float("-inf")
        self._tasks: set[asyncio.Task[None]] = set()
        self._fatal: asyncio.Future[BaseException] | None = None
        #: The revision of the progress record as this replicator last wrote or read it.
        self._revision = 0
        #: Whether the replica's changes are applied under the guard (a table with a sum).
        self._guarded = False
        #: The source table's id as ``prepare`` found it, and when it was last looked up.
        self._source_id: str | None = None
        self._source_checked = float("-inf")
        #: Per partition, the (row, seq) of the changes applied of a run not finished yet.
        self._run_applied: dict[ChangePartition, set[tuple[bytes, int]]] = {}

    # ------------------------------------------------------------------ setting up

    async def prepare(self) -> Progress:
        """Check the source, make the replica table (or resume, or attach it) and return the
        progress to follow from. InvalidArgument naming the problem for a source table
        without a change retention, a replica table that follows something else, or a
        primary table met without ``attach``."""
        table = self.table
        try:
            src = await self.source._info(table, refresh=True)
        except NotFound as exc:
            raise NotFound(
                f"table {table!r} does not exist at the source {self.source_url}"
            ) from exc
        self._source_id = src.table_id
        if src.schema.changes is None:
            raise InvalidArgument(
                f"table {table!r} at {self.source_url} keeps no changes, so it cannot be "
                f"replicated: give it a change retention there first (tabletstore changes "
                f"{table} 24h)"
            )
        wanted = ReplicaOf(source=self.source_url, table=table)
        progress, self._revision = await _load(self.replica, table)
        try:
            mine = (await self.replica._info(table, refresh=True)).schema
        except NotFound:
            mine = None
        if mine is None:
            # A replica from its first moment: no client write can come before its first change.
            await self.replica.create_table(
                table,
                replica_schema(src.schema).families.values(),
                locality_groups=src.schema.locality_groups.values(),
                changes=src.schema.changes,
                replica_of=wanted,
            )
            progress = None
        elif mine.replica_of is None:
            if not self.attach:
                raise InvalidArgument(
                    f"table {table!r} exists on this cluster as a primary; to make it follow "
                    f"{self.source_url} (failback after a failover) replicate it with --attach"
                )
            progress = await self._attach(mine.families)
        elif (mine.replica_of.source, mine.replica_of.table) != (wanted.source, wanted.table):
            raise InvalidArgument(
                f"table {table!r} here is a replica of {mine.replica_of.table!r} at "
                f"{mine.replica_of.source}, not of {self.source_url}"
            )
        if progress is None or progress.state != "following":
            now = self.clock.time()
            window = src.schema.changes
            start = self.start_time
            if start is None:
                start = now - max(window - START_MARGIN, window / 2)
            parts = await self.source.table(table).change_partitions()
            progress = starting(self.source_url, table, parts, start)
            self._revision = await save_progress(self.replica, table, progress)
        self._guarded = guarded((await self.replica._info(table, refresh=True)).schema)
        self.progress = progress
        return progress

    async def _attach(self, families: object) -> Progress:
        """A primary here follows the source from the instant the source was promoted."""
        promoted = await load_progress(self.source, self.table)
        if promoted is None or promoted.state != "promoted" or promoted.promoted_at is None:
            raise InvalidArgument(
                f"table {self.table!r} at {self.source_url} was never promoted from a replica, "
                "so there is no instant to follow it from; replicate into a new table instead"
            )
        assert isinstance(families, dict)
        source_schema = (await self.source._info(self.table, refresh=True)).schema
        needs_marker = any(f.value_type == "sum" for f in source_schema.families.values())
        if needs_marker and MARKER_FAMILY not in families:
            await self.replica.create_family(self.table, marker_family())
        wanted = ReplicaOf(source=self.source_url, table=self.table)
        await self.replica.set_replica(self.table, wanted)
        parts = await self.source.table(self.table).change_partitions()
        progress = starting(self.source_url, self.table, parts, promoted.promoted_at)
        self._revision = await save_progress(self.replica, self.table, progress)
        self.log(
            f"{self.table}: follows {self.source_url} from its promotion at "
            f"{promoted.promoted_at:.3f}"
        )
        return progress

    # ------------------------------------------------------------------ following

    async def run(self) -> None:
        """Follow until the replica is promoted (returns) or a fatal error (raised, and kept
        in the progress record)."""
        progress = self.progress or await self.prepare()
        # An error a predecessor saved is not this run's: each failure is recorded again.
        self.progress = progress = replace(progress, error=None)
        loop = asyncio.get_running_loop()
        self._fatal = loop.create_future()
        for part, tokens in progress.followed:
            self._start(part, tokens)
        try:
            exc = await self._fatal
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if isinstance(exc, _Promoted):
            self.log(f"{self.table}: promoted; following ended")
            return
        await self._record_error(f"stopped: {exc}")
        raise exc

    def _start(self, part: ChangePartition, tokens: tuple[str, ...]) -> None:
        task = asyncio.create_task(self._follow(part, tokens))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _stop(self, exc: BaseException) -> None:
        if self._fatal is not None and not self._fatal.done():
            self._fatal.set_result(exc)

    async def _follow(self, part: ChangePartition, tokens: tuple[str, ...]) -> None:
        failures = 0
        src = self.source.table(self.table)
        while True:
            assert self.progress is not None
            current = dict(self.progress.followed).get(part, tokens)
            kwargs: dict[str, object] = (
                {"tokens": current} if current else {"start_time": self.progress.start_time}
            )
            try:
                stream = src.read_changes(
                    part,
                    poll=self.poll,
                    heartbeat=self.heartbeat,
                    **kwargs,  # type: ignore[arg-type]
                )
                async with contextlib.aclosing(_runs(stream, APPLY_BATCH)) as runs:
                    async for items in runs:
                        changes: list[Change] = []
                        for item in items:
                            if isinstance(item, Change):
                                changes.append(item)
                                continue
                            await self._apply_run(part, changes)
                            changes = []
                            if isinstance(item, Heartbeat):
                                await self._check_source()
                                self.progress = self.progress.advanced(
                                    part, item.token, item.watermark
                                )
                                if failures:
                                    failures = 0
                                    self.progress = replace(self.progress, error=None)
                                await self._save()
                            elif isinstance(item, PartitionEnd):
                                await self._ended(part, item)
                                return
                        await self._apply_run(part, changes)
                return  # an end time was reached (none is given: not reached)
            except _Promoted as exc:
                self._stop(exc)
                return
            except (InvalidArgument, PreconditionFailed) as exc:
                self._stop(exc)  # refused for good: another table's token, an expired window
                return
            except asyncio.CancelledError:
                raise
            except _SourceGone as exc:
                failures += 1
                await self._record_error(str(exc))
                await self.clock.sleep(min(10.0, 0.25 * 2**failures))
            except Exception as exc:  # the source unreachable: keep trying, say why
                failures += 1
                if isinstance(exc, NotFound) and not await self._source_exists():
                    error = self._gone()
                else:
                    error = f"source unreachable: {type(exc).__name__}: {exc}"
                await self._record_error(error)
                await self.clock.sleep(min(10.0, 0.25 * 2**failures))

    async def _check_source(self) -> None:
        """_SourceGone if the source table was deleted (looked up at most every
        ``heartbeat`` seconds, for all partitions at once)."""
        now = self.clock.monotonic()
        if now - self._source_checked < self.heartbeat:
            return
        self._source_checked = now
        if not await self._source_exists():
            raise _SourceGone(self._gone())

    async def _source_exists(self) -> bool:
        """Whether the source's catalog still has the table that was followed (False for a
        table deleted, or another one made under its name). A catalog that cannot be read
        says nothing: True, and the stream's own errors say why."""
        try:
            info = await self.source.catalog.get_table(self.table)
        except NotFound:
            return False
        except TabletStoreError:
            return True
        return self._source_id is None or info.table_id == self._source_id

    def _gone(self) -> str:
        return (
            f"source table {self.table!r} is gone from {self.source_url} (deleted there): "
            "nothing more will arrive; the replica keeps serving reads, and "
            f"`tabletstore replication promote {self.table}` makes it take writes"
        )

    async def _ended(self, part: ChangePartition, end: PartitionEnd) -> None:
        assert self.progress is not None
        self.progress, ready = self.progress.ended(part, end.successors)
        await self._save(force=True)
        for succ, tokens in ready:
            self._start(succ, tokens)

    async def _apply_run(self, part: ChangePartition, changes: list[Change]) -> None:
        """Apply a run of a partition's changes (those the stream had ready together), then
        advance the partition's progress past the last. Rows are independent: their changes
        are applied up to ``APPLY_CONCURRENCY`` rows at a time, each row's one after another
        in stream order (a later change of a row may overwrite or delete what an earlier one
        wrote). The progress moves only once every change of the run is applied, so a
        replicator killed in between applies them again from the previous token (harmless:
        the plan's module docstring); one that goes on after an error skips those it applied."""
        if not changes:
            return
        # What this process applied of a run that then failed (the stream resumes before the
        # run): not applied twice, so a retry within one process repeats nothing.
        done = self._run_applied.setdefault(part, set())
        by_row: dict[bytes, list[Change]] = {}
        for change in changes:
            if (change.row, change.seq) not in done:
                by_row.setdefault(change.row, []).append(change)
        slots = asyncio.Semaphore(APPLY_CONCURRENCY)

        async def apply_row(row_changes: list[Change]) -> None:
            async with slots:
                for change in row_changes:
                    await self._apply(change)
                    done.add((change.row, change.seq))
                    if self.applied is not None:
                        self.applied(change)

        await _all_or_none([apply_row(cs) for cs in by_row.values()])
        del self._run_applied[part]
        assert self.progress is not None
        self.progress = replace(
            self.progress.advanced(part, changes[-1].token, None),
            applied_changes=self.progress.applied_changes + len(changes),
        )
        await self._save()

    async def _apply(self, change: Change) -> None:
        """Apply one change to the replica (module docstring of the plan: exactly once)."""
        table = self.replica.table(self.table)
        muts = mutations_of(change)
        failures = 0
        while True:
            try:
                if self._guarded:
                    await table.check_and_mutate_row(
                        change.row,
                        applied_predicate(change.seq),
                        false_mutations=[*muts, marker_cell(change.seq)],
                    )
                else:
                    await table.mutate_row(change.row, muts)
                return
            except PreconditionFailed as exc:
                raise _Promoted(str(exc)) from exc
            except NotFound:
                # A family the source made after the replica was: make it here too, once.
                if not await self._add_families():
                    raise
            except (Unavailable, Indeterminate) as exc:  # both safe to send again
                failures += 1
                if failures == 3:
                    await self._record_error(f"replica unavailable: {exc}")
                await self.clock.sleep(min(5.0, 0.1 * 2**failures))

    async def _add_families(self) -> bool:
        """Make on the replica the families its source has and it lacks; whether any."""
        source = (await self.source._info(self.table, refresh=True)).schema
        mine = (await self.replica._info(self.table, refresh=True)).schema
        missing = [f for name, f in source.families.items() if name not in mine.families]
        for family in missing:
            if family.locality_group not in mine.locality_groups:
                group = source.locality_groups[family.locality_group]
                await self.replica.add_locality_group(self.table, group)
            await self.replica.create_family(self.table, family)
            self.log(f"{self.table}: made family {family.name!r}, new at the source")
        if any(f.value_type == "sum" for f in missing) and MARKER_FAMILY not in mine.families:
            await self.replica.create_family(self.table, marker_family())
            self._guarded = True
        return bool(missing)

    async def _save(self, *, force: bool = False) -> None:
        now = self.clock.monotonic()
        if not force and now - self._saved_at < self.save_every:
            return
        async with self._saving:
            assert self.progress is not None
            self._saved_at = self.clock.monotonic()
            self.progress = replace(self.progress, updated_at=self.clock.time())
            try:
                self._revision = await save_progress(
                    self.replica, self.table, self.progress, revision=self._revision
                )
            except PreconditionFailed as exc:
                # Only a promotion writes the record besides us: never write over it.
                self._stop(_Promoted(str(exc)))
                raise _Promoted(str(exc)) from exc

    async def _record_error(self, error: str) -> None:
        assert self.progress is not None
        if self.progress.error != error:
            self.log(f"{self.table}: {error}")
        self.progress = replace(self.progress, error=error)
        try:
            await self._save(force=True)
        except (TabletStoreError, _Promoted):
            pass  # the replica's coordinator is away (the next save says it), or promoted


async def _all_or_none(coros: list[Coroutine[Any, Any, None]]) -> None:
    """Run ``coros`` at once; the first to raise cancels the others (they are awaited), then
    its exception is raised as it is (not in a group: the callers' handlers match it)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def _runs(items: AsyncIterator[_T], limit: int) -> AsyncGenerator[list[_T], None]:
    """``items`` in runs: each run is the next item and those that arrived with it (already
    read, up to ``limit`` in all), so a burst the stream delivers at once is handled at once.
    A background task reads ahead (at most ``limit`` items); its error is raised here, in
    order, after the items before it."""
    queue: asyncio.Queue[tuple[_T | None, BaseException | None, bool]] = asyncio.Queue(limit)

    async def pump() -> None:
        try:
            async for item in items:
                await queue.put((item, None, False))
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            await queue.put((None, exc, True))
        else:
            await queue.put((None, None, True))

    reader = asyncio.create_task(pump())
    try:
        while True:
            run: list[_T] = []
            item, error, last = await queue.get()
            while True:
                if last:
                    if run:
                        yield run
                    if error is not None:
                        raise error
                    return
                run.append(item)  # type: ignore[arg-type]
                if len(run) >= limit or queue.empty():
                    break
                item, error, last = queue.get_nowait()
            yield run
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
        aclose = getattr(items, "aclose", None)
        if aclose is not None:
            await aclose()


class _Promoted(Exception):
    """The replica table refused the replicator's write: it was promoted."""


class _SourceGone(Exception):
    """The source table was deleted (or replaced by another of its name): retried, said."""


async def promote(
    replica: AsyncClient, table: str, *, clock: Clock | None = None
) -> tuple[float, float]:
    """Make replica table ``table`` a primary (failover): it stops following and takes client
    writes. Returns ``(applied, promoted_at)``: every write the source acknowledged before
    ``applied`` is in the table (later ones may not be: they stay only on the old primary);
    ``promoted_at`` is the instant this table's own writes begin, from which the old primary
    follows it after a failback.

    How (the fence is strict, no margin for a slow write): the master's ``set_replica`` with
    ``promoting`` answers once every live worker has the schema that refuses every write (the
    replicator's too) and its commit log has sealed every write it took before
    (``worker/admin_service.py`` update_schema); a tablet checks the schema again where a write
    joins the log (``TabletCore.check_writable``), and one opened meanwhile serves with the
    newest schema its worker read. So every replicated write is in a segment its worker
    stamped before ``fenced`` by this clock plus the clocks' skew, which is before
    ``promoted_at``; the table then takes client writes only after ``promoted_at`` plus the
    skew, each stamped at or after ``promoted_at``. A follower of this table starting at
    ``promoted_at`` reads every client write and none of the replicated ones (which a sum
    must not count twice)."""
    clock = clock or SystemClock()
    info = await replica._info(table, refresh=True)
    current = info.schema.replica_of
    if current is None:
        raise PreconditionFailed(f"table {table!r} is not a replica; there is nothing to promote")
    await replica.set_replica(table, current, promoting=True)
    fenced = clock.time()
    promoted_at = fenced + CLOCK_SKEW + 0.001
    await clock.sleep(2 * CLOCK_SKEW + 0.002)
    progress = await load_progress(replica, table)
    applied = progress.applied_watermark() if progress is not None else 0.0
    base = progress or Progress(source=current.source, table=current.table)
    await save_progress(
        replica,
        table,
        replace(
            base,
            state="promoted",
            promoted_at=promoted_at,
            partitions={},
            handed={},
            watermarks={},
            error=None,
            updated_at=clock.time(),
        ),
    )
    await replica.set_replica(table, None)
    if MARKER_FAMILY in info.schema.families:
        await replica.delete_family(table, MARKER_FAMILY)
    return applied, promoted_at
