"""Owner affinity for a dead log of several sort tasks (§6, issue 13), in process: a master, and
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
import os
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tabletstore.client.client import AsyncClient
from tabletstore.commitlog.sorting import load_plan
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.model import SetCell
from tabletstore.errors import TabletStoreError
from tabletstore.master.master import Master
from tabletstore.master.process import make_recovery
from tabletstore.metadata.record import LogRef
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.options import IN_PROCESS_LEASE, MasterOptions, WorkerOptions
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.messages import LoadTabletRequest, UnloadTabletRequest
from tabletstore.rpc.services import TABLET
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.instrumented import InstrumentedObjectStore
from tabletstore.storage_s3.memory import MemoryObjectStore
from tabletstore.worker.server import TabletServer
from tabletstore.worker.sorter import Sorter

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


@pytest.mark.parametrize("spill", [False, True], ids=["memory", "spilled-to-disk"])
async def test_a_dead_log_of_several_tasks_is_read_about_once_by_its_owner(
    spill: bool, tmp_path: Path
) -> None:
    mem = MemoryObjectStore(shared=False)
    coord = MemoryCoordinator()
    transport = InProcessTransport()
    views: dict[str, InstrumentedObjectStore] = {}
    workers: dict[str, TabletServer] = {}
    sorters: dict[str, Sorter] = {}
    running: list[asyncio.Task[None]] = []
    stop = asyncio.Event()

    async def start_worker(name: str) -> TabletServer:
        view = views[name] = InstrumentedObjectStore(mem)
        worker = TabletServer(
            name,
            f"inproc://{name}",
            store=view,
            coordinator=coord,
            transport=transport,
            # No log trimming: the dead log keeps every write (a long tail to sort).
            options=WorkerOptions(
                lease=IN_PROCESS_LEASE,
                log_trim_interval=None,
                sort_spill_dir=str(tmp_path),
                **({"sort_memory_bytes": SMALL_MEMORY} if spill else {}),
            ),
        )
        await worker.start()
        transport.register(worker.address, TABLET.handlers(worker))
        assert worker.lease is not None
        sorter = Sorter(name, view, coord, worker.lease, poll=0.05, shared=worker.sorts)
        running.append(asyncio.create_task(sorter.run(stop)))
        workers[name], sorters[name] = worker, sorter
        return worker

    views["master"] = InstrumentedObjectStore(mem)
    # The owner's bound shrunk too (the log is about 150 KB).
    options = MasterOptions(
        sort_task_bytes=TASK_BYTES, balance_cooldown=3600.0, sort_owner_bytes=1024 * 1024
    )
    recovery = make_recovery("workers", views["master"], "memory://", coord, options)
    master = Master(coordinator=coord, transport=transport, options=options, recovery=recovery)
    try:
        w0 = await start_worker("w0")  # the root and METADATA
        await master.assign()
        client = AsyncClient(catalog=master.catalog, transport=transport, admin=master)
        table = await client.create_table("t", ["f"], split_keys=SPLITS)
        await master.assign()
        # The victim serves every user tablet (w0 keeps the system tablets, whose direct
        # replay would read the log besides the sort).
        victim = await start_worker("w1")
        records = await master.catalog.list_tablets((await client._info("t")).table_id)
        for rec in records:
            if rec.location == w0.address:
                await TABLET.client(transport, w0.address).unload_tablet(
                    UnloadTabletRequest(rec.table_id, rec.tablet_id)
                )
                await TABLET.client(transport, victim.address).load_tablet(
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
        await start_worker("w2")
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
        kv = await coord.get(f"settings/incarnation.{victim.worker_id}")
        assert kv is not None
        dead = LogRef(victim.worker_id, int(kv.value))
        plan = await load_plan(mem, dead.worker_id, dead.incarnation)
        assert plan is not None and len(plan.tasks) >= 3, plan
        log_bytes = 0
        async for info in mem.list(layout.log_prefix(dead.worker_id, dead.incarnation)):
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
        # Every acknowledged write is served again.
        rows = {r.key: r.latest("f", b"q") async for r in table.read_rows()}
        assert rows == {_row(i): VALUE + _row(i) for i in range(ROWS)}
    finally:
        stop.set()
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        await master.close()
        for worker in reversed(list(workers.values())):
            with contextlib.suppress(TabletStoreError):
                await worker.stop(flush=False)
        await coord.close()
    # Every worker removed its spill directory when it stopped.
    assert [n for n in os.listdir(tmp_path) if n.startswith("tabletstore-runs-")] == []
