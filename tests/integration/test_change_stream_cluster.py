"""Change streams on a cluster of real processes: a seeded writer sets, deletes and adds to
cells of a table with a change retention while a reader follows every partition of its change
stream (and the partitions that replace them); the table splits, and a worker serving it is
killed (SIGKILL) and its tablets recovered elsewhere. The changes read equal the acknowledged
writes, each exactly once, in commit order per row (a write whose outcome the client could not
know may be there or not); and a token taken in the middle resumes its partition exactly."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tabletstore.client.change_plan import Change, ChangePartition, Heartbeat, PartitionEnd
from tabletstore.client.change_stream import ChangeItem
from tabletstore.data.model import AddToCell, DeleteCells, DeleteRow, Mutation, SetCell
from tabletstore.data.schema import ColumnFamily
from tabletstore.embedded import connect_async
from tabletstore.errors import Indeterminate, InvalidArgument, TabletStoreError, Unavailable
from tests.integration.cluster_harness import (
    PROCESS_ENV,
    Cluster,
    eventually,
    placement,
    table_id_of,
)
from tests.integration.test_cluster import _record_of, _start

pytestmark = [pytest.mark.timeout(420), pytest.mark.slow]

BUCKET = 86_400_000_000


@dataclass(frozen=True)
class Write:
    """One write as the reader should see it: (kind, family, qualifier, value or None)."""

    step: int
    row: bytes
    mods: tuple[tuple[str, str, bytes, bytes | None], ...]
    #: The client could not tell whether it was applied.
    unknown: bool = False


def _mutation(rnd: random.Random, step: int) -> tuple[bytes, list[Mutation], Write]:
    row = b"r%03d" % rnd.randrange(60)
    q = b"q%d" % rnd.randrange(2)
    roll = rnd.random()
    if roll < 0.7:
        value = b"v%d-" % step + bytes(rnd.randrange(97, 123) for _ in range(400))
        return row, [SetCell("f", q, value, step + 1)], Write(step, row, (("put", "f", q, value),))
    if roll < 0.85:
        return (
            row,
            [AddToCell("n", q, step, BUCKET)],
            Write(step, row, (("aggregate_sum", "n", q, None),)),
        )
    if roll < 0.97:
        return row, [DeleteCells("f", q)], Write(step, row, (("delete_column", "f", q, None),))
    return row, [DeleteRow()], Write(step, row, (("delete_row", "", b"", None),))


def _signature(c: Change) -> tuple[tuple[str, str, bytes, bytes | None], ...]:
    return tuple(
        (m.kind, m.family, m.qualifier, m.value if m.kind == "put" else None) for m in c.mods
    )


def check_exactly_once(writes: list[Write], changes: list[Change]) -> None:
    """Per row, the changes (in the order read) are the row's acknowledged writes in the
    order they were made, each once; a write of unknown outcome may be among them."""
    by_row: dict[bytes, list[Change]] = {}
    for c in changes:
        by_row.setdefault(c.row, []).append(c)
    expected: dict[bytes, list[Write]] = {}
    for w in writes:
        expected.setdefault(w.row, []).append(w)
    assert set(by_row) <= set(expected), "changes of rows never written"
    for row, wanted in expected.items():
        got = by_row.get(row, [])
        seqs = [c.seq for c in got]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"row {row!r}: seq order"
        i = 0
        for w in wanted:
            if i < len(got) and _signature(got[i]) == w.mods:
                i += 1
            elif not w.unknown:
                pytest.fail(f"row {row!r}: acknowledged write {w.step} {w.mods[0][:3]} not read")
        assert i == len(got), f"row {row!r}: {len(got) - i} changes read that were not written"


class SeededWriter:
    """Seeded single-row writes to one table, one at a time, each recorded as the reader
    should see it (a refused one not at all, an indeterminate one as maybe)."""

    def __init__(self, table: object, seed: int) -> None:
        self.table = table
        self.rnd = random.Random(seed)
        self.writes: list[Write] = []
        self.step = 0

    async def write(self, n: int) -> None:
        for _ in range(n):
            row, muts, w = _mutation(self.rnd, self.step)
            self.step += 1
            try:
                await self.table.mutate_row(row, muts)  # type: ignore[attr-defined]
            except Indeterminate:
                self.writes.append(Write(w.step, w.row, w.mods, unknown=True))
            except Unavailable:
                pass  # refused: certainly not applied, so never in the stream
            else:
                self.writes.append(w)

    async def write_until(self, done: Callable[[], Awaitable[bool]], what: str) -> None:
        """Write in rounds of ten until ``done()`` (checked between rounds; an error counts
        as not yet), at most 120 s."""
        deadline = time.monotonic() + 120
        while True:
            try:
                if await done():
                    return
            except TabletStoreError:
                pass  # asked again after the next round
            assert time.monotonic() < deadline, f"not within 120 s: {what}"
            await self.write(10)


async def finish_following(
    follower: asyncio.Task[None],
    seen: list[tuple[ChangePartition, ChangeItem]],
    writes: list[Write],
    ended: float,
) -> list[Change]:
    """Wait until the reader is complete past ``ended`` (after the last write), stop it, and
    check that it read every acknowledged write exactly once in row order; the changes."""

    async def complete() -> bool | None:
        return _complete_up_to(seen, ended) or None

    await eventually(complete, deadline=120, what="the reader complete past the writes")
    follower.cancel()
    await asyncio.gather(follower, return_exceptions=True)
    changes = [item for _, item in seen if isinstance(item, Change)]
    assert len({(c.row, c.seq) for c in changes}) == len(changes), "a change read twice"
    check_exactly_once(writes, changes)
    return changes


async def test_the_change_stream_is_every_acknowledged_write_once_across_a_split_and_a_kill(
    etcd_server: str, s3_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in PROCESS_ENV.items():
        monkeypatch.setenv(k, v)
    cluster = _start(
        Cluster.on(etcd_server, s3_server, tmp_path, "changes", lease_ttl=8.0),
        masters=1,
        workers=2,
        split_bytes=32 * 1024,
    )
    try:
        client = await connect_async(cluster.url)
        try:
            began = time.time()
            table = await client.create_table(
                "c", ["f", ColumnFamily(name="n", value_type="sum")], changes=3600.0
            )
            table_id = await table_id_of(client, "c")
            seen: list[tuple[ChangePartition, ChangeItem]] = []
            follower = asyncio.create_task(follow_into(table, began, seen))
            writer = SeededWriter(table, 34)
            await writer.write(150)
            await client.flush("c")

            async def split() -> int | None:
                n = sum(len(t) for t in placement(await client.status(), table_id).values())
                return n if n >= 2 else None

            await eventually(split, deadline=90, what="the table splits")
            await writer.write(70)
            where = placement(await client.status(), table_id)
            victim = next(w for w, t in where.items() if t)
            tablets = sum(len(t) for t in where.values())
            status = await client.status()
            await asyncio.to_thread(cluster.kill, _record_of(cluster, status.workers[victim]))
            await writer.write(80)
            await eventually(
                lambda: _moved_off(client, table_id, victim, tablets),
                deadline=90,
                what="the killed worker's tablets served elsewhere",
            )
            await writer.write(40)
            ended = time.time()
            await finish_following(follower, seen, writer.writes, ended)
            assert any(isinstance(item, PartitionEnd) for _, item in seen), "no split was read"

            # A token from the middle of a partition resumes it exactly.
            part, token, rest = _middle(seen)
            resumed = [
                item async for item in table.read_changes(part, tokens=[token], end_time=ended)
            ]
            assert _keys(resumed) == _keys(rest)
            assert not any(isinstance(i, PartitionEnd) for i in resumed)
            # Another table's token is refused.
            other = await client.create_table("d", ["f"], changes=60.0)
            with pytest.raises(InvalidArgument, match="another table"):
                async for _ in other.read_changes(tokens=[token]):
                    pass
        finally:
            await client.close()
    finally:
        cluster.close()


def _keys(items: list[ChangeItem]) -> list[tuple[bytes, int]]:
    return [(c.row, c.seq) for c in items if isinstance(c, Change)]


async def follow_into(
    table: object, began: float, seen: list[tuple[ChangePartition, ChangeItem]]
) -> None:
    async for pair in table.follow_changes(start_time=began, poll=0.3):  # type: ignore[attr-defined]
        seen.append(pair)


def _complete_up_to(seen: list[tuple[ChangePartition, ChangeItem]], instant: float) -> bool:
    """Every partition still followed has a heartbeat at or past ``instant``."""
    active: dict[ChangePartition, float] = {}
    ended: set[ChangePartition] = set()
    for part, item in seen:
        if isinstance(item, PartitionEnd):
            ended.add(part)
            for succ, _ in item.successors:
                active.setdefault(succ, 0.0)
        elif isinstance(item, Heartbeat):
            active[part] = max(active.get(part, 0.0), item.watermark)
        else:
            active.setdefault(part, 0.0)
    live = {p: w for p, w in active.items() if p not in ended}
    return bool(live) and all(w >= instant for w in live.values())


def _middle(
    seen: list[tuple[ChangePartition, ChangeItem]],
) -> tuple[ChangePartition, str, list[ChangeItem]]:
    """A partition still followed at the end, a change's token from the middle of its
    stream, and what followed it there."""
    by_part: dict[ChangePartition, list[ChangeItem]] = {}
    for part, item in seen:
        by_part.setdefault(part, []).append(item)
    for part in [p for p, items in by_part.items() if isinstance(items[-1], PartitionEnd)]:
        del by_part[part]
    part, items = max(by_part.items(), key=lambda kv: sum(isinstance(i, Change) for i in kv[1]))
    changes = [i for i, item in enumerate(items) if isinstance(item, Change)]
    k = changes[len(changes) // 2]
    token = items[k].token  # type: ignore[union-attr]
    return part, token, items[k + 1 :]


async def _moved_off(client: object, table_id: str, victim: str, tablets: int) -> bool:
    where = placement(await client.status(), table_id)  # type: ignore[attr-defined]
    return sum(len(t) for t in where.values()) >= tablets and victim not in where
