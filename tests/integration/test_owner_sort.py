"""Owner affinity for a dead log of several sort tasks (§6), in process: a master, and
workers each with its own sorter, its own counted view of one object store (so one worker's
cache of recovery objects does not serve another's reads, as between processes) and a real
process pool for the sorts it owns.

A worker dies with a log big enough for several sort tasks. Before, every worker sorted some
of its tasks and the tablets were spread, so each new owner read runs written elsewhere: about
twice the log read in the cluster. Now the whole log goes to one owner, which sorts every task
on its pool, keeps the runs in memory and replays its tablets from them: the log is read about
once, and every acknowledged write is served again. The second case shrinks the owner's memory
for runs far below the log: the runs past it wait in its local spill directory
(``commitlog.spill``), and the log is still read about once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

import tabletstore.worker.sorter as sorter_module
from tabletstore.client.client import AsyncClient
from tabletstore.client.table import AsyncTable
from tabletstore.commitlog.sorting import load_plan, task_done
from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import SetCell
from tabletstore.errors import TabletStoreError
from tabletstore.keys import Cell
from tabletstore.master.master import Master
from tabletstore.master.master_process import make_recovery
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.options import IN_PROCESS_LEASE, MasterOptions, WorkerOptions
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.messages import LoadTabletRequest, UnloadTabletRequest
from tabletstore.rpc.services import TABLET
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.worker.sorter import Sorter
from tabletstore.worker.tablet_server import TabletServer

pytestmark = pytest.mark.timeout(300)

SPLITS = [b"d", b"h", b"m", b"r"]  # 5 user tablets
ROWS = 300
VALUE = b"v" * 400
#: Small sort tasks, so the dead log (about 150 KB) is cut into several.
TASK_BYTES = 16 * 1024


async def eventually(check: Callable[[], Awaitable[bool]], *, deadline: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline
    while not await check():
        if loop.time() > end:
            raise AssertionError(f"not within {deadline} s: {what}")
        await asyncio.sleep(0.05)


def _row(i: int) -> bytes:
    return b"%c%04d" % (ord("a") + i % 26, i)


#: The owner's memory for the runs it sorted in the second case: a tenth of the log.
SMALL_MEMORY = 16 * 1024


class OwnerCluster:
    """A master and in-process workers over one memory store, each worker with its own
    counted view of the store and (unless told not to) its own sorter."""

    def __init__(self, tmp_path: Path, *, memory_bytes: int | None = None) -> None:
        self.mem = MemoryObjectStore(shared=False)
        self.coord = MemoryCoordinator()
        self.transport = InProcessTransport()
        self.views: dict[str, InstrumentedObjectStore] = {}
        self.workers: dict[str, TabletServer] = {}
        self.sorters: dict[str, Sorter] = {}
        self._running: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()
        self._tmp = tmp_path
        self._memory = memory_bytes
        self.views["master"] = InstrumentedObjectStore(self.mem)
        # The owner's bound shrunk too (the log is about 150 KB).
        options = MasterOptions(
            sort_task_bytes=TASK_BYTES, balance_cooldown=3600.0, sort_owner_bytes=1024 * 1024
        )
        recovery = make_recovery("workers", self.views["master"], "memory://", self.coord, options)
        self.master = Master(
            coordinator=self.coord, transport=self.transport, options=options, recovery=recovery
        )
        self.client = AsyncClient(
            catalog=self.master.catalog, transport=self.transport, admin=self.master
        )

    async def start_worker(self, name: str, *, sorter: bool = True) -> TabletServer:
        view = self.views[name] = InstrumentedObjectStore(self.mem)
        options = WorkerOptions(
            lease=IN_PROCESS_LEASE,
            # No log trimming: the dead log keeps every write (a long tail to sort).
            log_trim_interval=None,
            sort_spill_dir=str(self._tmp),
        )
        if self._memory is not None:
            options = dataclasses.replace(options, sort_memory_bytes=self._memory)
        worker = TabletServer(
            name,
            f"inproc://{name}",
            store=view,
            coordinator=self.coord,
            transport=self.transport,
            options=options,
        )
        await worker.start()
        self.transport.register(worker.address, TABLET.handlers(worker.services))
        self.workers[name] = worker
        if sorter:
            self.start_sorter(name)
        return worker

    def start_sorter(self, name: str) -> None:
        worker = self.workers[name]
        assert worker.lease is not None
        sorter = Sorter(
            name, self.views[name], self.coord, worker.lease, poll=0.05, shared=worker.sorts
        )
        self._running.append(asyncio.create_task(sorter.run(self._stop)))
        self.sorters[name] = sorter

    async def victim_with_rows(self) -> tuple[AsyncTable, TabletServer, set[tuple[str, str]]]:
        """Table ``t`` whose every user tablet is served by worker ``w1`` (``w0`` keeps the
        system tablets, whose direct replay would read the log besides the sort), with
        :data:`ROWS` acknowledged rows in w1's log."""
        w0 = await self.start_worker("w0")  # the root and METADATA
        await self.master.assign()
        table = await self.client.create_table("t", ["f"], split_keys=SPLITS)
        await self.master.assign()
        victim = await self.start_worker("w1")
        records = await self.master.catalog.list_tablets((await self.client._info("t")).table_id)
        for rec in records:
            if rec.location == w0.address:
                await TABLET.client(self.transport, w0.address).unload_tablet(
                    UnloadTabletRequest(rec.table_id, rec.tablet_id)
                )
                await TABLET.client(self.transport, victim.address).load_tablet(
                    LoadTabletRequest(rec.table_id, rec.tablet_id)
                )
        user = {(t, tablet) for (t, tablet) in victim.tablets if t != METADATA_TABLE_ID}
        assert len(user) == len(SPLITS) + 1
        for batch in range(0, ROWS, 10):  # about one log segment per batch (group commit)
            await asyncio.gather(
                *(
                    table.mutate_row(_row(i), [SetCell("f", b"q", VALUE + _row(i))])
                    for i in range(batch, batch + 10)
                )
            )
        return table, victim, user

    async def dead_log(self, victim: TabletServer) -> LogRef:
        kv = await self.coord.get(f"settings/incarnation.{victim.worker_id}")
        assert kv is not None
        return LogRef(victim.worker_id, int(kv.value))

    async def close(self) -> None:
        self._stop.set()
        for task in self._running:
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
        await self.master.close()
        for worker in reversed(list(self.workers.values())):
            with contextlib.suppress(TabletStoreError):
                await worker.stop(flush=False)
        await self.coord.close()


