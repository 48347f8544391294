"""The refusal to serve beyond loopback without authenticating callers.

A server bound to a non-loopback address that does not authenticate its callers lets anyone on
the network act as anyone; :func:`check_bind` refuses that unless the operator says
``--insecure``. TLS alone is not enough: a server authenticates when its callers must present
a certificate of the cluster CA or a bearer token the cluster knows (a master or worker with
TLS always does; the Cloud Bigtable front door only in front of a cluster, where it checks
tokens -- over an embedded database its TLS encrypts but names nobody).
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


def check_bind(
    host: str, *, authenticated: bool, insecure: bool = False, what: str = "server"
) -> None:
    """Refuse (InvalidArgument) to bind ``what`` to a non-loopback ``host`` unless it
    ``authenticated`` its callers (client certificates or tokens, over TLS), or ``insecure``
    is set explicitly."""
    if authenticated or insecure or is_loopback(host):
        return
    raise InvalidArgument(
        f"refusing to serve the {what} on {host!r} without authenticating callers (TLS with "
        "client certificates or tokens; TLS alone only encrypts): anyone who can reach it "
        "could act as anyone. Pass --tls-ca/--tls-cert/--tls-key to a cluster's processes "
        "(see `tabletstore certs`), bind to 127.0.0.1, or pass --insecure to accept the risk"
    )
