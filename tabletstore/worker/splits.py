"""Splitting the tablets a worker serves, where they grow (§5.2).

After each compaction of a user tablet the worker checks its size (``engine.split_key``'s pure
``should_split``); one past ``TabletOptions.split_bytes`` is split in the background, in this
worker's TaskGroup: its writes stop and it is flushed, the two children are claimed here, and
the catalog commits them in place of the parent in one atomic step; then the children are
served here (their tablet locks held from before the claims until then, so a load of a child
sent meanwhile by a master finds it served) and each is major-compacted so it stops sharing its
parent's SSTables -- as is a child that any worker starts serving still sharing them (moved or
recovered before that compaction ran). The master
needs no notice: it finds the children in METADATA, claimed and located, like any other tablet.
A child does not split again before ``WorkerOptions.split_cooldown`` has passed. METADATA
tablets are split only when created (the master's ``metadata_splits``), never here.

A worker runs ``WorkerOptions.concurrent_splits`` splits at once (one by default). Tablets
written evenly reach the split size together, and a round of splits run side by side made
each one's pause of writes the sum of theirs: every one contends for the same CPU, commit
log and METADATA tablet while its writes are refused. One after the other, each pause is its
own; the children's claims are made before it, and the parent's released after it.

The claims, the tablet locks and the opening of tablets are the server's (``worker/tablet_server.py``);
:class:`TabletSplits` drives them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from typing import TYPE_CHECKING

from tabletstore.clock import Clock
from tabletstore.engine import split_key as splitting
from tabletstore.engine.tablet import Tablet
from tabletstore.errors import NotFound, TabletStoreError
from tabletstore.metadata import rows as mt
from tabletstore.metadata.record import TabletRecord

if TYPE_CHECKING:
    from tabletstore.worker.tablet_server import TabletServer

__all__ = ["TabletSplits"]

log = logging.getLogger(__name__)


class TabletSplits:
    """The splits of one tablet server's tablets, and the major compactions that follow them."""

    def __init__(
        self,
        server: TabletServer,
        *,
        clock: Clock,
        split_bytes: int,
        cooldown: float,
        concurrency: int = 1,
    ) -> None:
        self._server = server
        #: Splits that may run at once (``WorkerOptions.concurrent_splits``).
        self._slots = asyncio.Semaphore(concurrency)
        self._clock = clock
        self._split_bytes = split_bytes
        self._cooldown = cooldown
        #: Splits under way (awaited by the server's stop()).
        self.running: set[asyncio.Task[None]] = set()
        #: Post-split major compactions (cancelled by the server's stop(): optional work).
        self.compactions: set[asyncio.Task[None]] = set()
        self._splitting: set[tuple[str, str]] = set()
        #: Tablets whose compaction after a split runs or waits (one each).
        self._compacting: set[tuple[str, str]] = set()
        #: Monotonic time before which a tablet born of a split does not split again.
        self._split_after: dict[tuple[str, str], float] = {}

    def after_compaction(self, tablet: Tablet) -> None:
        """After each compaction of a tablet: split it in the background if it has grown
        past the split size. METADATA tablets are split only when created (Master's
        ``metadata_splits``), never here."""
        rec = tablet.record
        key = (rec.table_id, rec.tablet_id)
        if (
            self._server.stopping
            or mt.level(*key) != 3
            or key in self._splitting
            or self._server.tablets.get(key) is not tablet
            or self._clock.monotonic() < self._split_after.get(key, 0.0)
            or not splitting.should_split(rec, self._split_bytes)
        ):
            return
        if self._server.spawn(self.running, self._split(key)) is not None:
            self._splitting.add(key)

    def after_load(self, tablet: Tablet) -> None:
        """When a tablet starts being served here: one that still shares SSTables with its
        sibling (a split's child, here from the split, or moved or recovered before its
        major compaction ran where it was split) is major-compacted in the background, so
        its size becomes its own; until then it cannot split (``should_split``)."""
        rec = tablet.record
        key = (rec.table_id, rec.tablet_id)
        if mt.level(*key) != 3 or key in self._compacting or splitting.owns_its_sstables(rec):
            return
        task = self._server.spawn(self.compactions, self._compact_child(tablet))
        if task is not None:
            self._compacting.add(key)
            task.add_done_callback(lambda _: self._compacting.discard(key))

    async def _split(self, key: tuple[str, str]) -> None:
        try:
            # The slot before the tablet's lock: a split waiting its turn must not hold up a
            # move of its tablet.
            async with self._slots, self._server.tablet_lock(key):
                if not self._server.stopping:
                    await self._split_locked(key)
        except TabletStoreError as exc:
            log.warning("split of tablet %s/%s failed: %s", key[0], key[1], exc)
        finally:
            self._splitting.discard(key)

    # REQUIRES: self._server.tablet_lock(key) held.
    async def _split_locked(self, key: tuple[str, str]) -> None:
        """Split a served tablet in two (§5.2): stop its writes and flush it, claim the two
        children, commit them in place of the parent through the catalog (one atomic step),
        then serve them here. The master needs no notice: the children are claimed and
        located; its next round sees them in METADATA like any other tablet."""
        tablet = self._server.tablets.get(key)
        if tablet is None:
            return
        split_key = await tablet.split_key()
        if split_key is None:
            return
        ids = (f"t{uuid.uuid4().hex[:12]}", f"t{uuid.uuid4().hex[:12]}")
        async with contextlib.AsyncExitStack() as locks:
            # The children's locks, from before their claims until they are served: once the
            # commit is in METADATA a master may send a load of a child here (its round read
            # the claims before the split and the tablets after it). That load must wait and
            # find the child served, not open a second copy of it beside this one (writes
            # acknowledged by one copy would be missing from the other, whose flush could then
            # move the redo point past them) nor release the claim when it fails.
            for i in ids:
                await locks.enter_async_context(self._server.tablet_lock((key[0], i)))
            await self._split_and_serve(key, tablet, split_key, ids)

    async def _split_and_serve(
        self, key: tuple[str, str], tablet: Tablet, split_key: bytes, ids: tuple[str, str]
    ) -> None:
        # REQUIRES: the tablet locks of the parent (key) and of both children (ids) held.
        clock = self._clock
        began = clock.monotonic()
        outcome = "failed"
        try:
            # The children's claims first, while the parent still takes writes: nobody knows
            # their ids yet, and a split that fails releases them. One after the other: one
            # failing must not leave the other's still on its way (released before it lands).
            epochs = [await self._server.claim_new((key[0], i)) for i in ids]
            claimed = clock.monotonic()
            # Leaving this block normally closes the parent; raising resumes its writes.
            async with tablet.splitting() as parent:
                refused = tablet.writes_refused_since or clock.monotonic()
                flushed = clock.monotonic()
                children = splitting.split_records(
                    parent,
                    split_key,
                    left_id=ids[0],
                    right_id=ids[1],
                    left_epoch=epochs[0],
                    right_epoch=epochs[1],
                    location=self._server.address,
                    at=self._clock.time(),
                )
                try:
                    await self._server.catalog.replace_tablets([parent], list(children))
                    outcome = "committed"
                except TabletStoreError:
                    outcome = await self._split_outcome(children[1])
                    if outcome == "failed":
                        raise
                committed = clock.monotonic()
        except BaseException:
            for i in ids:
                await self._server.release_claim((key[0], i))
            raise
        self._server.tablets.pop(key, None)
        if outcome == "unknown":
            # Parent or children: whichever METADATA holds, the master assigns it. Neither
            # needs a log (the parent was flushed), so nothing is lost either way.
            log.error("split of tablet %s/%s may or may not have committed", *key)
            for k in (key, *((key[0], i) for i in ids)):
                await self._server.release_claim(k)
            return
        # Side by side: writes to either child are refused until it is served. The parent's
        # claim goes after: no lookup leads to it once METADATA holds the children.
        await asyncio.gather(*(self._serve_child(child) for child in children))
        served = clock.monotonic()
        await self._server.release_claim(key)

        def ms(since: float, until: float) -> int:
            return round(1000 * (until - since))

        log.info(
            "split tablet %s/%s at %r into %s, %s: writes refused for %d ms (the last writes"
            " flushed %d, committed %d, children served %d; before: children claimed %d,"
            " flushed ahead %d)",
            *key, split_key, *ids, ms(refused, served), ms(refused, flushed),
            ms(flushed, committed), ms(committed, served), ms(began, claimed),
            ms(claimed, refused),
        )  # fmt: skip

    async def _split_outcome(self, child: TabletRecord) -> str:
        """After a split commit raised: "committed" if it was applied anyway (an ambiguous
        failure), "failed" if not, "unknown" if METADATA cannot tell now."""
        try:
            stored = await self._server.catalog.get_tablet(child.table_id, child.tablet_id)
        except NotFound:
            return "failed"
        except TabletStoreError:
            return "unknown"
        return "committed" if stored.epoch == child.epoch else "failed"

    async def _serve_child(self, record: TabletRecord) -> None:
        """Serve a child of a split this worker committed (serving it major-compacts it in
        the background, :meth:`after_load`, so it stops sharing its parent's SSTables)."""
        key = (record.table_id, record.tablet_id)

        def cool_down(_: Tablet) -> None:
            # Before it serves: serving it checks at once whether it should split again.
            self._split_after[key] = self._clock.monotonic() + self._cooldown

        try:
            schema = self._server.newest_schema(
                await self._server.catalog.table_by_id(record.table_id)
            )
            await self._server.open_and_serve(record, schema, before_serving=cool_down)
        except TabletStoreError as exc:
            # Committed but not served: let the master assign it (it recovers from the logs).
            log.warning("serving split child %s failed: %s", record.tablet_id, exc)
            await self._server.release_claim(key)

    async def _compact_child(self, tablet: Tablet) -> None:
        try:
            await tablet.major_compact()
        except TabletStoreError as exc:
            log.info("major compaction after split of %s: %s", tablet.record.tablet_id, exc)
            return
        # Still too big? Split again once the cool-down is over (no compaction may come).
        key = (tablet.record.table_id, tablet.record.tablet_id)
        wait = self._split_after.get(key, 0.0) - self._clock.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        self._split_after.pop(key, None)
        self.after_compaction(tablet)
