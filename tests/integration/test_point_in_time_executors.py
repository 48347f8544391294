"""Point-in-time restore through the sorted-recovery executors (master/pitr_restore.py): the
retained log sorted in this process, by the live workers' sorters (``WorkerSortExecutor``
and ``worker.sorter.Sorter`` through the coordinator) and by the log-sort Lambda handler
(``LambdaSortExecutor``, each invocation run as Lambda runs it: a fresh Python process calling
``functions.log_sort.handler``) rebuilds the same table, cell for cell, equal to the model of
the acknowledged writes; the sorted runs live under the restore's own ``restores/<id>/`` and
are gone once it ends, and no recovery key is touched."""

from __future__ import annotations

import asyncio
import io
import json
import random
import time
from pathlib import Path
from typing import Any

import pytest
from botocore.response import StreamingBody

from tabletstore.clock import SystemClock
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.data.schema import ColumnFamily
from tabletstore.embedded import Database
from tabletstore.master.log_recovery import (
    InProcessSortExecutor,
    SortExecutor,
    WorkerSortExecutor,
)
from tabletstore.master.pitr_restore import restore_as_of
from tabletstore.master.sort_lambda import LambdaSortExecutor
from tabletstore.storage_s3 import layout
from tabletstore.worker.sorter import Sorter
from tests.functions.test_log_sort_function import invoke_in_fresh_process
from tests.integration.test_point_in_time import HOUR, SPLIT, History, Model, _read, _step

pytestmark = pytest.mark.timeout(300)


class HandlerInAFreshProcess:
    """A boto3 Lambda client whose ``invoke`` runs ``functions.log_sort.handler`` in a fresh
    process on the event (moto runs no function code without Docker); the events seen."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def invoke(self, *, FunctionName: str, InvocationType: str, Payload: bytes) -> Any:
        assert InvocationType == "RequestResponse"
        event = json.loads(Payload)
        self.events.append(event)
        body = json.dumps(invoke_in_fresh_process(event)).encode()
        return {"StatusCode": 200, "Payload": StreamingBody(io.BytesIO(body), len(body))}


async def _keys(db: Database, prefix: str) -> list[str]:
    return [o.key async for o in db.store.list(prefix)]


async def test_restore_through_each_executor_equals_the_in_process_one(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    rnd = random.Random(7)
    model = History()
    ts = 1_000_000
    db = await Database.open(url, tablet_options=SPLIT)
    coord = MemoryCoordinator()
    stop = asyncio.Event()
    sorting: asyncio.Future[None] | None = None
    try:
        await db.create_table("t", ["f", ColumnFamily(name="n", value_type="sum")], history=HOUR)
        await db.checkpoint()
        for step in range(160):
            ts += 1
            await _step(db, rnd, model, ts)
            if step == 60:
                await db.flush("t")
            if step == 90:
                await db.checkpoint()
        expected: Model = model.view()
        instant = time.time()
        for _ in range(40):  # after the instant: in the log, never in the restore
            ts += 1
            await _step(db, rnd, model, ts)
        recovery_before = await _keys(db, layout.RECOVERY)

        async def restore(new_table: str, executor: SortExecutor) -> Model:
            report = await restore_as_of(
                db.store,
                db.master.catalog,
                table="t",
                instant=instant,
                new_table=new_table,
                clock=SystemClock(),
                assign=db.master.assign,
                executor=executor,
                task_bytes=2048,  # several tasks per log
            )
            assert report.segments_read > 1 and report.log_cells > 0, report.summary()
            return await _read(db, new_table)

        in_process = await restore("local", InProcessSortExecutor(db.store))
        assert in_process == expected

        lease = await coord.grant_lease(30.0)
        sorter = Sorter("w1", db.store, coord, lease, poll=0.01)
        sorting = asyncio.ensure_future(sorter.run(stop))
        assert await restore("workers", WorkerSortExecutor(db.store, coord, poll=0.01)) == (
            in_process
        )
        assert sorter.done > 1, "the live worker's sorter ran the restore's tasks"
        assert await coord.get_prefix("sorts/") == []

        client = HandlerInAFreshProcess()
        lam = LambdaSortExecutor("tabletstore-log-sort", db.store, db.store.url, client=client)
        assert await restore("lambda", lam) == in_process
        scopes = {e["scope"] for e in client.events}
        assert len(client.events) > 1 and len(scopes) == 1

        # Each restore's sorted runs were its own and are gone; recovery's keys untouched.
        assert await _keys(db, layout.RESTORES) == []
        assert await _keys(db, layout.RECOVERY) == recovery_before
    finally:
        stop.set()
        if sorting is not None:
            await asyncio.gather(sorting, return_exceptions=True)
        await db.close()
