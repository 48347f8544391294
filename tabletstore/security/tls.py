"""TLS configuration in one place: the cluster CA, this process's certificate and key.

Every port speaks TLS from the same three files (the RPC wire, the status and metrics HTTP
endpoints, the Cloud Bigtable front door, etcd): :class:`TlsConfig` names them and builds the
``ssl`` contexts. Servers verify client certificates against the CA (mutual TLS); a client
without a certificate may still connect where bearer tokens are accepted (the server context
then asks for a certificate without requiring one, and the RPC layer requires a token
instead). Clients verify the server's certificate against the CA, and the RPC client pins what
it names (:func:`check_server`): the role of the server it dialled (a worker's certificate for
a worker, a master's for the master; never a client's or a function's), and the address it
dialled where the certificate names addresses of its own (issued with ``--host``). Host names
are not checked otherwise: the cluster's addresses are registered at run time (etcd), and a
certificate issued without hosts names only loopback.

The certificate names its holder: the Common Name is the principal's name, the Organizational
Unit its role (``security/ca.py`` issues them so).
"""

from __future__ import annotations

import ipaddress
import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabletstore.errors import InvalidArgument
from tabletstore.security.principal import ROLES, Principal

__all__ = [
    "ENV_CA",
    "ENV_CERT",
    "ENV_KEY",
    "SERVER_ROLES",
    "TlsConfig",
    "TlsFiles",
    "check_server",
    "principal_from_peercert",
]

ENV_CA = "TABLETSTORE_TLS_CA"
ENV_CERT = "TABLETSTORE_TLS_CERT"
ENV_KEY = "TABLETSTORE_TLS_KEY"
#: The roles that serve RPC: a client takes no other certificate for a server.
SERVER_ROLES: tuple[str, ...] = ("worker", "master")
#: Names every development certificate carries (``security/ca.py``): they bind it to no host.
_EVERYWHERE = frozenset({"localhost", "127.0.0.1", "::1"})


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The CA certificate, and optionally this process's certificate and key (PEM files).

    A server needs all three; a client needs the CA, and a certificate and key to prove who it
    is (otherwise a bearer token)."""

    ca: str
    cert: str | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise InvalidArgument(
                "TLS needs both a certificate and its key (--tls-cert, --tls-key)"
            )
        for label, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            if path is not None and not Path(path).is_file():
                raise InvalidArgument(f"TLS {label} file {path!r} does not exist")

    @classmethod
    def of(
        cls, ca: str | None, cert: str | None = None, key: str | None = None
    ) -> TlsConfig | None:
        """The config from optional paths (e.g. CLI flags): None if none is given; a clear
        error if a certificate or key is given without the CA."""
        if ca is None and cert is None and key is None:
            return None
        if ca is None:
            raise InvalidArgument("TLS needs the cluster CA certificate (--tls-ca)")
        return cls(ca, cert, key)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TlsConfig | None:
        """From ``TABLETSTORE_TLS_CA`` / ``_CERT`` / ``_KEY`` (None when unset)."""
        env = os.environ if env is None else env
        return cls.of(env.get(ENV_CA) or None, env.get(ENV_CERT) or None, env.get(ENV_KEY) or None)

    @property
    def has_identity(self) -> bool:
        return self.cert is not None

    def principal(self) -> Principal | None:
        """The principal this process's certificate names (None without one)."""
        if self.cert is None:
            return None
        from cryptography import x509
        from cryptography.x509.oid import NameOID

        try:
            subject = x509.load_pem_x509_certificate(Path(self.cert).read_bytes()).subject
        except ValueError as exc:
            raise InvalidArgument(f"{self.cert} is not a PEM certificate: {exc}") from exc

        def field(oid: x509.ObjectIdentifier) -> str | None:
            values = subject.get_attributes_for_oid(oid)
            return str(values[0].value) if values else None

        name = field(NameOID.COMMON_NAME)
        if not name:
            raise InvalidArgument(f"{self.cert} has no Common Name (its principal)")
        return Principal(name, field(NameOID.ORGANIZATIONAL_UNIT_NAME) or "client")

    def _load(self, ctx: ssl.SSLContext) -> ssl.SSLContext:
        try:
            ctx.load_verify_locations(cafile=self.ca)
            if self.cert is not None:
                ctx.load_cert_chain(self.cert, self.key)
        except (ssl.SSLError, OSError) as exc:
            raise InvalidArgument(
                f"cannot load TLS files (ca {self.ca}, cert {self.cert}, key {self.key}): {exc}"
            ) from exc
        return ctx

    def server_context(self, *, require_client_cert: bool = True) -> ssl.SSLContext:
        """A server's context: its certificate, client certificates verified against the CA
        (required, or optional where bearer tokens may stand in for them)."""
        if self.cert is None:
            raise InvalidArgument(
                "a TLS server needs a certificate and key (--tls-cert, --tls-key)"
            )
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
        return self._load(ctx)

    def client_context(self) -> ssl.SSLContext:
        """A client's context: the server's certificate verified against the CA (not its host
        name: module docstring), this process's certificate presented if it has one."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_REQUIRED
        return self._load(ctx)

    def read(self) -> tuple[bytes, bytes | None, bytes | None]:
        """The three files' bytes (for gRPC credentials)."""
        return (
            Path(self.ca).read_bytes(),
            Path(self.cert).read_bytes() if self.cert else None,
            Path(self.key).read_bytes() if self.key else None,
        )


