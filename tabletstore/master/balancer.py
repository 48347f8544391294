"""The master's balancing and merging rounds: the I/O shell around the planners (§5, §5.2).

"The master is responsible for ... balancing tablet-server load" and initiates merges (§5.2).
Each round of the elected master, after assignment:

* **balance** -- ask every live worker for its tablets' sizes and request counts
  (``server_status``), feed them to :func:`tabletstore.master.assignment.plan` with ``balance=True``
  (moving only while the busiest worker carries over ``balance_ratio`` times the idlest one's
  load) and execute its moves: unload on the source with a flush (the tablet is minor-compacted and
  its record's logs cleared, so the new owner replays and fences nothing), then load on the
  target through the master's loads (``load``: bounded like every load, waited for at most
  ``load_wait`` seconds, then left in flight for the assignment rounds). Throttled: at most ``max_moves`` per round, no balancing for ``balance_cooldown``
  seconds after a round that moved something, and a moved tablet stays put for
  ``move_cooldown`` seconds. Request load is the rate since the previous round (workers
  report totals) above ``request_noise`` per second; below it placement follows size.
  METADATA tablets are never moved by balancing.
* **merge** -- :func:`tabletstore.master.tablet_merges.small_pairs` over every user table's records, of
  which :func:`tabletstore.master.tablet_merges.plan_merges` takes at most ``max_merges`` pairs that have
  been small for ``merge_after`` seconds. A merge unloads both tablets (flush), re-reads their
  records (both must be unclaimed and flushed: no logs), commits the merged record through
  ``Catalog.replace_tablets`` and runs an assignment so it is served at once.

Splits need nothing from the master: the worker that splits a tablet claims and serves the
children and records them in METADATA (§5.2); the next round sees them like any tablet.
"""

from __future__ import annotations

import logging
import math
import uuid
from collections.abc import Awaitable, Callable

from tabletstore.clock import Clock
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import NotFound, TabletStoreError
from tabletstore.master import assignment
from tabletstore.master import tablet_merges as merging
from tabletstore.metadata import rows as mt
from tabletstore.metadata.catalog import Catalog
from tabletstore.options import MasterOptions
from tabletstore.rpc.messages import ServerStatusRequest, UnloadTabletRequest
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Transport

__all__ = ["Balancer"]

log = logging.getLogger(__name__)

TabletKey = tuple[str, str]


