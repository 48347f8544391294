"""The plan of a whole environment (infra/terraform/environments/*) against moto, as JSON.

The environments are planned as an operator would apply them, with two differences: a copy of
infra/terraform gets an override file giving the environment's AWS provider moto's endpoint
and dummy credentials, and its state a local file instead of the S3 backend (Terraform merges
``*_override.tf`` into the provider and backend blocks). Nothing else is restated: tests read the commands, environments, policies and key policies from
``terraform show -json`` of this plan.
"""

from __future__ import annotations

import json
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.unit.test_terraform import GOOD_VARS, TF, plugin_dir, terraform

#: Every service an environment's provider calls while planning (data sources) or applying.
SERVICES = (
    "autoscaling",
    "cloudwatch",
    "ec2",
    "ecs",
    "events",
    "iam",
    "kms",
    "lambda",
    "logs",
    "s3",
    "sns",
    "sqs",
    "sts",
    "applicationautoscaling",
)


def moto_override(endpoint: str, state: Path) -> str:
    endpoints = "\n".join(f'    {s} = "{endpoint}"' for s in SERVICES)
    return f"""terraform {{
  backend "local" {{
    path = "{state}"
  }}
}}

provider "aws" {{
  access_key                  = "testing"
  secret_key                  = "testing"
  skip_credentials_validation = true
  skip_metadata_api_check     = true
  skip_region_validation      = true
  s3_use_path_style           = true
  endpoints {{
{endpoints}
  }}
}}
"""


@dataclass(frozen=True)
class Plan:
    """``terraform show -json`` of a plan: its resources, by address."""

    raw: dict[str, Any]

    @property
    def resources(self) -> dict[str, dict[str, Any]]:
        found: dict[str, dict[str, Any]] = {}

        def walk(module: dict[str, Any]) -> None:
            for resource in module.get("resources", []):
                found[resource["address"]] = resource
            for child in module.get("child_modules", []):
                walk(child)

        walk(self.raw["planned_values"]["root_module"])
        return found

    def of_type(self, kind: str) -> dict[str, dict[str, Any]]:
        """Planned values of every resource of ``kind``, by address."""
        return {a: r["values"] for a, r in self.resources.items() if r["type"] == kind}

    def one(self, address: str) -> dict[str, Any]:
        return self.resources[address]["values"]  # type: ignore[no-any-return]

    def unknown(self, address: str) -> dict[str, Any]:
        """Which of a resource's planned values are known only after apply (``after_unknown``:
        the same shape as its values, ``true`` where unknown)."""
        for change in self.raw["resource_changes"]:
            if change["address"] == address:
                return change["change"].get("after_unknown") or {}  # type: ignore[no-any-return]
        raise KeyError(address)

    def container_definitions(self) -> dict[str, list[dict[str, Any]]]:
        """Each ECS task definition's containers (decoded), by family."""
        return {
            values["family"]: json.loads(values["container_definitions"])
            for values in self.of_type("aws_ecs_task_definition").values()
        }

    def data_policy(self, address: str) -> dict[str, Any]:
        """A policy document data source's JSON, read from the plan's prior state."""
        for resource in _state_resources(self.raw.get("prior_state", {})):
            if resource["address"] == address:
                return json.loads(resource["values"]["json"])  # type: ignore[no-any-return]
        raise KeyError(address)


def _state_resources(state: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def walk(module: dict[str, Any]) -> None:
        out.extend(module.get("resources", []))
        for child in module.get("child_modules", []):
            walk(child)

    walk(state.get("values", {}).get("root_module", {}))
    return out


#: What moto can apply (tests/unit/test_terraform.py applies the first three): applied first,
#: so that the plan of the rest knows their ARNs and ids, and every IAM and key policy and
#: the etcd members' boot scripts (which name their volume and interface) are in it.
APPLIED_FIRST = (
    "module.storage",
    "module.network",
    "module.functions",
    "module.etcd.aws_network_interface.member",
    "module.etcd.aws_ebs_volume.data",
)


def plan_environment(
    env: str, endpoint: str, work: Path, *, source: Path = TF, **overrides: str
) -> Plan:
    """Apply :data:`APPLIED_FIRST` of ``environments/<env>`` (of the tree ``source``) to moto at
    ``endpoint``, then plan the whole environment."""
    tree = work / "terraform"
    shutil.copytree(
        source,
        tree,
        ignore=shutil.ignore_patterns(".terraform", "*.tfstate*", ".terraform.lock.hcl"),
    )
    directory = tree / "environments" / env
    (directory / "moto_override.tf").write_text(moto_override(endpoint, work / "terraform.tfstate"))
    data_dir = work / "data"
    terraform(directory, "init", f"-plugin-dir={plugin_dir()}", data_dir=data_dir)
    values = {**GOOD_VARS, "bucket_name": f"tabletstore-{env}-{uuid.uuid4().hex[:8]}", **overrides}
    variables = [f"-var={k}={v}" for k, v in values.items()]
    terraform(
        directory,
        "apply",
        "-input=false",
        "-auto-approve",
        *[f"-target={t}" for t in APPLIED_FIRST],
        *variables,
        data_dir=data_dir,
        timeout=600,
    )
    # Without refreshing: the state is the apply's, moments old (a refresh reads every applied
    # resource back from moto first, for nothing).
    terraform(
        directory,
        "plan",
        "-input=false",
        "-refresh=false",
        "-out=plan.bin",
        *variables,
        data_dir=data_dir,
        timeout=300,
    )
    shown = terraform(directory, "show", "-json", "plan.bin", data_dir=data_dir, timeout=120)
    return Plan(json.loads(shown.stdout))
