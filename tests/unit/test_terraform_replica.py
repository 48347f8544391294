"""The replica environment (infra/terraform/environments/replica): a second cluster in another
region that follows tables of prod through a replicator service, planned against moto as the
prod environment is (tests/unit/terraform_plan.py; the bucket, network and functions applied
first). Checked on the plan: it is a whole cluster of its own in its region (its own bucket,
etcd, workers); the replicator runs ``tabletstore replicate --source ...`` as the CLI parses
it, with the source's etcd certificate written where the source URL names it; and its task
role is least privilege: it may list the source's bucket, read the objects under the source's
prefix and decrypt with the source's key, and nothing else (no write anywhere, nothing of the
replica's own bucket: it writes through the replica's workers). Bad source input fails the
plan with the variable's own message."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest

from tests.unit.terraform_plan import Plan, plan_environment
from tests.unit.test_terraform import GOOD_VARS, terraform
from tests.unit.test_terraform_cloud import allows, parse_cli, script_envvars, statements

pytestmark = [pytest.mark.slow, pytest.mark.no_cluster, pytest.mark.timeout(1500)]

REGION = "us-west-2"
SOURCE_BUCKET = "arn:aws:s3:::tabletstore-prod-example"
SOURCE_KEY = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
SOURCE_SECRET = "arn:aws:secretsmanager:us-west-2:123456789012:secret:prod-etcd-client"
SOURCE_URL = (
    "etcd://10.40.0.10:2379,10.40.1.10:2379,10.40.2.10:2379/tabletstore"
    "?ca=/tmp/source-etcd-tls/ca.pem&cert=/tmp/source-etcd-tls/client.pem"
    "&key=/tmp/source-etcd-tls/client.key"
)
REPLICA_VARS = {
    "region": REGION,
    "availability_zones": f'["{REGION}a","{REGION}b","{REGION}c"]',
    "source_cluster_url": SOURCE_URL,
    "source_etcd_client_secret_arn": SOURCE_SECRET,
    "source_bucket_arn": SOURCE_BUCKET,
    "source_prefix": "prod/",
    "source_kms_key_arn": SOURCE_KEY,
    "replicated_tables": '["webtable","users"]',
}


@pytest.fixture(scope="module")
def planned(s3_server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Plan, Path]:
    work = tmp_path_factory.mktemp("plan-replica")
    return plan_environment("replica", s3_server, work, **REPLICA_VARS), work


@pytest.fixture(scope="module")
def plan(planned: tuple[Plan, Path]) -> Plan:
    return planned[0]


def replicator(plan: Plan) -> list[dict[str, Any]]:
    return plan.container_definitions()["replica-tabletstore-replicator"]


def test_the_replica_is_a_cluster_of_its_own_in_its_region(plan: Plan) -> None:
    master = next(
        c
        for c in plan.container_definitions()["replica-tabletstore-master"]
        if c["name"] == "master"
    )
    store = master["command"][master["command"].index("--store") + 1]
    bucket = store.removeprefix("s3://").split("/")[0]
    assert store == f"s3://{bucket}/replica?region={REGION}"
    assert bucket in {v["bucket"] for v in plan.of_type("aws_s3_bucket").values()}
    assert f"arn:aws:s3:::{bucket}" != SOURCE_BUCKET
    assert len(plan.of_type("aws_launch_template")) == 3  # its own etcd members
    services = {v["name"] for v in plan.of_type("aws_ecs_service").values()}
    assert services == {
        "replica-tabletstore-master",
        "replica-tabletstore-worker",
        "replica-tabletstore-replicator",
    }


def test_the_replicator_runs_replicate_from_the_source(plan: Plan) -> None:
    (main,) = [c for c in replicator(plan) if c["name"] == "replicator"]
    assert main["command"] == ["replicate", "--source", SOURCE_URL, "webtable", "users"]
    ctx = parse_cli(main["command"])
    assert ctx.params["source"] == SOURCE_URL and ctx.params["tables"] == ("webtable", "users")
    assert "portMappings" not in main  # a client: it serves nothing
    # Its init container writes the source's etcd certificate where the source URL names it.
    (scratch,) = [c for c in replicator(plan) if c["name"] == "scratch"]
    script = scratch["command"][0]
    for name in ("ca.pem", "client.pem", "client.key"):
        assert f"/tmp/source-etcd-tls/{name}" in script and f"/tmp/source-etcd-tls/{name}" in (
            SOURCE_URL
        )
    secrets = {s["name"]: s["valueFrom"] for s in scratch["secrets"]}
    assert {k for k in secrets if k.startswith("SOURCE_")} <= script_envvars(script)
    assert secrets["SOURCE_ETCD_CLIENT_CERT"] == f"{SOURCE_SECRET}:cert::"
    (service,) = [
        v for v in plan.of_type("aws_ecs_service").values() if v["name"].endswith("replicator")
    ]
    # One at a time: two replicators would write the same progress records.
    assert service["desired_count"] == 1
    assert service["deployment_maximum_percent"] == 100
    assert service["deployment_minimum_healthy_percent"] == 0


def test_the_replicator_may_only_read_the_source_bucket(plan: Plan) -> None:
    (policy,) = [v for a, v in plan.of_type("aws_iam_role_policy").items() if "replicator" in a]
    found = statements(json.loads(policy["policy"]))
    granted = {(a, r) for s in found for a in _list(s["Action"]) for r in _list(s["Resource"])}
    assert granted == {
        ("s3:ListBucket", SOURCE_BUCKET),
        ("s3:GetObject", f"{SOURCE_BUCKET}/prod/*"),
        ("kms:Decrypt", SOURCE_KEY),
    }
    for action in ("s3:PutObject", "s3:DeleteObject", "kms:GenerateDataKey", "lambda:Invoke*"):
        assert not any(allows(s, action) for s in found), action
    # No managed policy (the cluster's bucket read-write one) on the replicator's role.
    attached = plan.of_type("aws_iam_role_policy_attachment").values()
    assert not [a for a in attached if fnmatch.fnmatch(str(a.get("role")), "*replicator*")]
    roles = {v["name"] for v in plan.of_type("aws_iam_role").values()}
    assert "replica-tabletstore-replicator" in roles  # its own, not the cluster's task role


def test_a_source_url_without_its_certificate_directory_is_refused(
    planned: tuple[Plan, Path],
) -> None:
    _, work = planned
    directory = work / "terraform" / "environments" / "replica"
    values = {
        **GOOD_VARS,
        **REPLICA_VARS,
        "bucket_name": "tabletstore-replica-bad",
        "source_cluster_url": "etcd://10.40.0.10:2379/tabletstore?ca=/tmp/etcd-tls/ca.pem",
    }
    result = terraform(
        directory,
        "plan",
        "-input=false",
        "-refresh=false",
        *[f"-var={k}={v}" for k, v in values.items()],
        data_dir=work / "data",
        check=False,
        timeout=300,
    )
    assert result.returncode != 0
    assert "/tmp/source-etcd-tls/" in result.stderr, result.stderr[-2000:]


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]
