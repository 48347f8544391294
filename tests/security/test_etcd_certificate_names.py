"""etcd taking a certificate's name for one of its users.

The attack: with ``local-stack up --tls``, etcd ran with ``--client-cert-auth``, which takes a
client certificate's Common Name as its etcd user when no password is given. A certificate of
the cluster CA named ``root`` (or ``tabletstore-cluster``) -- nothing reserved those names --
got etcd's full write access, and with it could mint a master-role token. Now the CA refuses
those names, and the local stack's etcd admits only the stack's own certificates (issued for
``ca.ETCD_CLIENT_HOST``, etcd's ``--client-cert-allowed-hostname``): a principal's certificate
of the same CA, whatever its name, cannot reach etcd. A real etcd on loopback; a few requests.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from tabletstore.cli import localstack
from tabletstore.coordination import open_coordinator
from tabletstore.errors import InvalidArgument, TabletStoreError
from tabletstore.security import TlsConfig, ca

pytestmark = pytest.mark.timeout(120)


def _signed_by_the_ca(directory: Path, name: str) -> TlsConfig:
    """A certificate the cluster CA signed for ``name``, as any PKI sharing the CA could make
    (``issue`` itself refuses reserved names)."""
    ca_key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    ca_cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (directory / f"{name}-forged.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}-forged.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return TlsConfig(
        str(directory / "ca.pem"),
        str(directory / f"{name}-forged.pem"),
        str(directory / f"{name}-forged.key"),
    )


def test_the_ca_refuses_the_names_etcd_would_trust(tmp_path: Path) -> None:
    ca.init_ca(tmp_path)
    for name in ("root", "tabletstore-cluster", "tabletstore-reader", "Root"):
        with pytest.raises(InvalidArgument, match="reserved"):
            ca.issue(tmp_path, name)
    with pytest.raises(InvalidArgument, match="reserved"):
        ca.issue(tmp_path, "u1", hosts=(ca.ETCD_CLIENT_HOST,))


def test_a_principal_certificate_gets_nothing_from_the_stacks_etcd(tmp_path: Path) -> None:
    tls_dir = localstack.make_certs(tmp_path / "tls")
    etcd, port = localstack.start_etcd(
        tmp_path / "etcd", log=tmp_path / "etcd.log", tls=localstack._tls_files(tls_dir, "etcd")
    )
    try:
        master = localstack._tls_files(tls_dir, "master")
        users = localstack.etcd_auth(tmp_path, tls_dir, localstack.with_tls(etcd.url, master))
        asyncio.run(_attack(tls_dir, users, master, f"etcd://127.0.0.1:{port}/cluster"))
    finally:
        localstack.stop(etcd)


async def _attack(tls_dir: Path, users: Path, master: TlsConfig, plain: str) -> None:
    """The cluster user writes; certificates of the same CA that are not the stack's get nothing."""
    # The cluster's own user, with its password and the stack's certificate, writes.
    cluster = open_coordinator(
        localstack.with_tls(localstack.with_user(plain, users, localstack.CLUSTER_USER), master)
    )
    try:
        await cluster.put("probe", b"cluster")
    finally:
        await cluster.close()
    # Certificates of the same CA named root or after the cluster's user write nothing.
    for name in ("root", localstack.CLUSTER_USER):
        forged = open_coordinator(localstack.with_tls(plain, _signed_by_the_ca(tls_dir, name)))
        try:
            with pytest.raises(TabletStoreError):
                await forged.put("probe", b"forged by " + name.encode())
        finally:
            await forged.close()
    # Nor does an ordinary principal's certificate read anything.
    u1 = ca.issue(tls_dir, "u1")
    principal = open_coordinator(
        localstack.with_tls(plain, TlsConfig(str(tls_dir / "ca.pem"), str(u1.cert), str(u1.key)))
    )
    try:
        with pytest.raises(TabletStoreError):
            await principal.get("probe")
    finally:
        await principal.close()
