"""``local-stack up --tls`` leaves no open door beside its TLS ports: its S3 server checks
signatures and its control API is off, etcd's peer port speaks TLS and admits only the stack's
etcd certificate, and etcd has no plaintext metrics port.

Before, moto answered any credentials (made-up ones read every object) and its
``/moto-api/data.json`` dumped them to anyone; etcd's peer and metrics ports were plaintext.
"""

from __future__ import annotations

import json
import socket
import ssl
import stat
import urllib.error
import urllib.request
from pathlib import Path

import boto3
import botocore.config
import botocore.exceptions
import pytest

from tabletstore import connect
from tabletstore.cli import localstack
from tabletstore.cli.local_s3 import read_credentials
from tabletstore.data.model import SetCell

pytestmark = pytest.mark.timeout(180)


def _s3(endpoint: str, key: str, secret: str):  # type: ignore[no-untyped-def]
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        region_name="us-east-1",
        config=botocore.config.Config(retries={"max_attempts": 1}),
    )


def _status(url: str, *, method: str = "GET") -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=5) as r:
            return int(r.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0  # no HTTP answer at all


def _unsigned_body(url: str) -> bytes | None:
    """The body of an unsigned GET if it succeeds (None: refused, whatever the status)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bytes(response.read())
    except (urllib.error.URLError, OSError):
        return None


def _flag(record: localstack.ProcessRecord, name: str) -> str | None:
    for arg in record.argv:
        if arg.startswith(f"--{name}="):
            return arg.split("=", 1)[1]
    return None


def test_local_stack_tls_checks_s3_signatures_and_encrypts_etcd_peers(tmp_path: Path) -> None:
    directory = tmp_path / "stack"
    stack = localstack.up(directory, workers=1, tls=True)
    try:
        assert stack.cluster_url is not None
        db = connect(stack.cluster_url, tls=stack.tls("client"))
        try:
            table = db.create_table("t", ["f"])
            table.mutate_row(b"r", [SetCell("f", b"c", b"in the bucket")])
            row = table.read_row(b"r")
            assert row is not None and row.cells[0].value == b"in the bucket"
        finally:
            db.close()

        # S3: the stack's key works; made-up credentials, a wrong secret and no signature do
        # not; the control API is off.
        assert stack.s3_credentials is not None
        creds = Path(stack.s3_credentials)
        assert stat.S_IMODE(creds.stat().st_mode) == 0o600
        key, secret = read_credentials(creds)
        endpoint = stack.s3_endpoint
        _s3(endpoint, key, secret).put_object(Bucket=localstack.BUCKET, Key="probe", Body=b"x")
        assert localstack.environment(stack)["AWS_ACCESS_KEY_ID"] == key
        for bad_key, bad_secret in (("testing", "testing"), (key, "not-the-secret")):
            with pytest.raises(botocore.exceptions.ClientError) as refused:
                _s3(endpoint, bad_key, bad_secret).get_object(Bucket=localstack.BUCKET, Key="probe")
            code = refused.value.response["Error"]["Code"]
            assert code in ("InvalidAccessKeyId", "SignatureDoesNotMatch"), code
            with pytest.raises(botocore.exceptions.ClientError):
                _s3(endpoint, bad_key, bad_secret).list_objects_v2(Bucket=localstack.BUCKET)
        assert _status(f"{endpoint}/{localstack.BUCKET}/probe") == 403
        assert _unsigned_body(f"{endpoint}/{localstack.BUCKET}?list-type=2") is None
        assert _status(f"{endpoint}/moto-api/data.json") == 403
        assert _status(f"{endpoint}/moto-api/reset-auth", method="POST") == 403

        # etcd: no metrics port; the peer port wants TLS and the stack's etcd certificate.
        etcd = next(r for r in stack.processes if r.role == "etcd")
        assert _flag(etcd, "listen-metrics-urls") is None
        peer = _flag(etcd, "listen-peer-urls")
        assert peer is not None and peer.startswith("https://")
        peer_port = int(peer.rsplit(":", 1)[1])
        assert _status(f"http://127.0.0.1:{peer_port}/members") in (0, 400)
        client_port = int(stack.etcd_url.split(":")[2].split("/")[0])
        assert _status(f"http://127.0.0.1:{client_port}/health") in (0, 400)
        tls_dir = Path(stack.tls_dir or "")
        no_cert = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
        no_cert.check_hostname = False
        with pytest.raises((ssl.SSLError, OSError)):
            _peer_members(peer_port, no_cert)
        client_cert = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
        client_cert.check_hostname = False
        client_cert.load_cert_chain(str(tls_dir / "client.pem"), str(tls_dir / "client.key"))
        with pytest.raises((ssl.SSLError, OSError)):
            _peer_members(peer_port, client_cert)  # a certificate of the CA, not etcd's
        etcd_cert = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
        etcd_cert.check_hostname = False
        etcd_cert.load_cert_chain(str(tls_dir / "etcd.pem"), str(tls_dir / "etcd.key"))
        assert json.loads(_peer_members(peer_port, etcd_cert))  # the member list
    finally:
        localstack.down(directory)


def _peer_members(port: int, context: ssl.SSLContext) -> bytes:
    """GET /members on etcd's peer port over TLS with ``context``; the body, or the error."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw) as conn:
            conn.sendall(b"GET /members HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            # Read to the body's declared length: etcd does not always close the connection
            # after its answer (waiting for the close timed out about one run in four).
            data = b""
            while b"\r\n\r\n" not in data and (chunk := conn.recv(65536)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = _content_length(head)
            while (length is None or len(body) < length) and (chunk := conn.recv(65536)):
                body += chunk
    if b" 200 " not in head.split(b"\r\n", 1)[0] + b" ":
        raise OSError(f"peer port answered {head[:40]!r}")
    return body


def _content_length(head: bytes) -> int | None:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value.strip())
    return None
