"""What every ``tabletstore`` verb shares: the global options it gets (:class:`CliContext`),
how it opens the database for one invocation and how it fails.

Failures print one line, ``tabletstore: <what went wrong>``, on stderr and exit 1
(:class:`Failure`); a TabletStoreError never prints a traceback.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import IO, Any, TypeVar

import click

from tabletstore.coordination.base import Coordinator
from tabletstore.embedded import SyncDatabase, connect
from tabletstore.errors import TabletStoreError
from tabletstore.metadata.catalog import Catalog, ClusterSettings
from tabletstore.security import TlsConfig
from tabletstore.storage_s3 import open_store
from tabletstore.storage_s3.base import ObjectStore

__all__ = [
    "OPTIONS_ARG",
    "TABLE_ARG",
    "CliContext",
    "Failure",
    "cli_context",
    "echo_lines",
    "failing",
    "on_cluster",
    "os_error",
    "plural",
    "run_loop",
    "with_database",
]

T = TypeVar("T")

#: The TABLE argument of the verbs that act on one table.
TABLE_ARG = click.argument("table")
#: cbt's trailing ``key=value`` options.
OPTIONS_ARG = click.argument("options", nargs=-1)


@dataclass(frozen=True)
class CliContext:
    """What every verb gets from the global options."""

    url: str
    identity: str | None = None
    tls: TlsConfig | None = None
    token: str | None = None


class Failure(click.ClickException):
    """A failure reported as one line, ``tabletstore: message``, with exit status 1."""

    def show(self, file: IO[Any] | None = None) -> None:
        click.echo(f"tabletstore: {self.message}", err=True, file=file)


def cli_context() -> CliContext:
    """The global options of this invocation.
    REQUIRES: called inside a verb (``main`` stored the CliContext)."""
    obj = click.get_current_context().find_object(CliContext)
    assert obj is not None, "verbs run under main"
    return obj


def with_database(body: Callable[[SyncDatabase], T], *, url: str | None = None) -> T:
    """Open the database named by the global options (or ``url``, with the global
    identity and credentials), run ``body``, close it.

    The verbs use the synchronous API: the database runs on the portal's event loop while
    this thread does the blocking work (files, the terminal).
    REQUIRES: called inside a verb (the click context holds the CliContext)."""
    obj = cli_context()
    try:
        db = connect(url or obj.url, identity=obj.identity, tls=obj.tls, token=obj.token)
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    except OSError as exc:  # a file:// database in a directory that cannot be made or used
        raise Failure(f"cannot open the database at {url or obj.url!r}: {os_error(exc)}") from exc
    try:
        try:
            return body(db)
        finally:
            db.close()
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    except BrokenPipeError:
        raise  # the reader went away (``| head``): click exits quietly
    except OSError as exc:  # e.g. the output's disk is full
        raise Failure(os_error(exc)) from exc


def on_cluster(body: Callable[[ObjectStore, Catalog, Coordinator], Awaitable[T]]) -> T:
    """Run ``body`` with the bucket, catalog and coordinator of the cluster the global
    ``--url etcd://...`` names (the verbs that work on the bucket itself: gc, verify,
    restore); a TabletStoreError is a one-line failure.
    REQUIRES: called inside a verb."""
    obj = cli_context()

    async def go() -> T:
        from tabletstore.client.cluster import ClusterClient

        async with await ClusterClient.open(obj.url, tls=obj.tls, token=obj.token) as client:
            settings = await ClusterSettings.load(client.coordinator)
            store = open_store(settings.store_url)
            try:
                return await body(store, client.catalog, client.coordinator)
            finally:
                await store.close()

    try:
        return asyncio.run(go())
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc


def os_error(exc: OSError) -> str:
    where = f": {exc.filename}" if exc.filename else ""
    return f"{exc.strerror or exc}{where}"


def failing(fn: Callable[[], T]) -> T:
    """Run argument parsing; its InvalidArgument becomes a one-line failure."""
    try:
        return fn()
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def echo_lines(lines: Sequence[str]) -> None:
    for line in lines:
        click.echo(line)


def run_loop(coro: Coroutine[Any, Any, None]) -> None:
    """Run a long-lived process body on uvloop when it is installed (a server spends less of
    each call in the event loop there), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)
