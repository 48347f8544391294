"""The Terraform storage tier parses as HCL and wires the module to the environment.

No terraform binary can be installed here (HashiCorp's downloads are not a package registry),
so this pins what can be checked offline: syntax, the module's inputs and outputs, and that
the environment passes every required input."""

from __future__ import annotations

from pathlib import Path

import hcl2

ROOT = Path(__file__).resolve().parents[2] / "infra" / "terraform"


def _load(path: Path) -> dict:
    with path.open() as f:
        return hcl2.load(f)


def _blocks(directory: Path, kind: str) -> dict[str, dict]:
    """Blocks of one kind by their (unquoted) label; attribute names without the parser's
    bookkeeping keys."""
    out: dict[str, dict] = {}
    for tf in sorted(directory.glob("*.tf")):
        for block in _load(tf).get(kind, []):
            for label, body in block.items():
                out[label.strip('"')] = {k: v for k, v in body.items() if not k.startswith("__")}
    return out


def test_every_file_parses() -> None:
    files = sorted(ROOT.rglob("*.tf"))
    assert files
    for tf in files:
        _load(tf)


def test_environment_passes_every_required_module_input() -> None:
    module_dir = ROOT / "modules" / "bucket"
    variables = _blocks(module_dir, "variable")
    required = {name for name, spec in variables.items() if "default" not in spec}
    env = _blocks(ROOT / "environments" / "dev", "module")["storage"]
    assert required <= set(env), f"missing module inputs: {required - set(env)}"
    assert set(env) - {"source"} <= set(variables), "the environment passes unknown inputs"


def test_module_outputs_the_store_url_and_policies() -> None:
    outputs = _blocks(ROOT / "modules" / "bucket", "output")
    assert {"store_url", "read_write_policy_arn", "read_only_policy_arn"} <= set(outputs)
    assert "s3://" in str(outputs["store_url"]["value"])
