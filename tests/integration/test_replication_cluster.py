"""Replication between two clusters of real processes (each its own etcd namespace and bucket):
a ``tabletstore replicate`` process of the replica cluster follows a table of the source while
a seeded writer sets cells, adds to a sum, increments counters and deletes; the source table
splits, a source worker is killed, and the replicator is killed (SIGKILL, with sums applied
since its last save) and restarted. After the writer stops the replica equals the source cell
for cell, sums included (nothing applied twice). Then: the replica refuses client writes; a
replica's consistency token turns consistent once it caught up; promotion (failover) and
re-attaching the old primary as a follower (failback); a source table without a change
retention is refused by name; and a replica whose source table is gone keeps serving reads
and says why it stalls."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from google.cloud.bigtable_admin_v2.types import bigtable_table_admin as bta

from tabletstore.bigtable_api.admin import TableAdmin
from tabletstore.bigtable_api.instances import Namespaces
from tabletstore.cli import localstack
from tabletstore.cli.localstack import ProcessRecord
from tabletstore.client.client import AsyncClient
from tabletstore.client.mutate_rows import MutationsFailed
from tabletstore.client.replication_plan import MARKER_FAMILY
from tabletstore.client.replicator import load_progress
from tabletstore.data.model import (
    AddToCell,
    DeleteCells,
    DeleteRow,
    IncrementValue,
    Mutation,
    RowMutation,
    SetCell,
)
from tabletstore.data.schema import ColumnFamily
from tabletstore.embedded import connect_async
from tabletstore.errors import (
    Indeterminate,
    PreconditionFailed,
    TabletStoreError,
    Unavailable,
)
from tests.integration.cluster_harness import (
    PROCESS_ENV,
    Cluster,
    eventually,
    placement,
    table_id_of,
)
from tests.integration.test_cluster import _record_of, _start

pytestmark = [pytest.mark.timeout(900), pytest.mark.slow]

BUCKET = 86_400_000_000
Cells = list[tuple[bytes, str, bytes, int, bytes]]


@dataclass
class Pair:
    source: Cluster
    replica: Cluster


@pytest.fixture(scope="module")
def pair(
    etcd_server: str, s3_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pair]:
    with pytest.MonkeyPatch.context() as mp:
        for k, v in PROCESS_ENV.items():
            mp.setenv(k, v)  # this process reads the source's bucket (its change stream)
        source = Cluster.on(
            etcd_server, s3_server, tmp_path_factory.mktemp("source"), "repl-src", lease_ttl=6.0
        )
        replica = Cluster.on(
            etcd_server, s3_server, tmp_path_factory.mktemp("replica"), "repl-dst", lease_ttl=6.0
        )
        try:
            _start(source, masters=1, workers=2, split_bytes=32 * 1024)
            _start(replica, masters=1, workers=1)
            yield Pair(source, replica)
        finally:
            source.close()
            replica.close()


@pytest.fixture(autouse=True)
def own_processes(pair: Pair) -> Iterator[None]:
    """Each test stops, by their records, the processes it started (replicators): one left
    running would go on following, retrying and writing progress during the next test."""
    before = {id(c): len(c.records) for c in (pair.source, pair.replica)}
    yield
    for cluster in (pair.source, pair.replica):
        for record in reversed(cluster.records[before[id(cluster)] :]):
            if cluster.running(record):
                cluster.terminate(record, deadline=15.0)


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "tabletstore.cli.main", *args]


def start_replicator(
    follower: Cluster, source: Cluster, *args: str, role: str = "replicator"
) -> ProcessRecord:
    """``tabletstore --url FOLLOWER replicate --source SOURCE ARGS`` as a process of
    ``follower``'s group (so that the test may kill it, and closing the group stops it)."""
    argv = _cli("--url", follower.url, "replicate", "--source", source.url, "--poll", "0.3", *args)
    record = localstack.spawn(
        role, argv, log=follower.directory / f"{role}.log", url="", env=PROCESS_ENV
    )
    follower.records.append(record)
    return record


async def cells(client: AsyncClient, table: str) -> Cells:
    out: Cells = []
    async for row in client.table(table).read_rows():
        for c in row.cells:
            if c.family != MARKER_FAMILY:
                out.append((row.key, c.family, c.qualifier, c.timestamp, c.value))
    return sorted(out)


async def caught_up(client: AsyncClient, table: str, instant: float) -> bool | None:
    """The replica table has applied every write its source acknowledged before ``instant``."""
    progress = await load_progress(client, table)
    return (progress is not None and progress.applied_watermark() >= instant) or None


async def sums(client: AsyncClient, table: str) -> Cells:
    """The table's cells of its ``sum`` family."""
    return [c for c in await cells(client, table) if c[1] == "n"]


