"""The master's balancing and merging rounds: the I/O shell around the planners (§5, §5.2).

"The master is responsible for ... balancing tablet-server load" and initiates merges (§5.2).
Each round of the elected master, after assignment:

* **balance** -- ask every live worker for its tablets' sizes and request counts
  (``server_status``, :data:`POLL_CONCURRENCY` workers at once), feed them to
  :func:`tabletstore.master.assignment.plan` with ``balance=True``
  (moving only while the busiest worker carries over ``balance_ratio`` times the idlest one's
  load) and execute its moves side by side: unload on the source with a flush (the tablet is
  minor-compacted and its record's logs cleared, so the new owner replays and fences nothing),
  then load on the target through the master's loads (``load``: bounded like every load,
  waited for at most ``load_wait`` seconds, then left in flight for the assignment rounds).
  Throttled: at most ``max(max_moves, ceil(move_fraction x workers))`` moves per round and
  ``max_moves_per_worker`` given or taken by one worker (a large cluster converges as fast
  as a small one, and no worker flushes more than a few tablets at once), no balancing for
  ``balance_cooldown`` seconds after a round that moved something, none for
  ``balance_interval`` seconds after one that found nothing to move (a balanced cluster's
  workers are asked every 10 s, not every second), and a moved tablet stays put for
  ``move_cooldown`` seconds. Request load is the rate since the previous round (workers
  report totals) above ``request_noise`` per second; below it placement follows size.
  METADATA tablets are never moved by balancing.
* **merge** -- every ``merge_after / MERGE_SCANS`` seconds (not every round: a listing reads
  every METADATA row), :func:`tabletstore.master.tablet_merges.small_pairs` over every user
  table's records, of
  which :func:`tabletstore.master.tablet_merges.plan_merges` takes at most ``max_merges`` pairs that have
  been small for ``merge_after`` seconds. A merge unloads both tablets (flush), re-reads their
  records (both must be unclaimed and flushed: no logs), commits the merged record through
  ``Catalog.replace_tablets`` and runs an assignment so it is served at once.

Splits need nothing from the master: the worker that splits a tablet claims and serves the
children and records them in METADATA (§5.2); the next round sees them like any tablet.
"""

from __future__ import annotations

import asyncio
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
from tabletstore.rpc.messages import (
    ServerStatusRequest,
    ServerStatusResponse,
    UnloadTabletRequest,
)
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Transport

__all__ = ["Balancer"]

log = logging.getLogger(__name__)

TabletKey = tuple[str, str]

#: ``server_status`` requests a balancing round has in flight at once: the W workers' answers
#: take about W / this many round trips instead of W, while the master's event loop never
#: holds more than this many answers half-read.
POLL_CONCURRENCY = 32
#: Listings of every table for small pairs per ``merge_after`` window: a pair merges only
#: after staying small that long, so listing every METADATA row (O(N)) every round, each
#: second, finds nothing a listing every ``merge_after / MERGE_SCANS`` seconds does not, at
#: most that much later.
MERGE_SCANS = 10


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
        load: Callable[[str, str, TabletKey, bytes | None], Awaitable[bool]],
        options: MasterOptions | None = None,
        settled: Callable[[], bool] = lambda: True,
    ) -> None:
        """``assign`` runs an assignment round; ``load(worker id, address, tablet, end row)``
        loads a tablet and says whether it is served (Master.load_tablet); ``settled`` says
        whether the last assignment round found every tablet served (no moves or merges
        otherwise)."""
        self._settled = settled
        self._coord = coordinator
        self._catalog = catalog
        self._transport = transport
        self._clock = clock
        self._assign = assign
        self._load = load
        self.options = options or MasterOptions()
        self._last_moves = -math.inf
        self._last_idle = -math.inf
        self._last_status = -math.inf
        self._moved_at: dict[TabletKey, float] = {}
        self._requests_seen: dict[TabletKey, int] = {}
        #: Each served tablet's end row (its METADATA row key), as its worker last reported.
        self._end_rows: dict[TabletKey, bytes | None] = {}
        self._small_since: dict[tuple[str, str, str], float] = {}
        self._last_merge_scan = -math.inf

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
        partial picture). The workers are asked :data:`POLL_CONCURRENCY` at a time."""
        now = self._clock.monotonic()
        elapsed = max(now - self._last_status, 1e-3)
        slots = asyncio.Semaphore(POLL_CONCURRENCY)

        async def status(address: str) -> ServerStatusResponse:
            async with slots:
                return await self._worker(address).server_status(ServerStatusRequest())

        ordered = sorted(workers.items())
        answers = await asyncio.gather(
            *(status(address) for _, address in ordered), return_exceptions=True
        )
        loads: list[assignment.TabletLoad] = []
        seen: dict[TabletKey, int] = {}
        for (wid, _), answer in zip(ordered, answers, strict=True):
            if isinstance(answer, TabletStoreError):
                log.info("no balancing this round: worker %s did not answer: %s", wid, answer)
                return None
            if isinstance(answer, BaseException):
                raise answer
            for t in answer.tablets:
                key = (t.table_id, t.tablet_id)
                seen[key] = t.requests
                self._end_rows[key] = t.end_row
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
        self._end_rows = {k: self._end_rows[k] for k in seen}
        self._last_status = now
        return loads

    def moves_per_round(self, workers: int) -> int:
        """The most moves one balancing round makes among ``workers`` live workers."""
        return max(self.options.max_moves, math.ceil(self.options.move_fraction * workers))

    # ------------------------------------------------------------------ balancing

    async def balance(self) -> int:
        """Execute the planner's moves (throttled, see the module docstring)."""
        now = self._clock.monotonic()
        if now - self._last_moves < self.options.balance_cooldown:
            return 0
        if now - self._last_idle < self.options.balance_interval:
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
            max_moves=self.moves_per_round(len(workers)),
            ratio=self.options.balance_ratio,
            max_moves_per_worker=self.options.max_moves_per_worker,
        )
        # Unassigned tablets are the assignment round's business. The moves involve different
        # workers (at most max_moves_per_worker each), so they run side by side.
        done = await asyncio.gather(
            *(self._move(move, workers) for move in plan if move.source is not None)
        )
        moved = sum(done)
        if moved:
            self._last_moves = self._clock.monotonic()
        elif not done:
            self._last_idle = self._clock.monotonic()  # balanced: ask again in a while
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
        if not await self._load(move.worker, workers[move.worker], key, self._end_rows[key]):
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
        if self._clock.monotonic() - self._last_merge_scan < after / MERGE_SCANS:
            return 0
        self._last_merge_scan = self._clock.monotonic()
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
