"""What AWS enforces at apply and at run time, checked on the plan of the prod environment.

moto enforces neither KMS key policies nor Fargate's or Lambda's rules, so an apply against it
passes where AWS fails. These tests read ``terraform show -json`` of the prod environment's
plan against moto (tests/unit/terraform_plan.py) and check what AWS would refuse: every
service that uses the KMS key is granted it, the etcd members can attach their interface and
volume, the tasks' writable paths exist on a read-only root, the functions' image command is
the entrypoint's, and the contract between Terraform and the code: every environment
variable a module sets is read by the program it reaches, and every command and flag is
accepted by the click command, the etcd or etcdctl it reaches (their own parsers, not a list).
"""

from __future__ import annotations

import base64
import fnmatch
import json
import os
import re
import shlex
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest

from functions.etcd_tls import ENV_SECRET
from functions.rpc_tls import ENV_TLS_SECRET
from tabletstore.cli.main import main
from tabletstore.security.tls import ENV_CA, ENV_CERT, ENV_KEY
from tests.unit.terraform_plan import Plan, plan_environment

ROOT = Path(__file__).resolve().parents[2]
TF = ROOT / "infra" / "terraform"
ENTRYPOINT = ROOT / "docker" / "entrypoint.sh"
REGION = "us-east-1"
HANDLERS = {
    "log_sort": "functions.log_sort.handler",
    "compaction": "functions.compaction.handler",
    "gc": "functions.gc.handler",
}

pytestmark = [pytest.mark.slow, pytest.mark.no_cluster]