#: Another name for the same thing (the TLS files of one process).
TlsFiles = TlsConfig


def principal_from_peercert(peercert: Any) -> Principal | None:
    """The principal a verified peer certificate names (``SSLObject.getpeercert()``): its
    Common Name and, as the role, its Organizational Unit. None without a certificate; a
    certificate of the CA with no name or an unknown role is refused (InvalidArgument)."""
    if not peercert:
        return None
    fields: dict[str, str] = {}
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            fields.setdefault(key, value)
    name = fields.get("commonName")
    role = fields.get("organizationalUnitName", "client")
    if not name:
        raise InvalidArgument("the peer's certificate has no Common Name (its principal)")
    if role not in ROLES:
        raise InvalidArgument(
            f"the peer's certificate names role {role!r} (its OU); expected one of {', '.join(ROLES)}"
        )
    return Principal(name, role, "certificate")


def _san(peercert: Any) -> list[tuple[str, str]]:
    return [(str(kind), str(value)) for kind, value in peercert.get("subjectAltName", ())]


def _same_host(a: str, b: str) -> bool:
    try:
        return ipaddress.ip_address(a.strip("[]")) == ipaddress.ip_address(b.strip("[]"))
    except ValueError:
        return a.strip("[]").lower().rstrip(".") == b.strip("[]").lower().rstrip(".")


def check_server(peercert: Any, host: str, role: str | None, address: str) -> Principal:
    """The principal of the server at ``address`` (dialled as ``host``), refused
    (InvalidArgument) unless its certificate names ``role`` (or, for None, a serving role:
    worker or master) and, where it names hosts of its own beyond loopback and its principal
    name, ``host`` among them."""
    server = principal_from_peercert(peercert)
    expected = (role,) if role is not None else SERVER_ROLES
    if server is None or server.role not in expected:
        raise InvalidArgument(
            f"server {address} is not a {' or '.join(expected)}: its certificate names "
            f"{server} (expected role {' or '.join(expected)})"
        )
    names = [value for _, value in _san(peercert)]
    own = [
        n
        for n in names
        if not any(_same_host(n, e) for e in _EVERYWHERE) and not _same_host(n, server.name)
    ]
    if own and not any(_same_host(host, n) for n in names):
        raise InvalidArgument(
            f"server {address} presented the certificate of {server}, which is for "
            f"{', '.join(own)}, not {host}"
        )
    return server
