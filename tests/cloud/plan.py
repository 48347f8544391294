"""The Terraform plan the rehearsal runs: ``environments/dev`` against moto, as JSON.

The plan is the one source of commands, environment and policies (nothing here restates
them). Planned alone, the environment leaves most of what the rehearsal reads unknown (a
container definition names the bucket, whose attributes are known only once it exists), so
:func:`plan_json` first applies, against moto's server, the resources whose attributes the
others read -- the bucket module and the functions module with what they depend on -- and then
plans the whole environment from that state: every task definition, function and policy is
then known. The provider is pointed at moto by an override file in a copy of
``infra/terraform`` (the sources are never touched).

The result is cached by the hash of ``infra/terraform``'s files, the variables, the targets
applied first and Terraform's version (``plan-<hash>.json`` in the cache directory): an unchanged tree is not
planned again.

The readers (:func:`task_definitions`, :func:`functions`, :func:`role_policies`) are pure.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ENVIRONMENT",
    "VARIABLES",
    "functions",
    "plan_json",
    "resources",
    "role_policies",
    "scheduled_events",
    "task_definitions",
]

ROOT = Path(__file__).resolve().parents[2]
TF = ROOT / "infra" / "terraform"
ENVIRONMENT = "dev"
#: The roles of the cluster's RPC certificates (infra/terraform/scripts/cluster-tls.sh).
TLS_ROLES = ("master", "worker", "client", "function")
#: The environment's variables (what an operator's dev.tfvars gives).
VARIABLES = {
    "region": "us-east-1",
    "bucket_name": "tabletstore-dev-rehearsal",
    "availability_zones": '["us-east-1a","us-east-1b","us-east-1c"]',
    "image_uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/tabletstore:rehearsal",
    "etcd_ami_id": "ami-0123456789abcdef0",
    "etcd_ca_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:etcd-ca",
    "etcd_client_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:etcd-client",
    "tls_secret_arns": json.dumps(
        {r: f"arn:aws:secretsmanager:us-east-1:123456789012:secret:tls-{r}" for r in TLS_ROLES}
    ),
}
#: Resources applied first, so that the plan knows what the others read of them (the etcd
#: members' boot scripts name their volume and interface, and those their subnets).
TARGETS = (
    "module.storage",
    "module.network",
    "module.functions",
    "module.etcd.aws_network_interface.member",
    "module.etcd.aws_ebs_volume.data",
)
#: The AWS services the provider may call while applying TARGETS and planning; all go to moto.
SERVICES = (
    "ec2", "iam", "kms", "lambda", "logs", "s3", "sqs", "sts", "ecs", "autoscaling",
    "applicationautoscaling", "secretsmanager", "cloudwatch", "ssm", "events", "scheduler",
    "elbv2", "dynamodb", "route53", "servicediscovery", "sns",
)  # fmt: skip
#: Where machine images put the AWS provider (searched in order; TF_PLUGIN_DIR first).
PLUGIN_DIRS = ("/opt/tf-plugins", "~/.terraform.d/plugins", "/usr/share/terraform/plugins")


class TerraformError(Exception):
    """A terraform command failed (its output is in the message)."""


def _plugin_dir() -> Path:
    candidates = [Path(os.environ["TF_PLUGIN_DIR"])] if "TF_PLUGIN_DIR" in os.environ else []
    candidates += [Path(p).expanduser() for p in PLUGIN_DIRS]
    for candidate in candidates:
        if any(candidate.glob("registry.terraform.io/hashicorp/aws/*/*/terraform-provider-aws*")):
            return candidate
    raise TerraformError("no terraform-provider-aws plugin directory (set TF_PLUGIN_DIR)")


def _override(endpoint: str, state: Path) -> str:
    lines = [
        # State on local disk, whatever backend the environment names (its S3 state bucket).
        "terraform {",
        '  backend "local" {',
        f'    path = "{state}"',
        "  }",
        "}",
        'provider "aws" {',
        '  region                      = "us-east-1"',
        '  access_key                  = "testing"',
        '  secret_key                  = "testing"',
        "  skip_credentials_validation = true",
        "  skip_metadata_api_check     = true",
        "  skip_region_validation      = true",
        "  s3_use_path_style           = true",
        "  endpoints {",
        *(f'    {service} = "{endpoint}"' for service in SERVICES),
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


def _terraform(directory: Path, data_dir: Path, *args: str, timeout: float = 600) -> str:
    binary = shutil.which("terraform")
    if binary is None:
        raise TerraformError("terraform is not on PATH")
    env = {
        **os.environ,
        "TF_DATA_DIR": str(data_dir),
        "TF_IN_AUTOMATION": "1",
        "TF_INPUT": "0",
        "CHECKPOINT_DISABLE": "1",
        "TF_CLI_CONFIG_FILE": os.devnull,
        # Terraform and the provider it starts collect garbage at 4x the live heap, not 2x:
        # about a sixth less CPU for the provider's start-ups, about 60 MB more each.
        "GOGC": "400",
    }
    result = subprocess.run(
        [binary, *args], cwd=directory, env=env, capture_output=True, text=True, timeout=timeout
    )
    if result.returncode != 0:
        raise TerraformError(f"terraform {args[0]} failed:\n{result.stderr[-4000:]}")
    return result.stdout


def _tree_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(TF.rglob("*")):
        if path.is_file() and ".terraform" not in path.parts and path.suffix != ".tfstate":
            digest.update(str(path.relative_to(TF)).encode() + b"\0" + path.read_bytes())
    digest.update(json.dumps(VARIABLES, sort_keys=True).encode())
    digest.update(json.dumps(TARGETS).encode())
    version = subprocess.run(["terraform", "version"], capture_output=True, text=True).stdout
    digest.update(version.encode())
    return digest.hexdigest()[:16]


def plan_json(work: Path, cache: Path | None, log: Any = print) -> dict[str, Any]:
    """``terraform show -json`` of the environment's plan (module docstring)."""
    key = _tree_hash()
    cached = cache / f"plan-{key}.json" if cache is not None else None
    if cached is not None and cached.exists():
        log(f"plan: cached ({cached.name})")
        return dict(json.loads(cached.read_text()))
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        tree = work / "terraform"
        shutil.rmtree(tree, ignore_errors=True)
        shutil.copytree(TF, tree, ignore=shutil.ignore_patterns(".terraform*", "*.tfstate*"))
        env_dir = tree / "environments" / ENVIRONMENT
        state = work / "terraform.tfstate"
        (env_dir / "rehearsal_override.tf").write_text(_override(endpoint, state))
        data_dir = work / "tf-data"
        variables = [f"-var={k}={v}" for k, v in VARIABLES.items()]
        _terraform(env_dir, data_dir, "init", "-reconfigure", f"-plugin-dir={_plugin_dir()}")
        log(f"plan: apply {', '.join(TARGETS)} against moto, then plan {ENVIRONMENT}")
        targets = [f"-target={t}" for t in TARGETS]
        _terraform(env_dir, data_dir, "apply", "-auto-approve", *targets, *variables)
        plan_file = work / "plan.tfplan"
        _terraform(env_dir, data_dir, "plan", "-refresh=false", f"-out={plan_file}", *variables)
        document = json.loads(_terraform(env_dir, data_dir, "show", "-json", str(plan_file)))
    finally:
        server.stop()
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        for old in cached.parent.glob("plan-*.json"):
            old.unlink()
        # Whole or not at all: a run stopped mid-write leaves no half plan for the next.
        partial = cached.with_suffix(".part")
        partial.write_text(json.dumps(document))
        partial.replace(cached)
    return dict(document)


