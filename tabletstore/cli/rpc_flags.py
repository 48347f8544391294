"""The flags of ``tabletstore worker`` and ``tabletstore master`` that cap what clients may take
from their RPC server (:class:`tabletstore.options.RpcServerOptions`, ``rpc/admission.py``),
and the protocol versions they speak (``rpc/versions.py``).

:func:`rpc_caps` adds the flags to a command and hands it one ``rpc`` argument, the settings
they make, so a command's signature grows by one parameter; :func:`protocol_versions` likewise
hands it ``versions``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import click

from tabletstore.limits import MiB, format_size
from tabletstore.options import RpcServerOptions
from tabletstore.rpc.rpc_client import IDLE_REUSE
from tabletstore.rpc.versions import OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION, Versions, spoken

__all__ = ["protocol_versions", "rpc_caps"]

F = TypeVar("F", bound=Callable[..., Any])
_DEFAULT = RpcServerOptions()

_FLAGS = (
    click.option(
        "--max-connections",
        type=click.IntRange(min=1),
        default=_DEFAULT.max_connections,
        show_default=True,
        help="RPC connections open at once; more are refused with an error naming the limit.",
    ),
    click.option(
        "--max-connections-per-peer",
        type=click.IntRange(min=1),
        default=_DEFAULT.max_connections_per_peer,
        show_default=True,
        help="RPC connections open at once from one IP address.",
    ),
    click.option(
        "--max-unauthenticated",
        type=click.IntRange(min=1),
        default=_DEFAULT.max_unauthenticated,
        show_default=True,
        help="With TLS: connections open at once that have not proven who they are yet (no "
        "client certificate, token not yet accepted); a pool apart from --max-connections.",
    ),
    click.option(
        "--max-unauthenticated-per-peer",
        type=click.IntRange(min=1),
        default=_DEFAULT.max_unauthenticated_per_peer,
        show_default=True,
        help="With TLS: of those, connections open at once from one IP address.",
    ),
    click.option(
        "--min-receive-rate",
        type=click.IntRange(min=0),
        default=_DEFAULT.min_receive_rate,
        show_default=True,
        help="Bytes a second an RPC frame must arrive at (averaged over --stall-timeout "
        "windows); a slower sender is closed. 0: no minimum.",
    ),
    click.option(
        "--idle-timeout",
        type=click.FloatRange(min=2 * IDLE_REUSE),
        default=_DEFAULT.idle_timeout,
        show_default=True,
        help="Seconds an RPC connection with nothing in flight may stay silent before it is "
        "closed (clients reconnect transparently).",
    ),
    click.option(
        "--stall-timeout",
        type=click.FloatRange(min=1.0),
        default=_DEFAULT.stall_timeout,
        show_default=True,
        help="Seconds a half-received RPC frame may go without a byte before its connection "
        "is closed.",
    ),
    click.option(
        "--max-buffered-bytes",
        type=click.IntRange(min=_DEFAULT.max_frame),
        default=_DEFAULT.max_buffered_bytes,
        show_default=True,
        help="Bytes all RPC connections may hold together (frames being received, requests "
        "being handled); past it, connections wait before their next frame is read. At least "
        f"the frame limit, {format_size(_DEFAULT.max_frame)}; default "
        f"{_DEFAULT.max_buffered_bytes // MiB} MiB.",
    ),
)


def rpc_caps(command: F) -> F:
    """Add the RPC caps' flags to ``command``, which takes them as ``rpc: RpcServerOptions``."""

    @functools.wraps(command)
    def wrapper(
        *args: Any,
        max_connections: int,
        max_connections_per_peer: int,
        max_unauthenticated: int,
        max_unauthenticated_per_peer: int,
        min_receive_rate: int,
        idle_timeout: float,
        stall_timeout: float,
        max_buffered_bytes: int,
        **kwargs: Any,
    ) -> Any:
        rpc = RpcServerOptions(
            max_connections=max_connections,
            max_connections_per_peer=max_connections_per_peer,
            max_unauthenticated=max_unauthenticated,
            max_unauthenticated_per_peer=max_unauthenticated_per_peer,
            min_receive_rate=min_receive_rate,
            idle_timeout=idle_timeout,
            stall_timeout=stall_timeout,
            max_buffered_bytes=max_buffered_bytes,
        )
        return command(*args, rpc=rpc, **kwargs)

    decorated: Callable[..., Any] = wrapper
    for flag in reversed(_FLAGS):
        decorated = flag(decorated)
    return decorated  # type: ignore[return-value]


_MAX_PROTOCOL_VERSION = click.option(
    "--max-protocol-version",
    type=click.IntRange(OLDEST_PROTOCOL_VERSION, PROTOCOL_VERSION),
    default=None,
    hidden=True,
    help="For upgrade rehearsals only: speak RPC protocol versions up to this one, as a "
    "process of the previous release does (docs/operations/upgrades.md).",
)


def protocol_versions(command: F) -> F:
    """Add ``--max-protocol-version`` to ``command``, which takes ``versions: Versions`` (this
    build's, unless capped). Hidden: it exists to rehearse a rolling upgrade across a protocol
    change with one build (docs/operations/upgrades.md), not to run a cluster."""

    @functools.wraps(command)
    def wrapper(*args: Any, max_protocol_version: int | None, **kwargs: Any) -> Any:
        versions: Versions = spoken(max_protocol_version)
        return command(*args, versions=versions, **kwargs)

    return _MAX_PROTOCOL_VERSION(wrapper)  # type: ignore[return-value]
