"""A development certificate authority: ``tabletstore certs init DIR`` and ``certs issue``.

Enough to run a cluster with mutual TLS on one machine or a test network: a CA key
and certificate, and certificates it signs for clients, workers, masters and functions. The
principal is the certificate's Common Name and its role the Organizational Unit
(``security/tls.py`` reads them back). Each certificate also names ``localhost``, ``127.0.0.1``
and any ``hosts`` given as subject alternative names, so the same files serve etcd and gRPC
peers that check host names. Production clusters use their own PKI; only the subject layout
matters.

Files in DIR: ``ca.pem``, ``ca.key`` (keep it private) and ``NAME.pem`` / ``NAME.key`` per
issued certificate. Keys are ECDSA P-256, written with mode 0600 whether or not the file was
there before (a key file left 0644 by hand is made 0600 when written again); DIR is made mode
0700 whatever the umask. Issuing over an existing certificate or key is refused unless
``force`` (``certs issue --force``): a certificate in use is never replaced silently.

No certificate name is trusted by etcd implicitly. etcd with ``--client-cert-auth`` takes a
client certificate's Common Name as its etcd user when no password is given, so a principal's
certificate named ``root`` or after the cluster's etcd users would be that user: the CA refuses
those names (:data:`RESERVED_NAMES`). And the local stack's etcd admits only client
certificates issued for :data:`ETCD_CLIENT_HOST` (etcd's ``--client-cert-allowed-hostname``):
the stack's own (``etcd_client=True``); ``issue`` refuses that host to anyone else, so a
principal's certificate of the same CA cannot reach etcd at all.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tabletstore.clock import wall_time
from tabletstore.errors import AlreadyExists, InvalidArgument, NotFound
from tabletstore.security.principal import ROLES

__all__ = ["ETCD_CLIENT_HOST", "RESERVED_NAMES", "Issued", "init_ca", "issue"]

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
#: Names never issued to a principal: etcd's superuser and the etcd users the local stack
#: makes (``cli/localstack.py``), which etcd would grant to a certificate of that name.
RESERVED_NAMES = frozenset({"root", "tabletstore-cluster", "tabletstore-reader"})
#: The host name etcd admits client certificates for in the local stack (module docstring).
ETCD_CLIENT_HOST = "etcd-client.tabletstore.invalid"


@dataclass(frozen=True, slots=True)
class Issued:
    """Paths of an issued certificate and its key."""

    cert: Path
    key: Path


def _now() -> datetime.datetime:
    return datetime.datetime.fromtimestamp(wall_time(), datetime.UTC)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        os.fchmod(fd, 0o600)  # the mode of a file that was already there is not O_CREAT's
        f.write(data)


def _private_dir(d: Path) -> None:
    """``d``, made if needed, mode 0700 (not what the umask leaves)."""
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)


def init_ca(directory: str | Path, *, name: str = "tabletstore dev CA", days: int = 3650) -> Path:
    """Make a CA in ``directory`` (created if needed); AlreadyExists if it has one. Returns
    the CA certificate's path."""
    d = Path(directory)
    _private_dir(d)
    if (d / CA_CERT).exists() or (d / CA_KEY).exists():
        raise AlreadyExists(f"{d} already holds a CA ({CA_CERT}, {CA_KEY})")
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(d / CA_KEY, key)
    (d / CA_CERT).write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return d / CA_CERT


def _san(hosts: Sequence[str], name: str) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in dict.fromkeys(["localhost", "127.0.0.1", "::1", name, *hosts]):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            try:
                names.append(x509.DNSName(host))
            except ValueError:
                continue  # a principal name that is not a DNS name: only in the CN
    return x509.SubjectAlternativeName(names)


def issue(
    directory: str | Path,
    name: str,
    *,
    role: str = "client",
    hosts: Sequence[str] = (),
    days: int = 825,
    out: str | Path | None = None,
    not_before: datetime.datetime | None = None,
    not_after: datetime.datetime | None = None,
    etcd_client: bool = False,
    force: bool = False,
) -> Issued:
    """Issue a certificate for principal ``name`` with ``role`` (client, worker, master,
    function), signed by the CA in ``directory``; written to ``out`` (default: the same
    directory) as NAME.pem and NAME.key. ``not_before``/``not_after`` override the validity
    (tests make expired certificates with them). ``etcd_client``: the local stack's own
    certificates, which its etcd admits (module docstring). An existing NAME.pem or NAME.key
    is replaced only with ``force``; AlreadyExists otherwise."""
    if role not in ROLES:
        raise InvalidArgument(f"unknown role {role!r}: expected one of {', '.join(ROLES)}")
    if not name or "/" in name or name.startswith("."):
        raise InvalidArgument(f"bad certificate name {name!r}: a plain principal name is needed")
    if name.casefold() in RESERVED_NAMES:
        raise InvalidArgument(
            f"certificate name {name!r} is reserved: etcd would take a certificate of that name "
            f"for its etcd user (reserved: {', '.join(sorted(RESERVED_NAMES))})"
        )
    if any(h.casefold().rstrip(".") == ETCD_CLIENT_HOST for h in hosts):
        raise InvalidArgument(
            f"host {ETCD_CLIENT_HOST!r} is reserved for the local stack's own etcd clients"
        )
    if etcd_client:
        hosts = (*hosts, ETCD_CLIENT_HOST)
    d = Path(directory)
    if not (d / CA_CERT).is_file() or not (d / CA_KEY).is_file():
        raise NotFound(f"{d} holds no CA: run `tabletstore certs init {d}` first")
    ca_key = serialization.load_pem_private_key((d / CA_KEY).read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate((d / CA_CERT).read_bytes())
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise InvalidArgument(f"{d / CA_KEY} is not an EC key made by `certs init`")
    key = ec.generate_private_key(ec.SECP256R1())
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before or now - datetime.timedelta(minutes=5))
        .not_valid_after(not_after or now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(_san(hosts, name), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    target = Path(out) if out is not None else d
    if not target.exists():
        _private_dir(target)
    issued = Issued(target / f"{name}.pem", target / f"{name}.key")
    there = [p.name for p in (issued.cert, issued.key) if p.exists()]
    if there and not force:
        raise AlreadyExists(
            f"{target} already holds {' and '.join(there)}: pass --force to replace them "
            "(clients and servers using the old ones must be given the new ones)"
        )
    _write_key(issued.key, key)
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return issued
