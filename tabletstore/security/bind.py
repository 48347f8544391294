"""The refusal to serve beyond loopback without TLS (issue 16 item 3).

A server bound to a non-loopback address without TLS lets anyone on the network claim any
identity; :func:`check_bind` refuses that unless the operator says ``--insecure``.
"""

from __future__ import annotations

import ipaddress

from tabletstore.errors import InvalidArgument

__all__ = ["check_bind", "is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever accepts connections from this machine."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve anywhere


def check_bind(host: str, *, tls: bool, insecure: bool = False, what: str = "server") -> None:
    """Refuse (InvalidArgument) to bind ``what`` to a non-loopback ``host`` without TLS unless
    ``insecure`` is set explicitly."""
    if tls or insecure or is_loopback(host):
        return
    raise InvalidArgument(
        f"refusing to serve the {what} on {host!r} without TLS: anyone who can reach it could "
        "claim any identity. Pass --tls-ca/--tls-cert/--tls-key (see `tabletstore certs`), "
        "bind to 127.0.0.1, or pass --insecure to accept the risk"
    )
