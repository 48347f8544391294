"""Replication to a second cluster (``client/replicator.py``; docs/operations/replication.md)::

    tabletstore --url REPLICA replicate --source SOURCE TABLE... [--from INSTANT] [--attach]
                                        follow TABLEs of SOURCE (a service: runs until stopped)
    tabletstore --url REPLICA replication status       each replica table: source, lag, errors
    tabletstore --url REPLICA replication promote TABLE   failover: TABLE takes client writes
    tabletstore --url OLD replicate --source NEW --attach TABLE
                                        failback: the old primary follows the promoted table

``replicate`` runs where the replica cluster's operator runs its services, with rights to
both clusters (the source's coordinator and bucket, read only; the replica's, as the
replicator identity). It prints a line when a table starts, stalls, recovers or stops.
"""

from __future__ import annotations

import asyncio
import json
import sys

import click

from tabletstore.cli.context import TABLE_ARG, Failure, cli_context, failing
from tabletstore.cli.history_cmds import parse_instant
from tabletstore.client.change_plan import utc
from tabletstore.client.cluster import ClusterClient
from tabletstore.client.replication_plan import Progress
from tabletstore.client.replicator import (
    TableReplicator,
    promote,
    replication_progress,
)
from tabletstore.clock import wall_time
from tabletstore.data.validation import REPLICATOR
from tabletstore.embedded import connect_async
from tabletstore.errors import TabletStoreError

__all__ = ["replicate_cmd", "replication_group"]


def _say(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


@click.command("replicate")
@click.option("--source", required=True, help="The source cluster's URL (etcd://HOST:PORT/NS).")
@click.option(
    "--from",
    "since",
    default=None,
    help="Where a new replica starts (ISO 8601; "
    "default: as far back as the source's change retention allows).",
)
@click.option(
    "--attach",
    is_flag=True,
    help="Make an existing primary table follow SOURCE "
    "from the instant SOURCE's table was promoted (failback).",
)
@click.option(
    "--poll",
    type=float,
    default=0.5,
    show_default=True,
    help="Seconds between reads of the source's commit log.",
)
@click.option(
    "--save-every",
    type=float,
    default=1.0,
    show_default=True,
    help="Seconds between saves of the progress (a restart applies again at most "
    "this much, harmlessly).",
)
@click.argument("tables", nargs=-1, required=True)
def replicate_cmd(
    source: str,
    since: str | None,
    attach: bool,
    poll: float,
    save_every: float,
    tables: tuple[str, ...],
) -> None:
    """Follow TABLES of the SOURCE cluster into this one (--url), applying every change with
    the source's timestamps; progress is kept in this cluster, so a restart resumes. Runs
    until stopped, or until every table is promoted or fails."""
    obj = cli_context()
    start = None if since is None else failing(lambda: parse_instant(since))

    async def go() -> int:
        src = await connect_async(source, tls=obj.tls, token=obj.token)
        try:
            replica = await ClusterClient.open(
                obj.url, identity=REPLICATOR, tls=obj.tls, token=obj.token
            )
            try:
                followers = [
                    TableReplicator(
                        src,
                        source,
                        replica,
                        t,
                        start_time=start,
                        attach=attach,
                        poll=poll,
                        save_every=save_every,
                        log=_say,
                    )
                    for t in tables
                ]
                for f in followers:
                    progress = await _prepared(f)
                    _say(
                        f"{f.table}: following {source} ({len(progress.partitions)} "
                        f"partitions) from {utc(progress.applied_watermark())}"
                    )
                results = await asyncio.gather(
                    *(f.run() for f in followers), return_exceptions=True
                )
            finally:
                await replica.close()
        finally:
            await src.close()
        failed = 0
        for f, r in zip(followers, results, strict=True):
            if isinstance(r, BaseException):
                failed += 1
                click.echo(f"tabletstore: {f.table}: {r}", err=True)
        return 1 if failed else 0

    try:
        code = asyncio.run(go())
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    sys.exit(code)


async def _prepared(follower: TableReplicator) -> Progress:
    """``follower.prepare()``, retried while either cluster is unavailable (a service started
    with its cluster waits for it); a lasting error (bad input) fails at once."""
    delay = 0.5
    while True:
        try:
            return await follower.prepare()
        except TabletStoreError as exc:
            if not exc.retryable:
                raise
            _say(f"{follower.table}: {exc}; retrying")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 10.0)


@click.group("replication")
def replication_group() -> None:
    """Replica tables of this cluster (--url): their state, and failover."""


@replication_group.command("status")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per table.")
def status_cmd(as_json: bool) -> None:
    """Each table with replication progress here: its source, state, lag, last error."""
    obj = cli_context()

    async def go() -> None:
        async with await ClusterClient.open(obj.url, tls=obj.tls, token=obj.token) as client:
            found = await replication_progress(client)
        wall = wall_time()
        for name, p in sorted(found.items()):
            if as_json:
                click.echo(
                    json.dumps(
                        {
                            "table": name,
                            "source": p.source,
                            "state": p.state,
                            "lag_seconds": round(p.lag(wall), 3),
                            "applied": p.applied_watermark(),
                            "partitions": len(p.partitions),
                            "applied_changes": p.applied_changes,
                            "error": p.error,
                            "promoted_at": p.promoted_at,
                        }
                    )
                )
                continue
            if p.state == "promoted":
                assert p.promoted_at is not None
                click.echo(
                    f"{name}: promoted at {utc(p.promoted_at)} (was a replica of {p.source})"
                )
                continue
            line = (
                f"{name}: follows {p.table} at {p.source}; lag {p.lag(wall):.1f}s "
                f"(complete up to {utc(p.applied_watermark())}), {len(p.partitions)} "
                f"partitions, {p.applied_changes} changes applied"
            )
            click.echo(line + (f"; {p.error}" if p.error else ""))

    try:
        asyncio.run(go())
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc


@replication_group.command("promote")
@TABLE_ARG
def promote_cmd(table: str) -> None:
    """Failover: TABLE stops following its source and takes client writes. Writes the old
    primary acknowledged after the instant printed may not be here."""
    obj = cli_context()

    async def go() -> tuple[float, float]:
        async with await ClusterClient.open(obj.url, tls=obj.tls, token=obj.token) as client:
            return await promote(client, table)

    try:
        applied, promoted_at = asyncio.run(go())
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    click.echo(
        f"{table}: promoted at {utc(promoted_at)}; it holds every write its old primary "
        f"acknowledged before {utc(applied)}"
    )
