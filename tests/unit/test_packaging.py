"""A plain ``pip install tabletstore`` brings what ``tabletstore local-stack up`` runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tabletstore.cli import localstack

ROOT = Path(__file__).resolve().parents[2]


def test_local_stack_needs_only_runtime_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [d.replace(" ", "") for d in project["dependencies"]]
    # local-stack up starts moto's server through `python -m tabletstore.cli.local_s3`, which
    # runs `moto.server` (its conditional writes locked): that needs moto's server extra (flask).
    assert any(d.startswith("moto[server]") for d in runtime), runtime
    assert not any(d.startswith("moto") for d in project["optional-dependencies"]["test"])
    assert "tabletstore.cli.local_s3" in localstack.start_moto.__code__.co_consts
    assert "moto.server" in (ROOT / "tabletstore" / "cli" / "local_s3.py").read_text()
