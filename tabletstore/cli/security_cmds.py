"""``tabletstore certs`` and ``tabletstore tokens``: a development CA and bearer tokens
(``tabletstore.security``, ``coordination.tokens``)::

    tabletstore certs init DIR                      a CA: DIR/ca.pem, DIR/ca.key
    tabletstore certs issue NAME --dir DIR --role client|worker|master|function [--host H]
                                                    DIR/NAME.pem, DIR/NAME.key (CN=NAME, OU=role)
    tabletstore --url etcd://.. tokens create NAME [--days D]
                                                    prints a new token for principal NAME (once),
                                                    valid D days (default 30)
    tabletstore --url etcd://.. tokens list         principals, creation and expiry (no tokens)
    tabletstore --url etcd://.. tokens revoke NAME  deletes every token of NAME
"""

from __future__ import annotations

import asyncio
import datetime
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import click

from tabletstore.coordination import open_coordinator
from tabletstore.coordination.tokens import DEFAULT_TTL, TokenStore
from tabletstore.errors import TabletStoreError
from tabletstore.security import ROLES, ca

__all__ = ["certs_group", "tokens_group"]

T = TypeVar("T")


class _Failure(click.ClickException):
    def show(self, file: object = None) -> None:
        click.echo(f"tabletstore: {self.message}", err=True)


@click.group("certs")
def certs_group() -> None:
    """A development certificate authority for mutual TLS (production: your own PKI, with the
    principal in the CN and its role in the OU)."""


@certs_group.command("init")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
def certs_init(directory: Path) -> None:
    """Make a CA in DIRECTORY (ca.pem to give everyone, ca.key to keep private)."""
    try:
        path = ca.init_ca(directory)
    except TabletStoreError as exc:
        raise _Failure(str(exc)) from exc
    click.echo(f"CA certificate: {path}")


@certs_group.command("issue")
@click.argument("name")
@click.option(
    "--dir",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The CA's directory (certs init); the certificate is written there.",
)
@click.option("--role", type=click.Choice(ROLES), default="client", show_default=True)
@click.option("--host", "hosts", multiple=True, help="Extra host name or IP it serves on.")
@click.option("--days", type=click.IntRange(min=1), default=825, show_default=True)
@click.option("--force", is_flag=True, help="Replace NAME.pem and NAME.key if they exist.")
def certs_issue(
    name: str, directory: Path, role: str, hosts: tuple[str, ...], days: int, force: bool
) -> None:
    """Issue a certificate for principal NAME with ROLE, signed by the CA in --dir."""
    try:
        issued = ca.issue(directory, name, role=role, hosts=hosts, days=days, force=force)
    except TabletStoreError as exc:
        raise _Failure(str(exc)) from exc
    click.echo(f"certificate: {issued.cert}")
    click.echo(f"key:         {issued.key}")


def _with_tokens(url: str, body: Callable[[TokenStore], Awaitable[T]]) -> T:
    if not url.startswith("etcd://"):
        raise _Failure(f"tokens live in the cluster's etcd: --url etcd://..., not {url!r}")

    async def run() -> T:
        coordinator = open_coordinator(url)
        try:
            return await body(TokenStore(coordinator))
        finally:
            await coordinator.close()

    try:
        return asyncio.run(run())
    except TabletStoreError as exc:
        raise _Failure(str(exc)) from exc


def _url() -> str:
    url = click.get_current_context().find_root().params.get("url")
    return str(url)


@click.group("tokens")
def tokens_group() -> None:
    """Bearer tokens for clients where a certificate does not fit (stored hashed in etcd)."""


@tokens_group.command("create")
@click.argument("name")
@click.option("--role", type=click.Choice(ROLES), default="client", show_default=True)
@click.option(
    "--days",
    type=click.FloatRange(min=0, min_open=True),
    default=DEFAULT_TTL / 86400,
    show_default=True,
    help="Days until the token expires.",
)
def tokens_create(name: str, role: str, days: float) -> None:
    """Make a token for principal NAME; it is printed once, keep it secret. Give it to
    clients in a file (--token-file) or TABLETSTORE_TOKEN, not on a command line."""
    token = _with_tokens(_url(), lambda t: t.create(name, role=role, ttl=days * 86400))
    click.echo(token)


@tokens_group.command("list")
def tokens_list() -> None:
    """Principals holding tokens (the tokens themselves are not stored)."""
    for info in _with_tokens(_url(), lambda t: t.list()):
        created = datetime.datetime.fromtimestamp(info.created, datetime.UTC)
        expires = datetime.datetime.fromtimestamp(info.expires, datetime.UTC)
        click.echo(
            f"{info.name}\t{info.role}\t{created:%Y-%m-%d %H:%M:%S}Z\t"
            f"expires {expires:%Y-%m-%d %H:%M:%S}Z\t{info.digest[:12]}"
        )


@tokens_group.command("revoke")
@click.argument("name")
def tokens_revoke(name: str) -> None:
    """Delete every token of principal NAME (or the one token given)."""
    n = _with_tokens(_url(), lambda t: t.revoke(name))
    click.echo(f"revoked {n} token{'s' if n != 1 else ''}")