@pytest.fixture(scope="module")
def plan(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> Plan:
    return plan_environment("prod", s3_server, tmp_path_factory.mktemp("plan-prod"))


def statements(policy: str | dict[str, Any]) -> list[dict[str, Any]]:
    document = json.loads(policy) if isinstance(policy, str) else policy
    found = document["Statement"]
    return found if isinstance(found, list) else [found]


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def allows(statement: dict[str, Any], action: str) -> bool:
    return statement.get("Effect", "Allow") == "Allow" and any(
        fnmatch.fnmatchcase(action, pattern) for pattern in as_list(statement.get("Action", []))
    )


def key_policy(plan: Plan) -> list[dict[str, Any]]:
    (key,) = plan.of_type("aws_kms_key").values()
    return statements(key["policy"])


# 1-2: the key policy -------------------------------------------------------------------------


def test_cloudwatch_logs_may_use_the_key_of_every_encrypted_log_group(plan: Plan) -> None:
    groups = plan.of_type("aws_cloudwatch_log_group")
    assert len(groups) == 5, sorted(groups)  # flow logs, the cluster, three functions
    logs = [
        s
        for s in key_policy(plan)
        if s.get("Principal", {}).get("Service") == f"logs.{REGION}.amazonaws.com"
    ]
    assert logs, "no statement for CloudWatch Logs' service principal: CreateLogGroup fails"
    (statement,) = logs
    for action in ("kms:Encrypt", "kms:Decrypt", "kms:GenerateDataKey", "kms:ReEncryptFrom"):
        assert allows(statement, action), action
    patterns = as_list(statement["Condition"]["ArnLike"]["kms:EncryptionContext:aws:logs:arn"])
    for group in groups.values():
        arn = f"arn:aws:logs:{REGION}:123456789012:log-group:{group['name']}"
        assert any(fnmatch.fnmatchcase(arn, p) for p in patterns), (arn, patterns)


def test_no_volume_auto_scaling_launches_needs_a_grant_of_the_key(plan: Plan) -> None:
    """The Auto Scaling service-linked role launches the members' instances: a customer key
    on a launch template's volume would need that role in the key policy (which cannot name
    it before the role exists). The root volumes use the AWS-managed EBS key instead; the
    data volumes are Terraform's, attached by the member role."""
    templates = plan.of_type("aws_launch_template")
    assert len(templates) == 3
    slr = "AWSServiceRoleForAutoScaling"
    granted = any(slr in json.dumps(s.get("Principal", {})) for s in key_policy(plan))
    for address, template in templates.items():
        unknown = plan.unknown(address).get("block_device_mappings") or []
        for i, mapping in enumerate(template["block_device_mappings"]):
            for j, ebs in enumerate(mapping["ebs"]):
                assert ebs["encrypted"] == "true"
                later = unknown[i]["ebs"][j].get("kms_key_id") if i < len(unknown) else False
                customer_key = bool(ebs.get("kms_key_id")) or later is True
                assert granted or not customer_key, (
                    f"{address}: a volume encrypted with a customer key the Auto Scaling role "
                    "has no grant of: the instance never launches"
                )
    for values in plan.of_type("aws_ebs_volume").values():
        assert values["encrypted"] is True


# 3: the etcd members -------------------------------------------------------------------------


def member_scripts(plan: Plan) -> dict[str, str]:
    return {
        address: base64.b64decode(values["user_data"]).decode()
        for address, values in plan.of_type("aws_launch_template").items()
    }


def member_policy(plan: Plan) -> list[dict[str, Any]]:
    (policy,) = [
        v for a, v in plan.of_type("aws_iam_role_policy").items() if a.startswith("module.etcd.")
    ]
    return statements(policy["policy"])


def test_members_reach_ec2_and_may_attach_their_tagged_interface_and_volume(plan: Plan) -> None:
    endpoints = {v["service_name"] for v in plan.of_type("aws_vpc_endpoint").values()}
    for service in ("ec2", "ecr.api", "ecr.dkr", "secretsmanager", "sts", "monitoring"):
        assert f"com.amazonaws.{REGION}.{service}" in endpoints, service
    (attach,) = [s for s in member_policy(plan) if allows(s, "ec2:AttachVolume")]
    assert allows(attach, "ec2:AttachNetworkInterface")
    ((tag_key, wanted),) = attach["Condition"]["StringEquals"].items()
    tag = tag_key.removeprefix("aws:ResourceTag/")
    tagged = [
        *plan.of_type("aws_network_interface").values(),
        *plan.of_type("aws_ebs_volume").values(),
    ]
    assert len(tagged) == 6
    for resource in tagged:
        assert resource["tags"].get(tag) == wanted, resource["tags"]
    for group in plan.of_type("aws_autoscaling_group").values():
        assert {"key": tag, "value": wanted, "propagate_at_launch": True} in group["tag"]


def test_member_script_runs_etcd_as_the_image_user_on_its_own_files(plan: Plan) -> None:
    for address, script in member_scripts(plan).items():
        assert "--user 10001:10001" in script, address
        # A member checks the address a peer connects from (its primary interface's) against
        # the peer's certificate: the certificate names it besides the member's own address.
        assert "PRIMARY=$(imds local-ipv4)" in script
        assert "subjectAltName=IP:" in script and ",IP:%s," in script and '"$PRIMARY"' in script
        assert 'install -d -m 0700 -o 10001 -g 10001 "$DATA/etcd" "$DATA/tls"' in script
        assert 'install -m 0600 -o 10001 -g 10001 "$TLS/member.key"' in script
        # The member comes back after a reboot: docker enabled, the volume in fstab, docker
        # waiting for the mount, the container restarting.
        assert "systemctl enable --now docker" in script
        assert ">> /etc/fstab" in script and "RequiresMountsFor=" in script
        assert "--restart=always" in script


def test_member_script_renders_to_valid_bash(plan: Plan, tmp_path: Path) -> None:
    for address, script in member_scripts(plan).items():
        assert len(script.encode()) < 16384, "EC2 refuses user data above 16 KB"
        path = tmp_path / "member.sh"
        path.write_text(script)
        result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, (address, result.stderr)


# 4: the tasks' file system ---------------------------------------------------------------------


def test_tasks_have_no_proxy_and_write_only_to_their_scratch_volume(plan: Plan) -> None:
    definitions = plan.container_definitions()
    assert set(definitions) == {f"prod-tabletstore-{r}" for r in ("master", "worker", "cli")}
    for family, containers in definitions.items():
        names = {c["name"] for c in containers}
        assert "etcd-proxy" not in names, family
        for container in containers:
            assert container["readonlyRootFilesystem"] is True, (family, container["name"])
        app = next(c for c in containers if c["essential"])
        assert app["user"] == "10001:10001"
        mounts = {m["containerPath"] for m in app["mountPoints"]}
        env = {e["name"]: e["value"] for e in app["environment"]}
        health = env["TABLETSTORE_HEALTH_FILE"]
        assert any(health.startswith(f"{m}/") for m in mounts), (health, mounts)
        # Fargate makes a bind-mount volume root-owned 0755: the init container, as root,
        # opens it to the image's user before the process starts.
        (init,) = [c for c in containers if not c["essential"]]
        assert {"containerName": init["name"], "condition": "SUCCESS"} in app["dependsOn"]
        assert init["user"] == "0"
        script = init["command"][0]
        for mount in mounts:
            assert f"chmod 1777 {mount}" in script
        # The etcd URL's certificate files are what the init container writes.
        query = env["TABLETSTORE_URL"].partition("?")[2]
        files = dict(p.split("=", 1) for p in query.split("&"))
        assert set(files) == {"ca", "cert", "key"}
        for path in files.values():
            assert f"> {path}" in script and any(path.startswith(f"{m}/") for m in mounts)
        # The RPC ports serve mutual TLS: the process's certificate files are what the init
        # container writes from its role's secret, and nothing serves without TLS.
        assert "--insecure" not in app["command"], family
        role = {"master": "master", "worker": "worker", "cli": "client"}[app["name"]]
        for var, field in (("TLS_CA", "ca"), ("TLS_CERT", "cert"), ("TLS_KEY", "key")):
            path = env[f"TABLETSTORE_{var}"]
            assert f"> {path}" in script and any(path.startswith(f"{m}/") for m in mounts)
            (secret,) = [s for s in init["secrets"] if s["name"] == f"{var}_PEM"]
            assert secret["valueFrom"].endswith(f"secret:tls-{role}:{field}::"), secret


# 5: HeadBucket ------------------------------------------------------------------------------


def test_the_task_role_may_head_the_bucket(plan: Plan) -> None:
    (policy,) = [v for a, v in plan.of_type("aws_iam_policy").items() if a.endswith(".read_write")]
    listing = [s for s in statements(policy["policy"]) if allows(s, "s3:ListBucket")]
    # HeadBucket is authorized as s3:ListBucket without s3:prefix: a statement with a prefix
    # condition never matches it.
    assert any("Condition" not in s for s in listing), listing


# 6-7: the functions and the master's executors -------------------------------------------------


def functions(plan: Plan) -> dict[str, dict[str, Any]]:
    return {a.split('"')[1]: v for a, v in plan.of_type("aws_lambda_function").items()}


def test_function_commands_are_what_the_entrypoint_runs(plan: Plan, tmp_path: Path) -> None:
    """Lambda runs ENTRYPOINT + image_config's command: the entrypoint's `function` role must
    accept it and hand the handler to the runtime interface client."""
    echo = tmp_path / "python"
    echo.write_text('#!/bin/sh\necho "$@"\n')
    echo.chmod(0o755)
    for kind, function in functions(plan).items():
        (config,) = function["image_config"]
        command = config["command"]
        assert command == ["function", HANDLERS[kind]]
        result = subprocess.run(
            ["sh", str(ENTRYPOINT), *command],
            env={"PATH": os.environ["PATH"], "TABLETSTORE_PYTHON": str(echo)},
            capture_output=True,
            text=True,
        )
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["-m", "awslambdaric", HANDLERS[kind]]


def parse_cli(command: list[str]) -> click.Context:
    """Parse ``command`` exactly as the image's CLI would (unknown flags and bad values fail)."""
    verb, *args = command
    sub = main.commands[verb]  # type: ignore[attr-defined]
    return sub.make_context(verb, list(args), resilient_parsing=False)  # type: ignore[no-any-return]


def test_master_runs_the_recovery_functions(plan: Plan) -> None:
    master = next(
        c for c in plan.container_definitions()["prod-tabletstore-master"] if c["essential"]
    )
    params = parse_cli(master["command"]).params
    names = {kind: f["function_name"] for kind, f in functions(plan).items()}
    assert params["sort_executor"] == f"lambda:{names['log_sort']}"
    assert params["compaction_executor"] == f"lambda:{names['compaction']}"


def test_gc_runs_on_a_schedule_with_the_clusters_url(plan: Plan) -> None:
    (rule,) = plan.of_type("aws_cloudwatch_event_rule").values()
    assert rule["schedule_expression"].startswith("rate(")
    (target,) = plan.of_type("aws_cloudwatch_event_target").values()
    app = next(c for c in plan.container_definitions()["prod-tabletstore-worker"] if c["essential"])
    url = next(e["value"] for e in app["environment"] if e["name"] == "TABLETSTORE_URL")
    assert json.loads(target["input"]) == {"cluster_url": url}
    (permission,) = plan.of_type("aws_lambda_permission").values()
    assert permission["principal"] == "events.amazonaws.com"
    assert permission["function_name"] == functions(plan)["gc"]["function_name"]


def test_functions_reach_etcd_and_the_workers(plan: Plan) -> None:
    url = json.loads(next(iter(plan.of_type("aws_cloudwatch_event_target").values()))["input"])
    hosts = url["cluster_url"].removeprefix("etcd://").partition("/")[0].split(",")
    assert len(hosts) == 3 and not any(h.startswith("127.") for h in hosts), hosts
    for function in functions(plan).values():
        (vpc,) = function["vpc_config"]
        assert vpc["subnet_ids"] and vpc["security_group_ids"]
    rules = plan.of_type("aws_vpc_security_group_ingress_rule")
    described = {r["description"] for r in rules.values()}
    assert "etcd clients (TLS)" in described
    assert any("compaction" in d for d in described)
    addresses = {a.split('"')[1] for a in rules if '"' in a}
    assert {"etcd_from_functions", "worker_from_functions"} <= addresses


def function_policies(plan: Plan) -> dict[str, list[dict[str, Any]]]:
    return {
        a.split('"')[1]: statements(v["policy"])
        for a, v in plan.of_type("aws_iam_role_policy").items()
        if a.startswith("module.functions.")
    }


def object_prefixes(policy: list[dict[str, Any]], action: str) -> set[str]:
    found: set[str] = set()
    for statement in policy:
        if allows(statement, action):
            for resource in as_list(statement["Resource"]):
                match = re.search(r":::[^/]+/prod/([a-z-]*)/?\*$", resource)
                if match:
                    found.add(match.group(1))
    return found


def test_each_function_role_reaches_what_its_handler_touches(plan: Plan) -> None:
    policies = function_policies(plan)
    assert object_prefixes(policies["log_sort"], "s3:GetObject") == {"logs", "recovery"}
    assert object_prefixes(policies["log_sort"], "s3:PutObject") == {"recovery"}
    assert object_prefixes(policies["compaction"], "s3:GetObject") == {"tables"}
    assert object_prefixes(policies["gc"], "s3:GetObject") == {"snapshots"}
    assert object_prefixes(policies["gc"], "s3:DeleteObject") == {"tables", "logs", "recovery"}
    # GC lists the whole prefix (master/gc.py lists "" under the store's root).
    (listing,) = [s for s in policies["gc"] if allows(s, "s3:ListBucket")]
    assert as_list(listing["Condition"]["StringLike"]["s3:prefix"]) == ["prod/*"]
    for kind in ("compaction", "gc"):
        assert any(allows(s, "secretsmanager:GetSecretValue") for s in policies[kind]), kind
    assert not any(allows(s, "secretsmanager:GetSecretValue") for s in policies["log_sort"])


# The contract: environment variables ---------------------------------------------------------


def click_envvars(command: click.Command) -> set[str]:
    found = {
        name for param in command.params for name in as_list(getattr(param, "envvar", None) or [])
    }
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            found |= click_envvars(sub)
    return found


def entrypoint_envvars() -> set[str]:
    """The variables docker/entrypoint.sh reads itself (``${NAME`` / ``$NAME``)."""
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", ENTRYPOINT.read_text()))


def script_envvars(script: str) -> set[str]:
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", script))


#: What the AWS SDK (boto3, in the same process) reads: the master's Lambda client's region.
AWS_SDK_ENVVARS = {"AWS_DEFAULT_REGION"}


def test_every_environment_variable_terraform_sets_is_read_by_what_it_reaches(
    plan: Plan,
) -> None:
    cli = click_envvars(main) | entrypoint_envvars() | AWS_SDK_ENVVARS
    for family, containers in plan.container_definitions().items():
        for container in containers:
            names = {e["name"] for e in container.get("environment", [])}
            names |= {s["name"] for s in container.get("secrets", [])}
            if container.get("entryPoint") == ["/bin/sh", "-c"]:
                readers = script_envvars(container["command"][0])
            else:
                readers = cli
            unread = names - readers
            assert not unread, f"{family}/{container['name']} sets {unread}, read by nothing"
    for kind, function in functions(plan).items():
        names = {name for env in function.get("environment", []) for name in env["variables"]}
        assert names <= {ENV_SECRET, ENV_TLS_SECRET, ENV_CA, ENV_CERT, ENV_KEY}, (kind, names)
        if ENV_SECRET in names:  # it reaches the workers too: with the function's certificate
            (env,) = function["environment"]
            assert env["variables"][ENV_TLS_SECRET].endswith("secret:tls-function")
            assert {ENV_CA, ENV_CERT, ENV_KEY} <= names


# The contract: commands and flags --------------------------------------------------------------


def test_every_task_command_is_a_valid_cli_invocation(plan: Plan) -> None:
    for family, containers in plan.container_definitions().items():
        for container in containers:
            if container.get("entryPoint"):
                continue  # the init container's shell script (checked above)
            ctx = parse_cli(container["command"])
            if "port" in ctx.params:
                assert "--host" not in container["command"], "the entrypoint supplies --host"
                port = ctx.params["port"]
                assert str(port) in container["healthCheck"]["command"], family
                assert {"containerPort": port, "protocol": "tcp"} in container["portMappings"]


def etcd_run(script: str) -> list[str]:
    """The etcd command line of a member script's `docker run ... IMAGE etcd ...`."""
    joined = script.replace("\\\n", " ")
    line = next(x for x in joined.splitlines() if x.startswith("docker run -d"))
    words = shlex.split(line)
    return words[words.index("etcd", words.index("--name") + 2) :]


def help_flags(*command: str) -> set[str]:
    result = subprocess.run(
        list(command), capture_output=True, text=True, env={**os.environ, "ETCDCTL_API": "3"}
    )
    return set(re.findall(r"(--[a-z][a-z0-9-]+)", result.stdout + result.stderr))


def test_every_etcd_and_etcdctl_flag_a_member_passes_is_accepted(plan: Plan) -> None:
    etcd_flags = help_flags("etcd", "--help")
    etcdctl_flags = help_flags("etcdctl", "--help") | help_flags(
        "etcdctl", "snapshot", "save", "--help"
    )
    assert "--quota-backend-bytes" in etcd_flags and "--endpoints" in etcdctl_flags
    for address, script in member_scripts(plan).items():
        command = etcd_run(script)
        assert command[0] == "etcd"
        passed = {w.split("=", 1)[0] for w in command if w.startswith("--")}
        assert passed <= etcd_flags, (address, passed - etcd_flags)
        assert {
            "--auto-compaction-mode",
            "--auto-compaction-retention",
            "--quota-backend-bytes",
            "--client-cert-auth",
        } <= passed
        (line,) = [x for x in script.splitlines() if x.startswith("ETCDCTL=")]
        ctl = line.removeprefix("ETCDCTL=").split()
        ctl = ctl[ctl.index("etcdctl") :]
        assert {w.split("=", 1)[0] for w in ctl if w.startswith("--")} <= etcdctl_flags


# Operations --------------------------------------------------------------------------------


def test_deleted_objects_stay_recoverable_for_a_while(plan: Plan) -> None:
    versioning = [
        v["versioning_configuration"][0]["status"]
        for a, v in plan.of_type("aws_s3_bucket_versioning").items()
        if a.startswith("module.storage.")
    ]
    assert versioning == ["Enabled"]
    (rules,) = [
        v["rule"]
        for a, v in plan.of_type("aws_s3_bucket_lifecycle_configuration").items()
        if a.endswith(".objects")
    ]
    noncurrent = [r for r in rules if r.get("noncurrent_version_expiration")]
    assert noncurrent and all(
        r["noncurrent_version_expiration"][0]["noncurrent_days"] >= 1 for r in noncurrent
    )


def test_alarms_watch_the_dashboards_signals_and_etcds_quota(plan: Plan) -> None:
    alarms = plan.of_type("aws_cloudwatch_metric_alarm")
    metrics = {(a["namespace"], a["metric_name"]) for a in alarms.values()}
    assert {
        ("ECS/ContainerInsights", "RunningTaskCount"),
        ("AWS/S3", "5xxErrors"),
        ("AWS/Lambda", "Errors"),
        ("tabletstore/etcd", "DbSizeBytes"),
    } <= metrics
    quota = int(
        re.search(r"--quota-backend-bytes (\d+)", next(iter(member_scripts(plan).values())))[1]
    )  # type: ignore[index]
    sizes = [
        a
        for a in alarms.values()
        if a["metric_name"] == "DbSizeBytes" and a["comparison_operator"] == "GreaterThanThreshold"
    ]
    assert len(sizes) == 3 and all(0 < a["threshold"] < quota for a in sizes)
    (topic,) = plan.of_type("aws_sns_topic").values()
    # The topic is encrypted with the key: CloudWatch must be granted it, or no alarm arrives.
    assert any(
        s.get("Principal", {}).get("Service") == "cloudwatch.amazonaws.com"
        and allows(s, "kms:GenerateDataKey")
        for s in key_policy(plan)
    )
    for address in alarms:  # every alarm notifies the topic (its ARN is known after apply)
        assert plan.unknown(address).get("alarm_actions"), address
    assert topic["name"] == "prod-tabletstore-alarms"


@pytest.fixture(scope="module")
def environments() -> Iterator[list[Path]]:
    yield sorted(p for p in (TF / "environments").iterdir() if p.is_dir())


def test_environments_keep_their_state_in_s3_with_a_lock(environments: list[Path]) -> None:
    for env in environments:
        text = (env / "main.tf").read_text()
        block = re.search(r'backend "s3" \{(.*?)\n  \}', text, re.S)
        assert block, f"{env.name} keeps its state locally"
        assert f'key     = "tabletstore/{env.name}/terraform.tfstate"' in block[1]
        assert "encrypt = true" in block[1]
    bootstrap = (TF / "bootstrap" / "main.tf").read_text()
    assert 'resource "aws_dynamodb_table" "locks"' in bootstrap
    assert 'hash_key     = "LockID"' in bootstrap and "dynamodb_table" in bootstrap


def test_the_deployment_guide_lists_the_contract(plan: Plan) -> None:
    """docs/operations/cloud-deployment.md's table names every variable and flag of the plan."""
    text = (ROOT / "docs" / "operations" / "cloud-deployment.md").read_text()
    table = text[text.index("## The contract between Terraform and the code") :]
    for family, containers in plan.container_definitions().items():
        for container in containers:
            for name in [e["name"] for e in container.get("environment", [])] + [
                s["name"] for s in container.get("secrets", [])
            ]:
                assert f"`{name}`" in table, (family, name)
            if not container.get("entryPoint"):
                for word in container["command"]:
                    assert not word.startswith("--") or word in table, (family, word)
    for function in functions(plan).values():
        for env in function.get("environment", []):
            for name in env["variables"]:
                assert f"`{name}`" in table, name
    for script in member_scripts(plan).values():
        for flag in {w.split("=", 1)[0] for w in etcd_run(script) if w.startswith("--")}:
            assert flag in table, flag


def test_services_roll_with_a_circuit_breaker_and_can_replace_all_at_once(plan: Plan) -> None:
    """A release rolls (the masters one of two at a time, the workers never below their
    count) and rolls back if its tasks never get healthy; `replace_all_at_once` (a wire
    protocol change) makes both stop every old task first."""
    services = {v["name"]: v for v in plan.of_type("aws_ecs_service").values()}
    master, worker = services["prod-tabletstore-master"], services["prod-tabletstore-worker"]
    assert (master["deployment_minimum_healthy_percent"], master["deployment_maximum_percent"]) == (
        50,
        200,
    )
    assert (worker["deployment_minimum_healthy_percent"], worker["deployment_maximum_percent"]) == (
        100,
        200,
    )
    for service in (master, worker):
        assert service["deployment_circuit_breaker"] == [{"enable": True, "rollback": True}]
    text = (TF / "modules" / "cluster" / "main.tf").read_text()
    assert text.count("var.replace_all_at_once ? 0 :") == 2
    assert text.count("var.replace_all_at_once ? 100 :") == 2