def _mutation(rnd: random.Random, step: int) -> tuple[bytes, list[Mutation] | IncrementValue]:
    row = b"r%03d" % rnd.randrange(50)
    q = b"q%d" % rnd.randrange(2)
    roll = rnd.random()
    if roll < 0.5:
        value = b"v%d-" % step + bytes(rnd.randrange(97, 123) for _ in range(900))
        ts = None if rnd.random() < 0.3 else step + 1  # server time too
        return row, [SetCell("f", q, value, ts)]
    if roll < 0.7:
        return row, [AddToCell("n", q, rnd.randrange(1, 100), BUCKET)]
    if roll < 0.85:
        return row, IncrementValue("c", q, rnd.randrange(1, 10))
    if roll < 0.97:
        return row, [DeleteCells("f", q)]
    return row, [DeleteRow()]


async def write(client: AsyncClient, table: str, rnd: random.Random, steps: range) -> None:
    t = client.table(table)
    for step in steps:
        row, what = _mutation(rnd, step)
        try:
            if isinstance(what, IncrementValue):
                await t.read_modify_write_row(row, [what])
            else:
                await t.mutate_row(row, what)
        except (Indeterminate, Unavailable):
            pass  # in the source's log or not: the replica follows the log either way


async def test_a_replica_converges_cell_for_cell_across_a_split_and_kills(pair: Pair) -> None:
    src = await connect_async(pair.source.url)
    dst = await connect_async(pair.replica.url)
    rnd = random.Random(34)
    try:
        await src.create_table(
            "t", ["f", "c", ColumnFamily(name="n", value_type="sum")], changes=3600.0
        )
        table_id = await table_id_of(src, "t")
        # Saving rarely: a kill then leaves seconds of applied, unsaved changes, sums among them.
        follower = start_replicator(pair.replica, pair.source, "--save-every", "4", "t")
        await write(src, "t", rnd, range(0, 150))
        await src.flush("t")

        async def split() -> int | None:
            n = sum(len(t) for t in placement(await src.status(), table_id).values())
            return n if n >= 2 else None

        await eventually(split, deadline=90, what="the source table splits")
        await write(src, "t", rnd, range(150, 230))
        wrote = time.time()
        # Its saved progress covers every write so far. (An instant before the first write would
        # not say so: a new table's first heartbeat, before any change, is already past it.)
        await eventually(
            lambda: caught_up(dst, "t", wrote), deadline=90, what="the replica follows"
        )
        saved = await load_progress(dst, "t")
        assert saved is not None and saved.applied_changes > 0
        # Kill the replicator once it applied sums of the next writes that its saved progress
        # does not cover, then restart it: it applies them again, and must not count them twice.
        base = saved, await sums(dst, "t")
        mid = asyncio.create_task(write(src, "t", rnd, range(230, 300)))

        async def applied_unsaved() -> bool | None:
            nonlocal base
            seen = await sums(dst, "t")
            progress = await load_progress(dst, "t")
            assert progress is not None
            if progress.updated_at != base[0].updated_at:
                # Saved again: only a sum the replica gets after this record is not in it.
                base = progress, await sums(dst, "t")
                return None
            return bool(set(seen) - set(base[1])) or None

        await eventually(applied_unsaved, deadline=90, what="sums applied and not yet saved")
        await asyncio.to_thread(pair.replica.kill, follower)
        await mid
        progress = await load_progress(dst, "t")
        assert progress is not None and progress.applied_watermark() >= wrote
        start_replicator(pair.replica, pair.source, "--save-every", "4", "t", role="replicator-2")
        # Kill a source worker serving the table while the replica follows.
        status = await src.status()
        where = placement(status, table_id)
        victim = next(w for w, t in where.items() if t)
        await asyncio.to_thread(pair.source.kill, _record_of(pair.source, status.workers[victim]))
        await write(src, "t", rnd, range(300, 380))

        async def moved() -> bool | None:
            here = placement(await src.status(), table_id)
            return (victim not in here and sum(len(t) for t in here.values()) >= 2) or None

        await eventually(moved, deadline=90, what="the killed worker's tablets served elsewhere")
        await write(src, "t", rnd, range(380, 420))
        ended = time.time()
        await eventually(
            lambda: caught_up(dst, "t", ended), deadline=150, what="the replica caught up"
        )
        want = await cells(src, "t")
        got = await cells(dst, "t")
        assert {c[1] for c in want} == {"f", "n", "c"}
        assert got == want  # sums and counters too: nothing was applied twice

        # The replica refuses client writes, naming the primary and the way out.
        with pytest.raises(PreconditionFailed, match=r"refuses client writes.*promote"):
            await dst.table("t").mutate_row(b"x", [SetCell("f", b"q", b"v")])

        # The source table gone: the replica keeps serving reads and says why it stalls.
        await src.delete_table("t")

        async def stalled() -> str | None:
            p = await load_progress(dst, "t")
            return p.error if p is not None and p.error else None

        error = await eventually(stalled, deadline=60, what="the replicator reports the source")
        assert f"source table 't' is gone from {pair.source.url}" in error
        assert await cells(dst, "t") == got
    finally:
        await src.close()
        await dst.close()