def _walk(module: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    yield from module.get("resources", [])
    for child in module.get("child_modules", []):
        yield from _walk(child)


def resources(plan: Mapping[str, Any], *, prior: bool = False) -> Iterator[dict[str, Any]]:
    """Every resource of the plan's planned values (``prior``: of the state it was planned
    from), child modules included."""
    if prior:
        yield from _walk((plan.get("prior_state") or {}).get("values", {}).get("root_module", {}))
    else:
        yield from _walk(plan["planned_values"]["root_module"])


def _values(plan: Mapping[str, Any], kind: str, *, prior: bool = False) -> list[dict[str, Any]]:
    return [dict(r["values"]) for r in resources(plan, prior=prior) if r["type"] == kind]


def _expressions(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Configuration expressions by resource address without index (module.x.type.name)."""
    found: dict[str, dict[str, Any]] = {}

    def walk(module: Mapping[str, Any], prefix: str) -> None:
        for resource in module.get("resources", []):
            found[prefix + resource["address"]] = resource.get("expressions", {})
        for name, call in module.get("module_calls", {}).items():
            walk(call.get("module", {}), f"{prefix}module.{name}.")

    walk(plan["configuration"]["root_module"], "")
    return found


def _role_of(plan: Mapping[str, Any], resource: Mapping[str, Any], attribute: str) -> str:
    """The address of the aws_iam_role that ``resource``'s ``attribute`` names (with the
    resource's own index, for a role made per key as the resource is)."""
    bare = resource["address"].split("[", 1)[0]
    module = bare.rsplit(f".{resource['type']}.", 1)[0] if bare.startswith("module.") else ""
    expressions = _expressions(plan).get(bare, {})
    refs = expressions.get(attribute, {}).get("references", [])
    named = dict.fromkeys(
        r.split("[", 1)[0] for r in refs if r.startswith("aws_iam_role.") and r.count(".") == 1
    )
    # A conditional (``x ? aws_iam_role.a[0].arn : aws_iam_role.b.arn``) names both roles: the
    # one this plan makes is the one the resource gets.
    planned = {
        r["address"].split("[", 1)[0] for r in resources(plan) if r["type"] == "aws_iam_role"
    }
    prefix = f"{module}." if module else ""
    made = [r for r in named if prefix + r in planned]
    if len(made) != 1:
        raise TerraformError(
            f"{resource['address']}.{attribute} names no single planned aws_iam_role: {refs}"
        )
    role = made[0]
    index = resource.get("index")
    suffix = f"[{json.dumps(index)}]" if index is not None else ""
    return prefix + role + suffix


def task_definitions(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """ECS task definitions by family: ``{"containers", "volumes", "task_role"}`` (the task
    role's resource address)."""
    found = {}
    for resource in resources(plan):
        if resource["type"] != "aws_ecs_task_definition":
            continue
        values = resource["values"]
        if "container_definitions" not in values:
            raise TerraformError(f"task definition {values.get('family')}: not known at plan")
        found[values["family"]] = {
            "containers": json.loads(values["container_definitions"]),
            "volumes": [v["name"] for v in values.get("volume") or []],
            "task_role": _role_of(plan, {**resource, "index": None}, "task_role_arn"),
        }
    return found


def functions(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The planned Lambda functions' values by function name, each with ``role_address``."""
    found = {}
    for resource in resources(plan):
        if resource["type"] == "aws_lambda_function":
            values = dict(resource["values"])
            values["role_address"] = _role_of(plan, resource, "role")
            found[values["function_name"]] = values
    return found


def scheduled_events(plan: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Function name -> the event an EventBridge rule of the plan invokes it with (the
    target's constant ``input``)."""
    found = {}
    for values in _values(plan, "aws_cloudwatch_event_target"):
        arn = values.get("arn")
        if isinstance(arn, str) and ":function:" in arn and isinstance(values.get("input"), str):
            found[arn.rsplit(":function:", 1)[1]] = json.loads(values["input"])
    return found


def role_policies(plan: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """IAM role (resource address) -> its policy documents: inline ones and attached managed
    ones of the plan (a managed policy applied first is found in the prior state by ARN)."""
    managed = {
        v["arn"]: json.loads(v["policy"])
        for v in _values(plan, "aws_iam_policy", prior=True)
        if isinstance(v.get("arn"), str) and isinstance(v.get("policy"), str)
    }
    by_role: dict[str, list[dict[str, Any]]] = {}
    for resource in resources(plan):
        values = resource["values"]
        if resource["type"] == "aws_iam_role_policy":
            if not isinstance(values.get("policy"), str):
                # Known only at apply (it names resources not applied first): its role is
                # not one the rehearsal checks unless the caller finds this marker.
                document = {"unknown": resource["address"]}
            else:
                document = json.loads(values["policy"])
        elif resource["type"] == "aws_iam_role_policy_attachment":
            arn = values.get("policy_arn")
            if arn not in managed:
                continue  # an AWS managed policy (not in the plan)
            document = managed[arn]
        else:
            continue
        by_role.setdefault(_role_of(plan, resource, "role"), []).append(document)
    return by_role