async def all_rows_served(table: AsyncTable) -> None:
    """Every acknowledged write is served again."""
    rows = {r.key: r.latest("f", b"q") async for r in table.read_rows()}
    assert rows == {_row(i): VALUE + _row(i) for i in range(ROWS)}


def spill_directories(tmp_path: Path) -> list[str]:
    return [n for n in os.listdir(tmp_path) if n.startswith("tabletstore-runs-")]


@pytest.mark.parametrize("spill", [False, True], ids=["memory", "spilled-to-disk"])
async def test_a_dead_log_of_several_tasks_is_read_about_once_by_its_owner(
    spill: bool, tmp_path: Path
) -> None:
    cluster = OwnerCluster(tmp_path, memory_bytes=SMALL_MEMORY if spill else None)
    workers, views, master = cluster.workers, cluster.views, cluster.master
    try:
        table, victim, user = await cluster.victim_with_rows()
        await cluster.start_worker("w2")
        assert victim.lease is not None
        for view in views.values():
            view.reset()
        await victim.lease.revoke()  # dead: its log is fenced and sorted

        async def recovered() -> bool:
            await master.assign()
            return all(
                any(key in w.tablets for w in (workers["w0"], workers["w2"])) for key in user
            )

        await eventually(recovered, deadline=120, what="every user tablet served again")
        dead = await cluster.dead_log(victim)
        plan = await load_plan(cluster.mem, dead.worker_id, dead.incarnation)
        assert plan is not None and len(plan.tasks) >= 3, plan
        log_bytes = 0
        async for info in cluster.mem.list(layout.log_prefix(dead.worker_id, dead.incarnation)):
            log_bytes += info.size
        read = sum(v.stats().bytes_read for name, v in views.items() if name != "w1")
        # The log's records once (by the owner's sort), plus plans, manifests, METADATA rows.
        assert read <= 1.2 * log_bytes, (read, log_bytes)
        owners = {w for key in user for w in ("w0", "w2") if key in workers[w].tablets}
        assert len(owners) == 1, f"the dead log's tablets were spread over {owners}"
        kept = workers[owners.pop()].sort_spill.stats
        assert kept.hits > 0 and kept.bad_copies == 0 and kept.not_kept == 0
        if spill:
            # The log is ten times the owner's memory for runs: most of them waited on disk.
            assert log_bytes > 5 * SMALL_MEMORY
            assert kept.kept_on_disk > kept.kept_in_memory > 0
        await all_rows_served(table)
    finally:
        await cluster.close()
    # Every worker removed its spill directory when it stopped.
    assert spill_directories(tmp_path) == []


