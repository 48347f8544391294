"""Loading a tablet never holds the event loop for a whole replay (§5.3 recovery).

The worker's lease keep-alive runs on the same event loop as its tablet loads. A replay's
sources often never wait (runs kept in memory, a cached read of a log), so a replay of tens of
thousands of cells would otherwise run as one step of the loop, and a worker loading a dead worker's
tablets on a busy host would miss its own keep-alives. The instrument here counts turns of
the loop, not time: a task that only counts its turns runs beside the replay, and the test
checks how many cells the replay handed on between two of its turns.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator

from tabletstore.clock import ManualClock
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.engine.log_replay import YIELD_CELLS, recover_state, yielding
from tabletstore.keys import Cell, CellKind
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.storage_s3.memory import MemoryObjectStore

CELLS = 20_000


class _Sink:
    log_ref = LogRef("w", 1)

    def segment_mark(self) -> int:
        return 0

    def advance(self, seq: int) -> None:
        pass


class _Catalog:
    async def update(
        self, old: TabletRecord, new: TabletRecord, *, wait: float | None = None
    ) -> TabletRecord:
        return new


class _Turns:
    """Counts the event loop's turns it gets while running."""

    def __init__(self) -> None:
        self.turns = 0
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(0)
            self.turns += 1

    def __enter__(self) -> _Turns:
        self._task = asyncio.get_running_loop().create_task(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


def _longest_stretch(turns_at_each_cell: list[int]) -> int:
    """The most cells handed on with no turn of the loop between them."""
    return max(len(list(group)) for _, group in itertools.groupby(turns_at_each_cell))


async def test_a_long_replay_gives_the_loop_a_turn_every_few_cells() -> None:
    store = MemoryObjectStore("memory://replay-yields", shared=False)
    record = TabletRecord("t1", "tab", b"", None)
    schema = TableSchema(name="t", families={"f": ColumnFamily(name="f")})
    seen: list[int] = []

    with _Turns() as loop_turns:

        async def replay(_: TabletRecord) -> AsyncIterator[Cell]:
            # Never waits, as a replay from runs kept in memory does.
            for i in range(CELLS):
                seen.append(loop_turns.turns)
                yield Cell(b"r%06d" % i, "f", b"q", 1, i + 1, CellKind.PUT, b"v")

        await asyncio.sleep(0)
        state = await recover_state(
            record,
            schema,
            store=store,
            log_sink=_Sink(),
            catalog=_Catalog(),
            replay=replay,
            clock=ManualClock(),
            block_cache=None,
            scan_cache=None,
        )
    await store.close()
    assert len(state.memtable) == CELLS
    assert _longest_stretch(seen) <= YIELD_CELLS


async def test_yielding_hands_on_every_cell_in_order_with_turns_between() -> None:
    async def source() -> AsyncIterator[int]:
        for i in range(10):
            seen.append(loop_turns.turns)
            yield i

    seen: list[int] = []
    with _Turns() as loop_turns:
        await asyncio.sleep(0)
        got = [c async for c in yielding(source(), every=3)]
    assert got == list(range(10))
    assert _longest_stretch(seen) <= 3
