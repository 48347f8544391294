"""The layer map has one source: the import-linter contract in pyproject.toml. The copy in
docs/ARCHITECTURE.md §2 must repeat it, and every module but the base ones lives in a
subsystem folder."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BASE_MODULES = {"__init__.py", "errors.py", "clock.py", "options.py", "keys.py", "embedded.py", "limits.py", "pid_liveness.py", "extras.py"}


def contract_layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [
        " | ".join(p.strip().removeprefix("tabletstore.") for p in layer.split("|"))
        for layer in layers
    ]


def test_architecture_md_repeats_the_contract() -> None:
    doc = (ROOT / "docs" / "ARCHITECTURE.md").read_text()
    block = re.search(r"<!-- layers: .*?-->\n```\n(.*?)```", doc, re.S)
    assert block is not None, "ARCHITECTURE.md §2 has lost its layers block"
    assert block.group(1).split("\n")[:-1] == contract_layers()


def test_every_subsystem_folder_is_a_layer_and_no_module_sits_loose() -> None:
    package = ROOT / "tabletstore"
    folders = {p.name for p in package.iterdir() if (p / "__init__.py").exists()}
    named = {name for layer in contract_layers() for name in layer.split(" | ")}
    assert folders <= named, f"folders missing from the layer map: {sorted(folders - named)}"
    loose = {p.name for p in package.glob("*.py")} - BASE_MODULES
    assert not loose, f"modules outside a subsystem folder: {sorted(loose)}"
