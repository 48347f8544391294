"""A plain ``pip install tabletstore`` brings what ``tabletstore local-stack up`` runs."""

from __future__ import annotations

import tomllib
from pathlib import Path

from tabletstore.cli import localstack

ROOT = Path(__file__).resolve().parents[2]


def test_local_stack_needs_only_runtime_dependencies() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = [d.replace(" ", "") for d in project["dependencies"]]
    # local-stack up starts `python -m moto.server`, which needs moto's server extra (flask).
    assert any(d.startswith("moto[server]") for d in runtime), runtime
    assert not any(d.startswith("moto") for d in project["optional-dependencies"]["test"])
    assert "moto.server" in localstack.start_moto.__code__.co_consts
