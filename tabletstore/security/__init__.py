"""Security: who a caller is and how its connection is protected (paper §2 access control,
§5.3 authorization).

One place for TLS configuration and identities, below every layer that opens a port:

- ``principal.py``: :class:`Principal` (a proven name and role) and the cluster's roles.
- ``table_visibility.py``: what a principal may know of a table (that it exists, its row keys).
- ``tls.py``: :class:`TlsConfig` (CA, certificate and key files → ``ssl`` contexts for servers
  and clients, mutual TLS) and the principal a verified peer certificate names.
- ``bind.py``: :func:`check_bind`, the refusal to listen beyond loopback without TLS.
- ``ca.py``: a development certificate authority (``tabletstore certs init`` / ``certs issue``).

The RPC layer (``rpc/auth.py``) turns a connection's certificate or bearer token into a
:class:`Principal`; the servers (``worker/tablet_service_guard.py``,
``master/master_service_guard.py``) authorize requests against it.
"""

from __future__ import annotations

from tabletstore.security.bind import check_bind, is_loopback
from tabletstore.security.principal import CLUSTER_ROLES, ROLES, Principal
from tabletstore.security.tls import TlsConfig, TlsFiles, principal_from_peercert

__all__ = [
    "CLUSTER_ROLES",
    "ROLES",
    "Principal",
    "TlsConfig",
    "TlsFiles",
    "check_bind",
    "is_loopback",
    "principal_from_peercert",
]
