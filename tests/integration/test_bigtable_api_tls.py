"""TLS for the front door: a self-signed certificate made here with ``cryptography``, served
with ``BigtableApiServer(tls=...)`` and ``tabletstore bigtable-api --tls-cert/--tls-key``, and
the official clients connecting over TLS (Google's generated clients in process, and the
handwritten admin and data clients in a subprocess that trusts the certificate through
``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``). Plaintext clients and bad key files are refused."""

from __future__ import annotations

import datetime
import ipaddress
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.bigtable")
pytest.importorskip("cryptography")

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.cloud.bigtable_admin_v2 import BigtableTableAdminClient
from google.cloud.bigtable_admin_v2.services.bigtable_table_admin.transports import (
    BigtableTableAdminGrpcTransport,
)
from google.cloud.bigtable_v2 import BigtableClient
from google.cloud.bigtable_v2.services.bigtable.transports import BigtableGrpcTransport

from tabletstore.bigtable_api.front_door import BackgroundServer, TlsFiles
from tabletstore.errors import InvalidArgument

REPO = Path(__file__).resolve().parents[2]
PARENT = "projects/tls-project/instances/tls-instance"


def self_signed(directory: Path) -> TlsFiles:
    """A certificate for localhost and 127.0.0.1, and its key, as PEM files."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
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
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return TlsFiles(str(cert_path), str(key_path))


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return self_signed(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def server(tls: TlsFiles) -> Iterator[BackgroundServer]:
    with BackgroundServer(f"memory://tls-{uuid.uuid4().hex}", tls=tls) as srv:
        yield srv


def test_generated_clients_over_tls(server: BackgroundServer, tls: TlsFiles) -> None:
    creds = grpc.ssl_channel_credentials(root_certificates=Path(tls.cert).read_bytes())
    with grpc.secure_channel(f"localhost:{server.port}", creds) as channel:
        admin = BigtableTableAdminClient(transport=BigtableTableAdminGrpcTransport(channel=channel))
        table = admin.create_table(
            request={"parent": PARENT, "table_id": "t", "table": {"column_families": {"cf": {}}}}
        )
        data = BigtableClient(transport=BigtableGrpcTransport(channel=channel))
        data.mutate_row(
            request={
                "table_name": table.name,
                "row_key": b"k",
                "mutations": [
                    {"set_cell": {"family_name": "cf", "column_qualifier": b"q", "value": b"v"}}
                ],
            }
        )
        chunks = [c for r in data.read_rows(request={"table_name": table.name}) for c in r.chunks]
        assert [(c.row_key, c.value) for c in chunks] == [(b"k", b"v")]


def test_plaintext_clients_are_refused(server: BackgroundServer) -> None:
    with grpc.insecure_channel(server.address) as channel:
        data = BigtableClient(transport=BigtableGrpcTransport(channel=channel))
        with pytest.raises(Exception) as info:
            list(data.read_rows(request={"table_name": f"{PARENT}/tables/t"}, timeout=10))
        assert "UNAVAILABLE" in repr(info.value) or "503" in str(info.value)


def test_the_handwritten_clients_over_tls(server: BackgroundServer, tls: TlsFiles) -> None:
    """google-cloud-bigtable's admin and data clients, pointed at the endpoint (not in
    emulator mode), trusting the certificate."""
    script = textwrap.dedent(
        f"""
        import warnings
        warnings.simplefilter("ignore")
        from google.api_core.client_options import ClientOptions
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.bigtable import Client
        from google.cloud.bigtable.data import BigtableDataClient, SetCell
        opts = ClientOptions(api_endpoint="localhost:{server.port}")
        creds = AnonymousCredentials()
        admin = Client(project="p", admin=True, credentials=creds, client_options=opts)
        admin.instance("i").table("hand").create(column_families={{"cf": None}})
        with BigtableDataClient(project="p", credentials=creds, client_options=opts) as client:
            table = client.get_table("i", "hand")
            table.mutate_row(b"k", SetCell("cf", b"q", b"over-tls", 1000))
            print([c.value for c in table.read_row(b"k")])
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "BIGTABLE_EMULATOR_HOST"}
    env["GRPC_DEFAULT_SSL_ROOTS_FILE_PATH"] = tls.cert
    out = subprocess.run(
        [sys.executable, "-c", script],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[b'over-tls']"
    # The clients' metrics export reached the front door and was accepted.
    assert "Failed to export metrics" not in out.stderr


def test_bad_tls_files_are_named(tmp_path: Path, tls: TlsFiles) -> None:
    with pytest.raises(InvalidArgument, match="cannot read the TLS certificate"):
        TlsFiles(str(tmp_path / "missing.pem"), tls.key).credentials()
    (tmp_path / "junk.pem").write_text("not a key")
    with pytest.raises(InvalidArgument, match="is not a PEM file"):
        TlsFiles(tls.cert, str(tmp_path / "junk.pem")).credentials()
    with pytest.raises(InvalidArgument, match="holds no private key"):
        TlsFiles(tls.cert, tls.cert).credentials()


def test_the_command_serves_tls(tmp_path: Path, tls: TlsFiles) -> None:
    cmd = [sys.executable, "-m", "tabletstore.cli.main", "bigtable-api", "--url"]
    cmd += [f"file://{tmp_path / 'db'}", "--port", "0"]
    half = subprocess.run(
        [*cmd, "--tls-cert", tls.cert], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert half.returncode == 1 and "--tls-cert and --tls-key go together" in half.stderr
    proc = subprocess.Popen(
        [*cmd, "--tls-cert", tls.cert, "--tls-key", tls.key],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.startswith("bigtable-api listening with TLS on 127.0.0.1:"), line
        port = int(line.rsplit(":", 1)[1])
        creds = grpc.ssl_channel_credentials(root_certificates=Path(tls.cert).read_bytes())
        with grpc.secure_channel(f"localhost:{port}", creds) as channel:
            admin = BigtableTableAdminClient(
                transport=BigtableTableAdminGrpcTransport(channel=channel)
            )
            assert list(admin.list_tables(request={"parent": PARENT})) == []
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0
