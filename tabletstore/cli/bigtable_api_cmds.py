"""``tabletstore bigtable-api``: serve the Cloud Bigtable API over a tabletstore database.

Registered on the main command group by :mod:`tabletstore.cli.main`. The serving stack
(:mod:`tabletstore.bigtable_api`) and grpc are imported only when the command runs, so other
verbs never load them.

::

    tabletstore [--url URL] bigtable-api [--url URL] [--host 127.0.0.1] [--port 8086]
        [--plain-instance ID] [--tls-cert CERT --tls-key KEY] [--insecure]
        [--max-concurrent-calls N] [--max-inflight-bytes BYTES] [--processes N|auto]

With ``--tls-cert``/``--tls-key`` it serves TLS, and in front of a cluster (``etcd://``) every
call must carry ``authorization: Bearer <token>`` (``tabletstore tokens create``); the call
then acts for the token's principal (bigtable_api/token_check.py). Without TLS a non-loopback
``--host`` is refused unless ``--insecure``.

Once listening it prints ``bigtable-api listening on HOST:PORT`` (``--port 0`` picks a free
port) and ``export BIGTABLE_EMULATOR_HOST=HOST:PORT`` (with TLS: ``bigtable-api listening with
TLS on HOST:PORT``; clients then connect to it as an endpoint and trust the certificate),
then serves until SIGINT or SIGTERM, when it stops accepting calls, lets calls in flight
finish and closes the database.

``--processes N`` (in front of a cluster only: an embedded database is opened by one process)
runs N front-door processes under a supervisor (``cli/supervisor.py``) on the one port: each
binds it with SO_REUSEPORT and the kernel spreads new connections over them; the supervisor
holds the port (bound, not listening) so that a restarted process gets it back. Each process
is a front door of its own: ``--max-concurrent-calls`` and ``--max-inflight-bytes`` bound
each process, so the host holds at most N times them.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

from tabletstore.cli.context import Failure, run_loop
from tabletstore.cli.supervisor import Supervisor, group_options, group_place, processes_option
from tabletstore.extras import MissingExtra, needs_extra
from tabletstore.limits import MAX_REQUEST_BYTES
from tabletstore.options import FRONT_DOOR_INFLIGHT_BYTES, FRONT_DOOR_MAX_CONCURRENT_CALLS

__all__ = ["DEFAULT_PORT", "bigtable_api", "serve"]

#: Google's emulator listens on 8086 by default (``gcloud beta emulators bigtable start``).
DEFAULT_PORT = 8086


def _require_extra() -> None:
    """Import the serving stack, or fail saying which extra to install."""
    try:
        with needs_extra("bigtable-api", what="the Cloud Bigtable API"):
            import tabletstore.bigtable_api.front_door  # noqa: F401  (grpc and Google's protos)
    except MissingExtra as exc:
        raise Failure(str(exc)) from exc


def _checks_tokens(url: str | None, tls: Any) -> bool:
    """Whether the front door authenticates its callers: bearer tokens, checked against the
    cluster's, with TLS in front of a cluster; an embedded database knows no tokens, so there
    TLS only encrypts."""
    return tls is not None and url is not None and url.startswith("etcd://")


async def serve(
    url: str | None,
    host: str,
    port: int,
    *,
    plain_instance: str | None = None,
    tls: Any = None,
    client_tls: Any = None,
    max_concurrent_calls: int = FRONT_DOOR_MAX_CONCURRENT_CALLS,
    max_inflight_bytes: int = FRONT_DOOR_INFLIGHT_BYTES,
    share_port: bool = False,
    ready: Callable[[int], None] | None = None,
) -> None:
    """Open the database at ``url``, serve until SIGINT/SIGTERM, then shut down cleanly.
    ``tls`` (a TlsConfig): serve TLS, and bearer tokens in front of a cluster; ``client_tls``:
    how this process reaches the cluster (the global --tls-* options). ``share_port``: one
    of several processes on ``port`` (SO_REUSEPORT). ``ready`` is called with the bound port
    once it serves (default: print where it listens)."""
    from tabletstore.bigtable_api.front_door import BigtableApiServer
    from tabletstore.bigtable_api.token_check import server_credentials
    from tabletstore.coordination.tokens import TokenStore
    from tabletstore.embedded import connect_async
    from tabletstore.ops.process_warmup import warm_up_process

    if tls is not None:
        server_credentials(tls)  # a bad file fails before the database opens
    client = await connect_async(url, tls=client_tls)
    try:
        # Bearer tokens in front of a cluster only: the embedded default stays open (one user).
        coordinator = getattr(client, "coordinator", None)
        tokens = (
            TokenStore(coordinator)
            if _checks_tokens(url, tls) and coordinator is not None
            else None
        )
        server = BigtableApiServer(
            client,
            host=host,
            port=port,
            plain_instance=plain_instance,
            tls=tls,
            tokens=tokens,
            max_concurrent_calls=max_concurrent_calls,
            max_inflight_bytes=max_inflight_bytes,
            share_port=share_port,
        )
        bound = await server.start()
        # Pay a long-running server's one-time costs now, not inside requests, and keep the
        # cyclic collector off the request path (ops/process_warmup.py).
        warm_up_process()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        (ready or (lambda port: _announce(host, port, tls=tls is not None)))(bound)
        try:
            await stop.wait()
        finally:
            await server.stop(grace=5.0)
    finally:
        await client.close()


def _announce(host: str, port: int, *, tls: bool, processes: int = 1) -> None:
    """The lines that say where the front door listens."""
    group = f" ({processes} processes)" if processes > 1 else ""
    if tls:
        click.echo(f"bigtable-api listening with TLS on {host}:{port}{group}")
    else:
        click.echo(f"bigtable-api listening on {host}:{port}{group}")
        click.echo(f"export BIGTABLE_EMULATOR_HOST={host}:{port}")


def _hold_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` with SO_REUSEPORT and not listening: it keeps the port
    (``0``: a free one) for the group's processes, restarted ones included, and receives no
    connection itself."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise Failure(f"cannot listen on {host}:{port}: {exc}") from exc
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise Failure(f"cannot listen on {host}:{port}: {exc}") from exc
    return sock


@click.command("bigtable-api")
@click.option("--url", default=None, help="Database URL (default: the global --url).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option(
    "--port", type=int, default=DEFAULT_PORT, show_default=True, help="Port (0: pick one)."
)
@click.option(
    "--plain-instance",
    default=None,
    metavar="ID",
    help="Instance id whose tables are the database's own (unprefixed) tables.",
)
@click.option("--tls-cert", default=None, metavar="PEM", help="Serve TLS with this certificate.")
@click.option("--tls-key", default=None, metavar="PEM", help="The certificate's private key.")
@click.option(
    "--insecure",
    is_flag=True,
    help="Allow a non-loopback --host without caller authentication (TLS in front of a "
    "cluster checks tokens; over an embedded database nothing is authenticated).",
)
@click.option(
    "--max-concurrent-calls",
    type=click.IntRange(min=1),
    default=FRONT_DOOR_MAX_CONCURRENT_CALLS,
    show_default=True,
    help="Calls served at once by each process; more are refused with RESOURCE_EXHAUSTED.",
)
@click.option(
    "--max-inflight-bytes",
    type=click.IntRange(min=MAX_REQUEST_BYTES),
    default=FRONT_DOOR_INFLIGHT_BYTES,
    show_default=True,
    help="Request bytes all calls in flight in each process may hold (one caller at most "
    "half); a call that finds no room within 10 s is refused with RESOURCE_EXHAUSTED before "
    "its message is read.",
)
@processes_option("sharing the port (SO_REUSEPORT) with its own call and byte bounds")
@group_options
@click.pass_context
def bigtable_api(
    ctx: click.Context,
    url: str | None,
    host: str,
    port: int,
    plain_instance: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    insecure: bool,
    max_concurrent_calls: int,
    max_inflight_bytes: int,
    processes: int,
    group_slot: int | None,
    group_start: int,
    group_ready_fd: int | None,
) -> None:
    """Serve the Cloud Bigtable API (point clients at it with BIGTABLE_EMULATOR_HOST)."""
    from tabletstore.errors import TabletStoreError
    from tabletstore.security import TlsConfig, check_bind

    if url is None and ctx.obj is not None:
        url = getattr(ctx.obj, "url", None)
    if (tls_cert is None) != (tls_key is None):
        raise Failure("--tls-cert and --tls-key go together: give both, or neither")
    client_tls = getattr(ctx.obj, "tls", None)
    try:
        tls = None
        if tls_cert is not None or tls_key is not None:
            ca = client_tls.ca if client_tls is not None else tls_cert
            tls = TlsConfig.of(ca, tls_cert, tls_key)
        check_bind(
            host, authenticated=_checks_tokens(url, tls), insecure=insecure, what="bigtable-api"
        )
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
    if processes > 1 and not (url or "").startswith("etcd://"):
        raise Failure(
            "--processes above 1 needs a cluster (an etcd:// URL): an embedded database is "
            "opened by one process"
        )
    _require_extra()
    if processes > 1:
        held = _hold_port(host, port)
        with contextlib.closing(held):
            bound = held.getsockname()[1]
            group = Supervisor(
                processes,
                [*sys.argv[1:], "--port", str(bound)],
                name="bigtable-api",
                serving=lambda: _announce(host, bound, tls=tls is not None, processes=processes),
            )
            raise SystemExit(group.serve())
    place = group_place(group_slot, group_start, group_ready_fd)
    try:
        run_loop(
            serve(
                url,
                host,
                port,
                plain_instance=plain_instance,
                tls=tls,
                client_tls=client_tls,
                max_concurrent_calls=max_concurrent_calls,
                max_inflight_bytes=max_inflight_bytes,
                # One of a group: the port is shared, and the supervisor says where it is.
                share_port=place is not None,
                ready=None if place is None else lambda bound: place.serving(),
            )
        )
    except TabletStoreError as exc:
        raise Failure(str(exc)) from exc
