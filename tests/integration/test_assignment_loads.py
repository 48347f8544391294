"""The master's tablet loads, in one process.

Recovery took 17 to 83 s per worker kill because the master loaded tablets one at a time, each
load replaying the dead worker's log, and one slow load held every later one back. The loads of
one level now go out concurrently: a load that hangs leaves the others served, is not sent
twice while in flight, and a load that fails is sent again in the next round.

The cluster is the embedded stack's pieces wired by hand (memory store and coordinator, an
in-process transport that can hold or fail chosen loads), so rounds are driven by the test.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from tabletstore.commitlog.sorting import load_plan
from tabletstore.coordination import paths
from tabletstore.coordination.base import KeyValue
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.errors import InvalidArgument, TabletStoreError, Unavailable
from tabletstore.keys import Cell
from tabletstore.master.log_recovery import InProcessSortExecutor, LogRecovery
from tabletstore.master.master import Master
from tabletstore.metadata import rows as mt
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.options import IN_PROCESS_LEASE, MasterOptions, WorkerOptions
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.messages import (
    CreateTableRequest,
    LoadTabletAtRequest,
    LoadTabletRequest,
    UnloadTabletRequest,
)
from tabletstore.rpc.services import TABLET, TabletService
from tabletstore.rpc.transport import Method
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.worker.tablet_server import TabletServer

pytestmark = pytest.mark.timeout(120)

#: The user table's tablets: create_table names them t00000, t00001, ... in row order.
SPLITS = [b"d", b"h", b"m", b"r"]
TABLETS = {f"t{i:05d}" for i in range(len(SPLITS) + 1)}


#: The master's loads: ``load_tablet_at`` (``load_tablet`` to a worker of the previous version).
LOADS = (TABLET.method(TabletService.load_tablet), TABLET.method(TabletService.load_tablet_at))
READ_ROWS = TABLET.method(TabletService.read_rows)


class ScriptedLoads(InProcessTransport):
    """An in-process transport whose ``load_tablet`` of chosen user tablets hangs until
    released, or fails a number of times; it counts the loads sent per tablet."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: dict[str, asyncio.Event] = {}
        self.fail: Counter[str] = Counter()
        self.sent: Counter[str] = Counter()
        #: METADATA rows every read_rows streamed.
        self.metadata_rows = 0

    def stream(
        self, address: str, method: Method, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[Any]:
        items = super().stream(address, method, request, timeout=timeout)
        if method is not READ_ROWS or request.table_id != mt.METADATA_TABLE_ID:
            return items
        return self._counted(items)

    async def _counted(self, items: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for item in items:
            self.metadata_rows += len(getattr(item, "rows", ()))
            yield item

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        if method in LOADS and not request.table_id.startswith("!"):
            assert isinstance(request, LoadTabletRequest | LoadTabletAtRequest)
            tablet = request.tablet_id
            self.sent[tablet] += 1
            if self.fail[tablet] > 0:
                self.fail[tablet] -= 1
                raise Unavailable(f"load of {tablet} failed on purpose")
            gate = self.hold.get(tablet)
            if gate is not None:
                await gate.wait()
        return await super().call(address, method, request, timeout=timeout)


async def eventually(check: Callable[[], Awaitable[bool]], *, deadline: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        await asyncio.sleep(0.02)


async def new_worker(
    name: str, store: MemoryObjectStore, coord: MemoryCoordinator, transport: ScriptedLoads
) -> TabletServer:
    worker = TabletServer(
        name,
        f"inproc://{name}",
        store=store,
        coordinator=coord,
        transport=transport,
        options=WorkerOptions(lease=IN_PROCESS_LEASE),
    )
    await worker.start()
    transport.register(worker.address, TABLET.handlers(worker.services))
    return worker


@dataclass
class Stack:
    master: Master
    transport: ScriptedLoads
    store: MemoryObjectStore
    coord: MemoryCoordinator
    workers: list[TabletServer]

    async def join(self) -> TabletServer:
        """Start one more worker."""
        worker = await new_worker(f"w{len(self.workers)}", self.store, self.coord, self.transport)
        self.workers.append(worker)
        return worker


@asynccontextmanager
async def stack(options: MasterOptions) -> AsyncIterator[tuple[Master, TabletServer, Stack]]:
    """A master and one worker, which the first round gives the root and METADATA."""
    store, coord, transport = MemoryObjectStore(), MemoryCoordinator(), ScriptedLoads()
    first = await new_worker("w0", store, coord, transport)
    master = Master(coordinator=coord, transport=transport, options=options)
    s = Stack(master, transport, store, coord, [first])
    try:
        await master.assign()
        yield master, first, s
    finally:
        for gate in transport.hold.values():
            gate.set()
        await master.close()
        for server in reversed(s.workers):
            await server.stop(flush=True)
        await coord.close()


def served(worker: TabletServer) -> set[str]:
    return {tablet for (table, tablet) in worker.tablets if not table.startswith("!")}


SCHEMA = TableSchema(name="t", families={"f": ColumnFamily(name="f")})


async def test_a_hanging_load_does_not_hold_back_the_others() -> None:
    async with stack(MasterOptions(load_wait=0.5)) as (master, worker, s):
        transport = s.transport
        transport.hold["t00002"] = asyncio.Event()
        # create_table assigns the new tablets (one assignment round) before it answers.
        create = asyncio.ensure_future(master.create_table(CreateTableRequest.of(SCHEMA, SPLITS)))

        async def others_served() -> bool:
            return served(worker) == TABLETS - {"t00002"}

        await eventually(others_served, deadline=60, what="every tablet but the held one served")
        await asyncio.wait_for(create, 60)  # the round went on without the held load
        assert "t00002" not in served(worker)
        # Later rounds do not send the load in flight again.
        await master.assign()
        assert transport.sent["t00002"] == 1
        transport.hold["t00002"].set()

        async def all_served() -> bool:
            return served(worker) == TABLETS

        await eventually(all_served, deadline=60, what="the held tablet served once released")
        await master.assign()
        assert transport.sent == Counter(dict.fromkeys(TABLETS, 1))


async def test_a_load_naming_its_row_reads_that_row_not_its_whole_table() -> None:
    """A load request names the tablet by id, while its METADATA row's key is its end row: a
    worker given only the id reads every row of the table (K rows per load, K^2 to load a
    table of K tablets); ``load_tablet_at`` names the end row too, and the worker reads one."""
    splits = [b"k%03d" % i for i in range(1, 30)]
    async with stack(MasterOptions()) as (master, worker, s):
        await master.create_table(CreateTableRequest.of(SCHEMA, splits))
        table_id = (await master.catalog.get_table("t")).table_id
        records = await master.catalog.list_tablets(table_id)
        assert len(records) == 30
        rec = records[7]
        key = (rec.table_id, rec.tablet_id)
        # A second worker loads it: its METADATA reads go to the first, over the transport.
        second = await s.join()
        await worker.services.unload_tablet(UnloadTabletRequest(*key))
        s.transport.metadata_rows = 0
        await second.services.load_tablet_at(LoadTabletAtRequest(*key, rec.end_row))
        one = s.transport.metadata_rows
        assert key in second.tablets
        # A master of the previous protocol version sends load_tablet: still served.
        await second.services.unload_tablet(UnloadTabletRequest(*key))
        s.transport.metadata_rows = 0
        await second.services.load_tablet(LoadTabletRequest(*key))
        whole = s.transport.metadata_rows
        assert key in second.tablets
        assert one <= 2, f"{one} METADATA rows read to load one tablet"
        assert whole >= len(records)


async def test_the_master_loads_with_the_row_and_falls_back_for_an_older_worker() -> None:
    """The master sends load_tablet_at; a worker that has no such method (the previous
    protocol version refuses it before anything is sent: Unimplemented) gets load_tablet."""
    async with stack(MasterOptions()) as (master, worker, s):
        sent: list[str] = []
        handlers = dict(TABLET.handlers(worker.services))
        del handlers["load_tablet_at"]
        for name in ("load_tablet", "load_tablet_at"):
            if name in handlers:
                inner = handlers[name]

                async def counted(req: Any, inner: Any = inner, name: str = name) -> Any:
                    sent.append(name)
                    return await inner(req)

                handlers[name] = counted
        s.transport.register(worker.address, handlers)
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        assert served(worker) == TABLETS
        assert sent == ["load_tablet"] * len(TABLETS)
        # A worker of this version is sent load_tablet_at: move one tablet to it.
        second = await s.join()
        table_id = (await master.catalog.get_table("t")).table_id
        rec = (await master.catalog.list_tablets(table_id))[0]
        await worker.services.unload_tablet(UnloadTabletRequest(rec.table_id, rec.tablet_id))
        assert await master.load_tablet(
            second.worker_id, second.address, (rec.table_id, rec.tablet_id), rec.end_row
        )
        assert (rec.table_id, rec.tablet_id) in second.tablets
        assert sent == ["load_tablet"] * len(TABLETS)


async def test_a_failed_load_makes_the_next_periodic_round_run() -> None:
    """A load that fails before its worker claims the tablet changes nothing the assignment
    watch sees; the round that sent it is not settled, so the next periodic round runs."""
    async with stack(MasterOptions()) as (master, worker, s):
        await master.assign(if_changed=True)
        transport = s.transport
        transport.fail["t00001"] = 1
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        assert served(worker) == TABLETS - {"t00001"}
        await master.assign(if_changed=True)
        assert served(worker) == TABLETS
        assert transport.sent["t00001"] == 2


async def test_a_failed_load_is_sent_again_in_the_next_round() -> None:
    async with stack(MasterOptions()) as (master, worker, s):
        transport = s.transport
        transport.fail["t00001"] = 1
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        assert served(worker) == TABLETS - {"t00001"}
        await master.assign()
        assert served(worker) == TABLETS
        assert transport.sent["t00001"] == 2


async def test_loads_to_one_worker_are_bounded() -> None:
    """With at most 2 loads in flight per worker, 2 held loads keep the rest waiting; the
    others go out as soon as they are released."""
    options = MasterOptions(load_wait=0.2, max_loads_per_worker=2)
    async with stack(options) as (master, worker, s):
        transport = s.transport
        transport.hold = {t: asyncio.Event() for t in ("t00000", "t00001")}
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        assert sum(transport.sent.values()) == 2  # the other three wait for a slot
        for gate in transport.hold.values():
            gate.set()

        async def all_served() -> bool:
            return served(worker) == TABLETS

        await eventually(all_served, deadline=60, what="every tablet served once released")
        assert transport.sent == Counter(dict.fromkeys(TABLETS, 1))


async def test_a_balancing_move_whose_load_hangs_does_not_stall_the_master() -> None:
    """A move unloads the tablet on its source, then loads it on the target: a load that hangs
    there is waited for at most load_wait (the master's loop goes on) and stays in flight,
    so the assignment rounds neither wait for it nor send it again."""
    options = MasterOptions(load_wait=0.2, balance_cooldown=0.0, merge_after=None)
    async with stack(options) as (master, first, s):
        transport = s.transport
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        second = await s.join()
        transport.hold = {t: asyncio.Event() for t in TABLETS}
        before = sum(transport.sent.values())
        moved, _ = await asyncio.wait_for(master.balancer.run_round(), 60)
        assert moved == 0  # the loads are held: not moved yet
        held = sum(transport.sent.values()) - before
        assert held >= 1
        in_flight = TABLETS - served(first)
        assert len(in_flight) == held and not served(second)
        await master.assign()
        assert sum(transport.sent.values()) - before == held  # not sent again
        for gate in transport.hold.values():
            gate.set()

        async def moved_in() -> bool:
            return served(second) == in_flight

        await eventually(moved_in, deadline=60, what="the moved tablets served on w1")


def test_bad_load_options_are_named() -> None:
    with pytest.raises(InvalidArgument, match="max_loads_per_worker"):
        Master(
            coordinator=MemoryCoordinator(),
            transport=InProcessTransport(),
            options=MasterOptions(max_loads_per_worker=0),
        )


async def test_one_worker_replays_the_tablets_it_loads_side_by_side() -> None:
    """The loads a worker runs at once replay their logs concurrently: each replay here
    waits until both have started, which one-after-the-other replays never reach."""
    async with stack(MasterOptions()) as (master, first, s):
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        table_id = next(table for (table, _) in first.tablets if not table.startswith("!"))
        second = await s.join()
        started = 0
        both = asyncio.Event()

        async def gated_replay(record: TabletRecord) -> AsyncIterator[Cell]:
            nonlocal started
            started += 1
            if started == 2:
                both.set()
            await both.wait()
            for _ in ():
                yield _

        second._replay = gated_replay  # type: ignore[method-assign]
        keys = [(table_id, "t00000"), (table_id, "t00001")]
        for key in keys:
            await first.services.unload_tablet(UnloadTabletRequest(*key))
        loads = (second.services.load_tablet(LoadTabletRequest(*key)) for key in keys)
        await asyncio.wait_for(asyncio.gather(*loads), 60)
        assert set(keys) <= set(second.tablets)


class ListingOrder(MemoryCoordinator):
    """Records which of the claims and the servers directory each listing reads."""

    def __init__(self) -> None:
        super().__init__()
        self.listed: list[str] = []

    async def get_prefix(self, prefix: str) -> list[KeyValue]:
        if prefix in (paths.SERVERS, paths.claims_prefix()):
            self.listed.append(prefix)
        return await super().get_prefix(prefix)


async def test_a_round_reads_the_claims_before_the_servers_directory() -> None:
    """A worker registers before it claims, so claims listed first have every live holder in
    the servers listing that follows; listed the other way round, a worker that registered and
    claimed in between looks dead, its tablet orphaned and its live log due for recovery."""
    coord, store, transport = ListingOrder(), MemoryObjectStore(), ScriptedLoads()
    worker = await new_worker("w0", store, coord, transport)
    master = Master(coordinator=coord, transport=transport, options=MasterOptions())
    try:
        await master.assign()
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        coord.listed.clear()
        await master.assign()
        assert coord.listed.index(paths.claims_prefix()) < coord.listed.index(paths.SERVERS)
    finally:
        await master.close()
        await worker.stop(flush=True)
        await coord.close()


async def test_a_tablet_claimed_after_the_rounds_claims_read_is_not_loaded_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A round reads the claims first and the tablets later: a tablet claimed in between (a
    split's child, claimed by its splitter before the split is committed) looks unclaimed. The
    round reads the claims again before it sends loads, and sends none for it."""
    async with stack(MasterOptions()) as (master, worker, s):
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        assert served(worker) == TABLETS
        table_id = next(t for (t, _) in worker.tablets if not t.startswith("!"))
        read_claims = master._claims
        reads = 0

        async def claims_without_t00002_at_first() -> dict[tuple[str, str], str]:
            nonlocal reads
            reads += 1
            claims = await read_claims()
            if reads == 1:
                del claims[(table_id, "t00002")]  # as if claimed just after this read
            return claims

        monkeypatch.setattr(master, "_claims", claims_without_t00002_at_first)
        await master.assign()
        assert s.transport.sent == Counter(dict.fromkeys(TABLETS, 1))
        assert served(worker) == TABLETS


class PlanBeforeRoot(ScriptedLoads):
    """Notes, when the root tablet's load is sent, whether a chosen log's sort plan exists."""

    def __init__(self, store: MemoryObjectStore) -> None:
        super().__init__()
        self.store = store
        self.watch: LogRef | None = None
        self.plan_at_root_load: list[bool] = []

    async def call(
        self,
        address: str,
        method: Method,
        request: Any,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 (the Transport signature)
    ) -> Any:
        if method in LOADS and request.tablet_id == mt.ROOT_TABLET_ID and self.watch is not None:
            key = layout.recovery_plan_key(self.watch.worker_id, self.watch.incarnation)
            self.plan_at_root_load.append(await self.store.head(key) is not None)
        return await super().call(address, method, request, timeout=timeout)


async def test_a_dead_workers_log_is_planned_before_its_root_tablet_is_loaded() -> None:
    """The worker holding the root, METADATA and user tablets dies: the master plans the sort
    of its log before it sends the root's load (§6), from the tablets it listed last round,
    so the root and METADATA replay from runs too, and every tablet is served again with its
    records (the METADATA rows the dead worker logged included)."""
    store, coord = MemoryObjectStore(), MemoryCoordinator()
    transport = PlanBeforeRoot(store)
    first = await new_worker("w0", store, coord, transport)
    recovery = LogRecovery(
        store, InProcessSortExecutor(store), coord, task_bytes=1 << 20, early_system_plans=True
    )
    master = Master(coordinator=coord, transport=transport, recovery=recovery)
    workers = [first]
    try:
        await master.assign()
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        await master.assign()
        assert first.lease is not None and first.commit_log_stats is not None
        assert first.commit_log_stats.segments > 0
        dead = LogRef("w0", first._log.log_ref.incarnation if first._log else 0)
        workers.append(await new_worker("w1", store, coord, transport))
        transport.watch = dead
        await first.lease.revoke()  # w0 is gone: its claims and its servers entry with it
        await master.assign()
        assert transport.plan_at_root_load == [True]
        plan = await load_plan(store, dead.worker_id, dead.incarnation)
        assert plan is not None
        assert {t.tablet_id for t in plan.tablets} >= {mt.ROOT_TABLET_ID, *TABLETS}

        async def all_served() -> bool:
            await master.assign()
            return served(workers[1]) == TABLETS

        await eventually(all_served, deadline=60, what="every user tablet served by w1")
        assert (mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID) in workers[1].tablets
    finally:
        await master.close()
        for server in reversed(workers):
            with contextlib.suppress(TabletStoreError):
                await server.stop(flush=False)
        await coord.close()


async def test_a_load_whose_caller_leaves_runs_on_and_the_next_call_joins_it() -> None:
    """A master SIGKILLed mid-recovery drops its connections, which cancels its load_tablet
    calls on the workers. Before the fix the load was cancelled with it (its replay
    thrown away, its claim released) and the next master's load replayed the logs again; now
    the load runs on, keeps its claim, and the next master's call joins it: one replay."""
    async with stack(MasterOptions()) as (master, first, s):
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        table_id = next(table for (table, _) in first.tablets if not table.startswith("!"))
        second = await s.join()
        replays = 0
        release = asyncio.Event()
        replaying = asyncio.Event()

        async def gated_replay(record: TabletRecord) -> AsyncIterator[Cell]:
            nonlocal replays
            replays += 1
            replaying.set()
            await release.wait()
            for _ in ():
                yield _

        second._replay = gated_replay  # type: ignore[method-assign]
        key = (table_id, "t00000")
        await first.services.unload_tablet(UnloadTabletRequest(*key))
        old_master = asyncio.create_task(second.services.load_tablet(LoadTabletRequest(*key)))
        await asyncio.wait_for(replaying.wait(), 30)
        old_master.cancel()  # its connection dropped
        with contextlib.suppress(asyncio.CancelledError):
            await old_master
        # The claim stays with the worker still loading: no other worker is given the tablet.
        claim = await s.coord.get(paths.claim(*key))
        assert claim is not None and claim.value == second.worker_id.encode()
        new_master = asyncio.create_task(second.services.load_tablet(LoadTabletRequest(*key)))
        release.set()
        await asyncio.wait_for(new_master, 30)
        assert key in second.tablets
        assert replays == 1, f"the dead log was replayed {replays} times"


async def test_a_dead_workers_tablets_go_to_one_worker_that_reads_its_log_once() -> None:
    """Owner affinity (§6): the tablets of a dead worker whose log is sorted in one task all go
    to one survivor (the planner alone spreads them over both), which then reads the log's
    records once: the root and METADATA from its shared read of the log, the user tablets from
    it too or from the runs it sorted, kept in its memory."""
    store, coord, transport = MemoryObjectStore(), MemoryCoordinator(), ScriptedLoads()
    first = await new_worker("w0", store, coord, transport)
    recovery = LogRecovery(store, InProcessSortExecutor(store), coord, task_bytes=1 << 20)
    master = Master(coordinator=coord, transport=transport, recovery=recovery)
    workers = [first]
    try:
        await master.assign()
        await master.create_table(CreateTableRequest.of(SCHEMA, SPLITS))
        await master.assign()
        assert served(first) == TABLETS
        assert first.lease is not None
        for name in ("w1", "w2"):
            workers.append(await new_worker(name, store, coord, transport))
        await first.lease.revoke()

        async def all_served() -> bool:
            await master.assign()
            return served(workers[1]) | served(workers[2]) == TABLETS

        await eventually(all_served, deadline=60, what="every user tablet served again")
        owner = workers[1] if served(workers[1]) else workers[2]
        assert served(owner) == TABLETS, "the dead worker's tablets were spread"
        assert (mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID) in owner.tablets
    finally:
        await master.close()
        for server in reversed(workers):
            with contextlib.suppress(TabletStoreError):
                await server.stop(flush=False)
        await coord.close()
