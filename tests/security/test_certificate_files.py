"""Key files and the CA folder readable by others.

The attack: a key file once left 0644 (by a copy, an editor, an umask) stayed 0644 when the
certificate was issued again over it -- ``os.open`` applies its mode only when it creates the
file -- and the new certificate replaced the old one silently; under umask 000 the CA folder
was made world-writable, so anyone on the machine could swap the CA. Now a key is written 0600
whether or not it existed, issuing over an existing certificate or key is refused without
``force`` (``certs issue --force``), and the CA folder is 0700 whatever the umask.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from tabletstore.errors import AlreadyExists
from tabletstore.security import ca


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_reissued_key_is_0600_and_never_replaced_silently(tmp_path: Path) -> None:
    ca.init_ca(tmp_path)
    first = ca.issue(tmp_path, "u1")
    os.chmod(first.key, 0o644)  # left readable by hand
    before = first.cert.read_bytes()
    with pytest.raises(AlreadyExists, match="--force"):
        ca.issue(tmp_path, "u1")
    assert first.cert.read_bytes() == before
    again = ca.issue(tmp_path, "u1", force=True)
    assert _mode(again.key) == 0o600
    assert again.cert.read_bytes() != before


def test_the_cli_says_so_and_replaces_with_force(tmp_path: Path) -> None:
    from tabletstore.cli.main import main

    ca.init_ca(tmp_path)
    runner = CliRunner()
    args = ["certs", "issue", "u2", "--dir", str(tmp_path)]
    assert runner.invoke(main, args).exit_code == 0
    refused = runner.invoke(main, args)
    assert refused.exit_code != 0 and "--force" in refused.output
    assert runner.invoke(main, [*args, "--force"]).exit_code == 0


def test_the_ca_folder_is_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        ca.init_ca(tmp_path / "ca")
        issued = ca.issue(tmp_path / "ca", "u3", out=tmp_path / "issued")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "ca") == 0o700
    assert _mode(tmp_path / "issued") == 0o700
    assert _mode(tmp_path / "ca" / "ca.key") == 0o600 and _mode(issued.key) == 0o600