async def test_when_the_owner_dies_before_sorting_the_next_owner_recovers_the_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker the master chose to own a dead log dies itself before sorting it (its loads
    of the log's tablets hang, then its lease ends). The master's next rounds choose another
    owner (Master._owners), re-reserve the tasks still published for it (LogRecovery) and
    load the log's tablets there, which sorts every task itself (the grace other sorters give
    a reserved task is an hour here, so nothing else could), reads the log about once and
    serves every acknowledged write again."""
    monkeypatch.setattr(sorter_module, "OWNER_GRACE", 3600.0)
    cluster = OwnerCluster(tmp_path)
    master, workers, views = cluster.master, cluster.workers, cluster.views
    hang = asyncio.Event()
    try:
        table, victim, user = await cluster.victim_with_rows()
        # Two candidates; w2 (fewest claims, then first by name) is chosen, and hangs.
        first = await cluster.start_worker("w2", sorter=False)
        await cluster.start_worker("w3")

        async def hanging_replay(record: TabletRecord) -> AsyncIterator[Cell]:
            await hang.wait()
            return
            yield

        first._replay = hanging_replay  # type: ignore[method-assign]
        assert victim.lease is not None and first.lease is not None
        await victim.lease.revoke()
        dead = await cluster.dead_log(victim)
        plan = await load_plan(cluster.mem, dead.worker_id, dead.incarnation)

        async def reserved_for_w2() -> bool:
            await master.assign()
            tasks = await cluster.coord.get_prefix(paths.SORTS)
            return bool(tasks) and all(json.loads(kv.value).get("owner") == "w2" for kv in tasks)

        await eventually(reserved_for_w2, deadline=60, what="the tasks reserved for w2")
        assert master.recovery is not None and master.recovery.owner(dead) == "w2"
        plan = await load_plan(cluster.mem, dead.worker_id, dead.incarnation)
        assert plan is not None and len(plan.tasks) >= 3, plan
        assert not [t for t in plan.tasks if await task_done(cluster.mem, plan, t)]
        for view in views.values():
            view.reset()
        await first.lease.revoke()  # the owner dies before sorting anything

        async def recovered() -> bool:
            await master.assign()
            return all(key in workers["w3"].tablets for key in user)

        await eventually(recovered, deadline=120, what="every user tablet served on w3")
        assert master.recovery.owner(dead) == "w3"
        assert all([await task_done(cluster.mem, plan, t) for t in plan.tasks])
        # w3 replayed from the runs it sorted (not a direct replay of the log), reading it once.
        assert workers["w3"].sort_spill.stats.hits > 0
        log_bytes = sum(
            [
                info.size
                async for info in cluster.mem.list(
                    layout.log_prefix(dead.worker_id, dead.incarnation)
                )
            ]
        )
        assert views["w3"].stats().bytes_read <= 1.2 * log_bytes
        await all_rows_served(table)
    finally:
        hang.set()
        await cluster.close()
