"""The ``tabletstore`` command: the only module that reads environment variables and flags.

Verbs are click groups under :func:`main`. The global ``--url`` (env ``TABLETSTORE_URL``)
names the database; it is stored in ``ctx.obj`` (:class:`CliContext`) for every verb.

::

    tabletstore [--url URL] local-stack up [--dir DIR] [--s3-url URL]
    tabletstore [--url URL] local-stack status [--dir DIR]
    tabletstore [--url URL] local-stack down [--dir DIR]
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from tabletstore import localstack
from tabletstore.errors import TabletStoreError

__all__ = ["CliContext", "main"]

#: The embedded default: a database in a local directory.
DEFAULT_URL = "file://./tabletstore-data"


@dataclass(frozen=True)
class CliContext:
    """What every verb gets from the global options."""

    url: str


@click.group()
@click.option(
    "--url",
    envvar="TABLETSTORE_URL",
    default=DEFAULT_URL,
    show_default=True,
    help="Database URL (file://DIR for the embedded default).",
)
@click.pass_context
def main(ctx: click.Context, url: str) -> None:
    """tabletstore: Bigtable on object storage and etcd."""
    ctx.obj = CliContext(url=url)


_dir_option = click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path(localstack.DEFAULT_DIR),
    show_default=True,
    help="Where the stack keeps its data, logs and stack.json.",
)


@main.group("local-stack")
def local_stack() -> None:
    """Run etcd and an S3 endpoint (moto, or yours) on 127.0.0.1."""


@local_stack.command("up")
@_dir_option
@click.option(
    "--s3-url",
    default=None,
    help="Use this S3/MinIO endpoint instead of starting moto's server.",
)
def local_stack_up(directory: Path, s3_url: str | None) -> None:
    """Start the stack and print the URLs to use."""
    try:
        stack = localstack.up(directory, s3_url=s3_url)
    except TabletStoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"local stack is up in {stack.dir}")
    click.echo(f"  etcd URL:     {stack.etcd_url}")
    click.echo(f"  S3 endpoint:  {stack.s3_endpoint}")
    click.echo(f"  bucket:       {stack.bucket}" + ("" if stack.s3_managed else " (must exist)"))
    for record in stack.processes:
        click.echo(f"  {record.role:<6} pid {record.pid:<8} log {record.log}")
    click.echo("environment:")
    for name, value in localstack.environment(stack).items():
        click.echo(f"  export {name}={value}")


@local_stack.command("status")
@_dir_option
def local_stack_status(directory: Path) -> None:
    """List each recorded process with its role, pid and whether it is alive."""
    try:
        rows = localstack.status(directory)
    except TabletStoreError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{'ROLE':<8} {'PID':<8} {'ALIVE':<6} URL")
    for record, alive in rows:
        click.echo(f"{record.role:<8} {record.pid:<8} {'yes' if alive else 'no':<6} {record.url}")


@local_stack.command("down")
@_dir_option
def local_stack_down(directory: Path) -> None:
    """Stop the processes this stack started (and only those) and wait for them to exit."""
    try:
        stopped = localstack.down(directory)
    except TabletStoreError as exc:
        raise click.ClickException(str(exc)) from exc
    for record in stopped:
        click.echo(f"stopped {record.role} (pid {record.pid})")
    click.echo("local stack is down")


from tabletstore.bigtable_api.cli import bigtable_api  # noqa: E402  (imports no grpc)

main.add_command(bigtable_api)


if __name__ == "__main__":
    main()