async def test_promote_and_failback_end_to_end(pair: Pair) -> None:
    src = await connect_async(pair.source.url)
    dst = await connect_async(pair.replica.url)
    rnd = random.Random(7)
    try:
        await src.create_table(
            "p", ["f", "c", ColumnFamily(name="n", value_type="sum")], changes=3600.0
        )
        follower = start_replicator(pair.replica, pair.source, "p", role="replicator-p")
        await write(src, "p", rnd, range(0, 60))

        # The replica's front door: a consistency token turns consistent once the replica
        # holds every write the source acknowledged before it was made.
        admin = TableAdmin(dst, Namespaces("i"))
        name = "projects/x/instances/i/tables/p"

        async def replica_exists() -> bool | None:
            try:
                return (await dst.describe_table("p")).replica_of is not None or None
            except TabletStoreError:
                return None

        await eventually(replica_exists, deadline=60, what="the replica table made")
        token = (
            await admin.generate_consistency_token(
                bta.GenerateConsistencyTokenRequest.pb()(name=name)
            )
        ).consistency_token

        async def consistent() -> bool | None:
            req = bta.CheckConsistencyRequest.pb()(name=name, consistency_token=token)
            return (await admin.check_consistency(req)).consistent or None

        assert not await consistent()  # the watermark trails the present by seconds
        await eventually(consistent, deadline=60, what="the replica consistent with the token")
        ended = time.time()
        await eventually(lambda: caught_up(dst, "p", ended), deadline=60, what="caught up")
        assert await cells(dst, "p") == await cells(src, "p")

        # Failover: one command; the replicator stops, the table takes client writes.
        done = await _run(_cli("--url", pair.replica.url, "replication", "promote", "p"))
        assert done.returncode == 0, done.stderr
        assert "promoted at" in done.stdout and "acknowledged before" in done.stdout
        await eventually(
            lambda: asyncio.to_thread(lambda: not pair.replica.running(follower) or None),
            deadline=60,
            what="the replicator of the promoted table exits",
        )
        assert "_replication" not in (await dst.describe_table("p")).families
        await write(dst, "p", rnd, range(60, 120))  # the new primary's own writes
        # A write the old primary takes after the failover stays there (not replicated).
        await src.table("p").mutate_row(b"late", [SetCell("f", b"q", b"old primary", 5)])

        # Failback: the old primary follows the new one from the promotion instant.
        start_replicator(pair.source, pair.replica, "--attach", "p", role="failback")
        ended = time.time()
        await eventually(lambda: caught_up(src, "p", ended), deadline=90, what="failback caught up")
        old = await cells(src, "p")
        new = await cells(dst, "p")
        assert [c for c in old if c[0] != b"late"] == new  # sums not counted twice
        assert any(c[0] == b"late" for c in old) and not any(c[0] == b"late" for c in new)
        with pytest.raises(PreconditionFailed, match="refuses client writes"):
            await src.table("p").mutate_row(b"y", [SetCell("f", b"q", b"v")])
        with pytest.raises(MutationsFailed, match="refuses client writes"):
            await src.table("p").mutate_rows([RowMutation(b"y", (SetCell("f", b"q", b"v"),))])

        listed = await _run(_cli("--url", pair.replica.url, "replication", "status"))
        assert listed.returncode == 0, listed.stderr
        assert "p: promoted at" in listed.stdout
    finally:
        await src.close()
        await dst.close()


def test_a_source_table_without_changes_is_refused_by_name(pair: Pair) -> None:
    async def make() -> None:
        client = await connect_async(pair.source.url)
        try:
            await client.create_table("plain", ["f"])
        finally:
            await client.close()

    asyncio.run(make())
    done = subprocess.run(
        _cli("--url", pair.replica.url, "replicate", "--source", pair.source.url, "plain"),
        capture_output=True, text=True, timeout=120, env=_env(),
    )  # fmt: skip
    assert done.returncode == 1
    assert "keeps no changes" in done.stderr and "tabletstore changes plain 24h" in done.stderr


async def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """A CLI command to its end (in a thread: the test's event loop goes on)."""
    return await asyncio.to_thread(
        subprocess.run, argv, capture_output=True, text=True, timeout=120, env=_env()
    )


def _env() -> dict[str, str]:
    """What a CLI process of the test runs with: this environment and the cluster's."""
    return {**os.environ, **PROCESS_ENV}
