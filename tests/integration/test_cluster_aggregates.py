"""Aggregate counters on a real cluster while a worker is SIGKILLed mid-stream (§5.2, §5.3):
every acknowledged AddToCell is counted, none twice, through flushes (minor compactions with
writes in flight, so redo points lag behind what SSTables hold), the kill, the sorted replay
on the new owners and a major compaction afterwards.

Each write adds 1 to a sum and a unique id to an hll in one row mutation. A write whose
outcome is unknown (``may_have_applied``) may or may not count; the client never resends one
(AddToCell is not idempotent), so every counter must lie in ``[acked, acked + maybe]``.
"""

from __future__ import annotations

import asyncio
import itertools
import struct
from collections.abc import Callable

import pytest

from tabletstore.client.table import AsyncTable
from tabletstore.data import hll
from tabletstore.data.model import AddToCell
from tabletstore.data.schema import ColumnFamily
from tabletstore.errors import TabletStoreError
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tests.integration.cluster_harness import Cluster, eventually, placement, table_id_of
from tests.integration.test_cluster import (
    REASSIGN_DEADLINE,
    _at_least,
    _moved_off,
    client_of,
    make_cluster,
    wait_served,
    worker_id_of,
)

__all__ = ["make_cluster"]  # fixture used by name

pytestmark = pytest.mark.timeout(300)

#: Three rows in each of the five tablets: a tablet's writes to other rows may still be in
#: flight when it freezes (the redo point then lags behind what its new SSTable holds).
ROWS = [f"{p}-count-{j}".encode() for p in "cgkpv" for j in range(3)]
BUCKET = 3_600_000_000


class Counters:
    def __init__(self, table: AsyncTable) -> None:
        self.table = table
        self.stop = asyncio.Event()
        self.acked = dict.fromkeys(ROWS, 0)
        self.maybe = dict.fromkeys(ROWS, 0)
        self.errors: dict[str, int] = {}

    @property
    def total(self) -> int:
        return sum(self.acked.values())

    async def write(self, n: int) -> None:
        for i in itertools.count():
            if self.stop.is_set():
                return
            row = ROWS[(n + i) % len(ROWS)]
            muts = [
                AddToCell("n", b"c", 1, BUCKET),
                AddToCell("u", b"c", b"w%d-%d" % (n, i), BUCKET),
            ]
            try:
                await self.table.mutate_row(row, muts)
            except TabletStoreError as exc:
                name = type(exc).__name__
                self.errors[name] = self.errors.get(name, 0) + 1
                if exc.may_have_applied:
                    self.maybe[row] += 1
                await asyncio.sleep(0.05)
            else:
                self.acked[row] += 1


async def check(table: AsyncTable, counters: Counters) -> None:
    print(f"acked {counters.acked} maybe {counters.maybe} errors {counters.errors}")
    for row in ROWS:
        got = await table.read_row(row)
        assert got is not None, row
        low, high = counters.acked[row], counters.acked[row] + counters.maybe[row]
        value = struct.unpack(">q", got.latest("n", b"c") or b"")[0]
        assert low <= value <= high, f"{row!r}: sum {value} outside [{low}, {high}]"
        assert len(got.cells_of("n")) == 1
        state = got.latest("u", b"c")
        assert state is not None
        estimate = hll.estimate(state)
        slack = max(2, 0.04 * high)  # 4 standard errors of a precision-14 sketch
        assert low - slack <= estimate <= high + slack, f"{row!r}: hll {estimate}"


@pytest.mark.slow
async def test_sigkill_worker_during_adds_counts_each_acknowledged_add_once(
    make_cluster: Callable[..., Cluster],
) -> None:
    cluster = make_cluster(workers=3)
    async with client_of(cluster) as client:
        table = await client.create_table(
            "agg",
            [ColumnFamily(name="n", value_type="sum"), ColumnFamily(name="u", value_type="hll")],
            split_keys=[b"e", b"i", b"o", b"t"],
        )
        before = await wait_served(client, "agg", 5)
        status = await client.status()
        workers = [r for r in cluster.records if r.role.startswith("worker")]
        ids = {r.url: worker_id_of(cluster, r.url, status.workers) for r in workers}  # type: ignore[arg-type]
        meta = placement(status, METADATA_TABLE_ID)
        # The victim serves tablets of the table, and no METADATA tablet when another one can
        # be chosen (moving METADATA too makes the failover longer, not the test stronger).
        victim = max(
            workers,
            key=lambda r: (not meta.get(ids[r.url]), len(before.get(ids[r.url], ()))),
        )
        victim_id = ids[victim.url]
        assert before[victim_id], f"the victim serves a tablet: {before}"

        counters = Counters(table)
        tasks = [asyncio.create_task(counters.write(n)) for n in range(8)]
        try:
            for target in range(40, 240, 40):
                await eventually(
                    lambda t=target: _at_least(counters.total, t),
                    deadline=60,
                    what=f"{target} adds",
                )
                await client.flush("agg")  # minor compactions with adds in flight
            await asyncio.to_thread(cluster.kill, victim)
            killed_at = counters.total
            table_id = await table_id_of(client, "agg")
            # The dead worker's log is sorted before its tablets load elsewhere: each flush
            # and group commit cut a segment, so allow for that on a loaded machine.
            await eventually(
                lambda: _moved_off(client, table_id, victim_id, 5),
                deadline=3 * REASSIGN_DEADLINE,
                what="the victim's tablets reassigned",
            )
            await eventually(
                lambda: _at_least(counters.total, killed_at + 100),
                deadline=60,
                what="100 more adds after the failover",
            )
        finally:
            counters.stop.set()
            await asyncio.gather(*tasks)
        await check(table, counters)
        await client.compact("agg")
        await check(table, counters)
