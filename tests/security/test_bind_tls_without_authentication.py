"""A public bind with TLS but nobody authenticated.

The attack: the Cloud Bigtable front door started with ``--tls-cert`` over an embedded database
on a non-loopback host. The bind check took TLS for authentication, so it served, and
everyone who could reach the port read and wrote everything: over an embedded database the
front door checks no tokens, and TLS only encrypts. Now the bind check asks whether callers
are authenticated (a cluster's certificates or tokens) and refuses without ``--insecure``.

Run as the real CLI (``python -m tabletstore.cli.main``), bounded by a 30 s timeout: a front
door that starts serving is the failure.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tabletstore.security import ca

pytestmark = pytest.mark.timeout(120)


def test_tls_over_an_embedded_database_does_not_satisfy_the_bind_check(tmp_path: Path) -> None:
    ca.init_ca(tmp_path)
    issued = ca.issue(tmp_path, "frontdoor", role="function")
    args = [
        sys.executable,
        "-m",
        "tabletstore.cli.main",
        "--url",
        "memory://bind-check",
        "bigtable-api",
        "--host",
        "0.0.0.0",
        "--port",
        "0",
        "--tls-cert",
        str(issued.cert),
        "--tls-key",
        str(issued.key),
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        result = subprocess.run(args, capture_output=True, text=True, timeout=30, env=env)
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"the front door served on 0.0.0.0: {exc.stdout!r}") from exc
    assert result.returncode == 1, result.stdout + result.stderr
    said = result.stdout + result.stderr
    assert "without authenticating callers" in said and "--insecure" in said