class Balancer:
    """Balancing moves and merges of small tablets, one throttled round at a time."""

    def __init__(
        self,
        *,
        coordinator: Coordinator,
        catalog: Catalog,
        transport: Transport,
        clock: Clock,
        assign: Callable[[], Awaitable[int]],
        load: Callable[[str, str, TabletKey], Awaitable[bool]],
        options: MasterOptions | None = None,
        settled: Callable[[], bool] = lambda: True,
    ) -> None:
        """``assign`` runs an assignment round; ``load(worker id, address, tablet)`` loads a
        tablet and says whether it is served (Master.load_tablet); ``settled`` says whether the
        last assignment round found every tablet served (no moves or merges otherwise)."""
        self._settled = settled
        self._coord = coordinator
        self._catalog = catalog
        self._transport = transport
        self._clock = clock
        self._assign = assign
        self._load = load
        self.options = options or MasterOptions()
        self._last_moves = -math.inf
        self._last_status = -math.inf
        self._moved_at: dict[TabletKey, float] = {}
        self._requests_seen: dict[TabletKey, int] = {}
        self._small_since: dict[tuple[str, str, str], float] = {}

    async def run_round(self) -> tuple[int, int]:
        """One balancing and one merging round; returns (tablets moved, pairs merged). Errors
        end the round (logged); the next round starts from fresh state."""
        moved = merged = 0
        if not self._settled():
            return moved, merged
        try:
            moved = await self.balance()
            merged = await self.merge_small()
        except TabletStoreError as exc:
            log.warning("balancing round stopped: %s", exc)
        return moved, merged

    # ------------------------------------------------------------------ gathering

    async def _workers(self) -> dict[str, str]:
        kvs = await self._coord.get_prefix(paths.SERVERS)
        return {paths.parse_server(kv.key): kv.value.decode() for kv in kvs}

    def _worker(self, address: str) -> TabletService:
        return TABLET.client(self._transport, address)

    async def _claims(self) -> dict[TabletKey, str]:
        kvs = await self._coord.get_prefix(paths.claims_prefix())
        return {paths.parse_claim(kv.key): kv.value.decode() for kv in kvs}

    async def _loads(self, workers: dict[str, str]) -> list[assignment.TabletLoad] | None:
        """Every served tablet's load, or None when a worker did not answer (no moves on a
        partial picture)."""
        now = self._clock.monotonic()
        elapsed = max(now - self._last_status, 1e-3)
        loads: list[assignment.TabletLoad] = []
        seen: dict[TabletKey, int] = {}
        for wid, address in sorted(workers.items()):
            try:
                status = await self._worker(address).server_status(ServerStatusRequest())
            except TabletStoreError as exc:
                log.info("no balancing this round: worker %s did not answer: %s", wid, exc)
                return None
            for t in status.tablets:
                key = (t.table_id, t.tablet_id)
                seen[key] = t.requests
                recent = now - self._moved_at.get(key, -math.inf) < self.options.move_cooldown
                rate = max(0, t.requests - self._requests_seen.get(key, 0)) / elapsed
                loads.append(
                    assignment.TabletLoad(
                        t.table_id,
                        t.tablet_id,
                        wid,
                        size=t.sstable_bytes + t.memtable_bytes,
                        requests=int(max(0.0, rate - self.options.request_noise)),
                        movable=t.table_id != mt.METADATA_TABLE_ID and not recent,
                    )
                )
        self._requests_seen = seen
        self._last_status = now
        return loads

    # ------------------------------------------------------------------ balancing

    async def balance(self) -> int:
        """Execute the planner's moves (throttled, see the module docstring)."""
        now = self._clock.monotonic()
        if now - self._last_moves < self.options.balance_cooldown:
            return 0
        workers = await self._workers()
        if len(workers) < 2:
            return 0
        loads = await self._loads(workers)
        if loads is None:
            return 0
        plan = assignment.plan(
            list(workers),
            loads,
            balance=True,
            max_moves=self.options.max_moves,
            ratio=self.options.balance_ratio,
        )
        moved = 0
        for move in plan:
            if move.source is None:
                continue  # unassigned tablets are the assignment round's business
            if await self._move(move, workers):
                moved += 1
        if moved:
            self._last_moves = self._clock.monotonic()
        return moved

    async def _move(self, move: assignment.Assignment, workers: dict[str, str]) -> bool:
        """Unload (flush) on the source, then load on the target. A failed load leaves the
        tablet unassigned for the next assignment round."""
        assert move.source is not None
        key = (move.table_id, move.tablet_id)
        self._moved_at[key] = self._clock.monotonic()
        try:
            await self._worker(workers[move.source]).unload_tablet(
                UnloadTabletRequest(*key, flush=True)
            )
        except TabletStoreError as exc:
            log.warning("moving %s: unload on %s failed: %s", move.tablet_id, move.source, exc)
            return False
        if not await self._load(move.worker, workers[move.worker], key):
            log.warning(
                "moving %s: load on %s failed or is still running", move.tablet_id, move.worker
            )
            return False
        log.info("moved tablet %s from %s to %s", move.tablet_id, move.source, move.worker)
        return True

    # ------------------------------------------------------------------ merging

    async def merge_small(self) -> int:
        """Merge the planner's pairs of small adjacent tablets; returns how many merged."""
        after = self.options.merge_after
        if after is None:
            return 0
        candidates: list[merging.MergePair] = []
        for info in await self._catalog.list_tables():
            records = await self._catalog.list_tablets(info.table_id)
            candidates += merging.small_pairs(records, self.options.split_bytes)
        now = self._clock.monotonic()
        self._small_since = {p.key: self._small_since.get(p.key, now) for p in candidates}
        chosen = merging.plan_merges(
            candidates,
            self._small_since,
            now=now,
            merge_after=after,
            limit=self.options.max_merges,
        )
        done = 0
        for pair in chosen:
            if await self._merge(pair):
                done += 1
                self._small_since.pop(pair.key, None)
        if done:
            await self._assign()
        return done

    async def _merge(self, pair: merging.MergePair) -> bool:
        workers = await self._workers()
        claims = await self._claims()
        keys = [(r.table_id, r.tablet_id) for r in (pair.left, pair.right)]
        for key in keys:
            holder = claims.get(key)
            if holder in workers:
                await self._worker(workers[holder]).unload_tablet(
                    UnloadTabletRequest(*key, flush=True)
                )
        # Re-read: the records must be the unloaded, flushed ones (a worker may have split one
        # meanwhile, or an unload may have failed to flush).
        try:
            left, right = [await self._catalog.get_tablet(*key) for key in keys]
        except NotFound:
            return False
        claims = await self._claims()
        if any(key in claims for key in keys) or left.logs or right.logs:
            log.info("merge of %s and %s skipped: not cleanly unloaded", *[k[1] for k in keys])
            return False
        fresh = merging.small_pairs([left, right], self.options.split_bytes)
        if not fresh:
            return False
        merged = merging.merged_record(
            fresh[0], tablet_id=f"t{uuid.uuid4().hex[:12]}", at=self._clock.time()
        )
        await self._catalog.replace_tablets([left, right], [merged])
        log.info(
            "merged tablets %s and %s into %s", left.tablet_id, right.tablet_id, merged.tablet_id
        )
        return True
