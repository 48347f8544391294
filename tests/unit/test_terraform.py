"""The Terraform cloud tier (infra/terraform), checked with the real tools, offline.

Terraform 1.11 is part of the machine image, with the hashicorp/aws provider in a local plugin
directory (located at run time: :func:`plugin_dir`), so ``init -plugin-dir`` needs no network.
checkov runs from its own virtualenv (scripts/test.sh installs it into .tools/checkov: it pins
boto3/botocore versions that clash with aioboto3's). What is checked:

* ``terraform fmt -check -recursive``;
* ``init`` + ``validate`` of every environment (validating a root validates every module it
  calls, and every module is called by both environments), the moto test root and the bootstrap;
* checkov: zero failed checks, and every skip carries its reason where it stands;
* bad input fails at plan time with the variable's own message (missing variables, an unknown
  region, a malformed bucket name, a non-ECR image), and a bucket name already taken fails the
  apply naming the bucket;
* ``apply`` then ``destroy`` of the bucket, network and functions modules against moto's server
  (S3, KMS, IAM, Lambda, SQS, EC2, CloudWatch Logs), verified through boto3 in between.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

ROOT = Path(__file__).resolve().parents[2]
TF = ROOT / "infra" / "terraform"
CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
MODULES = sorted(p for p in (TF / "modules").iterdir() if p.is_dir())
ENVIRONMENTS = sorted(p for p in (TF / "environments").iterdir() if p.is_dir())
MOTO_ROOT = TF / "tests" / "moto"
BOOTSTRAP = TF / "bootstrap"
#: Where machine images put provider plugins; searched in order, then the file system below.
PLUGIN_DIRS = ("/opt/tf-plugins", "~/.terraform.d/plugins", "/usr/share/terraform/plugins")
HANDLERS = {
    "log_sort": "functions.log_sort.handler",
    "compaction": "functions.compaction.handler",
    "gc": "functions.gc.handler",
}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: The Go garbage collector's target for terraform and the provider it starts (inherited). Most
#: of a command's CPU is the AWS provider starting (several times a command: its schema, then
#: each walk), which allocates its whole schema; collecting at 4x the live heap instead of 2x
#: costs about 60 MB more per process and about a sixth less CPU.
GOGC = "400"


def plugin_dir() -> Path:
    """The directory holding registry.terraform.io/hashicorp/aws/<version>/<os_arch>/..."""
    candidates = [Path(os.environ["TF_PLUGIN_DIR"])] if "TF_PLUGIN_DIR" in os.environ else []
    candidates += [Path(p).expanduser() for p in PLUGIN_DIRS]
    for candidate in candidates:
        if any(candidate.glob("registry.terraform.io/hashicorp/aws/*/*/terraform-provider-aws*")):
            return candidate
    for base in ("/opt", "/usr/local", "/usr/share", str(Path.home())):
        for found in Path(base).rglob("terraform-provider-aws*"):
            # .../<plugin dir>/registry.terraform.io/hashicorp/aws/<version>/<os_arch>/binary
            return found.parents[5]
    pytest.fail("no terraform-provider-aws plugin directory on this machine (set TF_PLUGIN_DIR)")


def terraform(
    directory: Path, *args: str, data_dir: Path, timeout: float = 300, check: bool = True
) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("terraform")
    if binary is None:
        pytest.fail("terraform is not on PATH: it is part of the machine image (1.11)")
    env = {
        **os.environ,
        "TF_DATA_DIR": str(data_dir),  # .terraform/ out of the source tree
        "TF_IN_AUTOMATION": "1",
        "TF_INPUT": "0",
        "CHECKPOINT_DISABLE": "1",
        # The image points TF_CLI_CONFIG_FILE at a file that may not exist (a warning per call).
        "TF_CLI_CONFIG_FILE": os.devnull,
        "GOGC": GOGC,
    }
    result = subprocess.run(
        [binary, *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    result.stdout, result.stderr = _ANSI.sub("", result.stdout), _ANSI.sub("", result.stderr)
    if check and result.returncode != 0:
        pytest.fail(f"terraform {' '.join(args)} in {directory} failed:\n{result.stderr}")
    return result


def init(directory: Path, data_dir: Path) -> None:
    terraform(
        directory,
        "init",
        "-backend=false",
        f"-plugin-dir={plugin_dir()}",
        data_dir=data_dir,
    )


def test_terraform_is_formatted(tmp_path: Path) -> None:
    result = terraform(TF, "fmt", "-check", "-recursive", data_dir=tmp_path, check=False)
    assert result.returncode == 0, (
        f"run 'terraform fmt -recursive infra/terraform':\n{result.stdout}"
    )


@pytest.mark.parametrize(
    "directory",
    # Not the modules one by one: ``validate`` of a root validates the whole module tree it
    # calls (their warnings included), and test_every_module_is_used_by_both_environments
    # holds every module in it. A validate costs seconds of CPU (the provider starts twice).
    [*ENVIRONMENTS, MOTO_ROOT, BOOTSTRAP],
    ids=lambda p: str(p.relative_to(TF)),
)
def test_init_and_validate(directory: Path, tmp_path: Path) -> None:
    init(directory, tmp_path)
    result = terraform(directory, "validate", "-json", data_dir=tmp_path, check=False)
    report = json.loads(result.stdout)
    assert report["valid"], json.dumps(report["diagnostics"], indent=2)
    assert report["warning_count"] == 0, json.dumps(report["diagnostics"], indent=2)


def test_every_module_is_used_by_both_environments() -> None:
    for env in ENVIRONMENTS:
        text = (env / "main.tf").read_text()
        for module in MODULES:
            assert f'"../../modules/{module.name}"' in text, (
                f"{env.name} does not use {module.name}"
            )


def test_checkov_finds_no_failed_check_and_every_skip_is_justified() -> None:
    if not CHECKOV.exists():
        pytest.fail(f"checkov is not installed at {CHECKOV}: run scripts/test.sh")
    result = subprocess.run(
        [str(CHECKOV), "-d", str(TF), "--framework", "terraform", "--skip-download", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    reports = json.loads(result.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    failed = [c for r in reports for c in r["results"].get("failed_checks", [])]
    assert not failed, "\n".join(
        f"{c['check_id']} {c['resource']} {c['file_path']}:{c['file_line_range']}" for c in failed
    )
    skipped = [c for r in reports for c in r["results"].get("skipped_checks", [])]
    assert skipped, "the report lists no skipped checks: the skip comments were not read"
    for check in skipped:
        reason = check.get("check_result", {}).get("suppress_comment", "")
        assert len(reason.split()) >= 5, f"{check['check_id']} on {check['resource']}: {reason!r}"


# Bad input ---------------------------------------------------------------------------------

GOOD_VARS = {
    "region": "us-east-1",
    "bucket_name": "tabletstore-dev-example",
    "availability_zones": '["us-east-1a","us-east-1b","us-east-1c"]',
    "image_uri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/tabletstore:1",
    "etcd_ami_id": "ami-0123456789abcdef0",
    "etcd_ca_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:ca",
    "etcd_client_secret_arn": "arn:aws:secretsmanager:us-east-1:123456789012:secret:client",
    "tls_secret_arns": "{"
    + ",".join(
        f'"{r}":"arn:aws:secretsmanager:us-east-1:123456789012:secret:tls-{r}"'
        for r in ("master", "worker", "client", "function")
    )
    + "}",
}


@pytest.fixture(scope="module")
def dev_env(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the dev environment with its state in a local file (the S3 backend needs
    its bucket): the directory to plan in, initialized, with .terraform under data/."""
    work = tmp_path_factory.mktemp("tf-dev")
    shutil.copytree(TF, work / "terraform", ignore=shutil.ignore_patterns(".terraform*"))
    directory = work / "terraform" / "environments" / "dev"
    (directory / "backend_override.tf").write_text(
        f'terraform {{\n  backend "local" {{\n    path = "{work / "terraform.tfstate"}"\n  }}\n}}\n'
    )
    terraform(directory, "init", f"-plugin-dir={plugin_dir()}", data_dir=work / "data")
    return directory


def plan(directory: Path, **overrides: str | None) -> str:
    values = {**GOOD_VARS, **overrides}
    args = [f"-var={k}={v}" for k, v in values.items() if v is not None]
    # No credentials on purpose: every error below comes before the provider needs them.
    # State (and its lock) is the copy's own: parallel workers (pytest-xdist) never share one.
    result = terraform(
        directory,
        "plan",
        "-input=false",
        "-refresh=false",
        *args,
        data_dir=directory.parents[2] / "data",
        check=False,
        timeout=120,
    )
    assert result.returncode != 0
    return " ".join(result.stderr.replace("│", " ").split())


#: Each bad input, by test id: the variables it sets (None: not given) and the message.
BAD_INPUT: dict[str, tuple[dict[str, str | None], str]] = {
    "no-region": ({"region": None}, 'The root module input variable "region" is not set'),
    "no-bucket": ({"bucket_name": None}, 'The root module input variable "bucket_name" is not set'),
    "unknown-region": ({"region": "us-middle-1"}, "region must be an AWS region name such as us-east-1"),
    "bad-region": ({"region": "mars-1"}, "region must be an AWS region name"),
    "bucket-case": ({"bucket_name": "My_Bucket"}, "bucket_name must be 3-51 characters"),
    "bucket-ip": ({"bucket_name": "192.168.1.1"}, "not look like an IP address"),
    "image": ({"image_uri": "tabletstore:latest"}, "image_uri must be an ECR image"),
    "zones": ({"availability_zones": '["us-east-1a"]'}, "availability_zones must list exactly three"),
}  # fmt: skip


def bad_input_plans(cases: dict[str, dict[str, str | None]]) -> list[list[str]]:
    """The cases planned together, as few plans as can show each case's own message: a plan
    sets each variable once, so cases of different variables share one (Terraform reports every
    failed variable validation of a plan), but a missing variable stops the plan before any
    validation is evaluated, so the missing ones are planned apart from the bad values."""
    plans: list[list[str]] = []
    for missing in (True, False):
        chosen: list[tuple[list[str], set[str]]] = []
        for case, overrides in cases.items():
            if all(v is None for v in overrides.values()) is not missing:
                continue
            names = set(overrides)
            for ids, taken in chosen:
                if not names & taken:
                    ids.append(case)
                    taken |= names
                    break
            else:
                chosen.append(([case], names))
        plans += [ids for ids, _ in chosen]
    return plans


def test_bad_inputs_share_plans_by_variable_and_missing_ones_apart() -> None:
    cases = {case: overrides for case, (overrides, _) in BAD_INPUT.items()}
    assert bad_input_plans(cases) == [
        ["no-region", "no-bucket"],
        ["unknown-region", "bucket-case", "image", "zones"],
        ["bad-region", "bucket-ip"],
    ]


@pytest.fixture(scope="module")
def bad_input_errors(dev_env: Path) -> dict[str, str]:
    """Each case of :data:`BAD_INPUT`: the errors of the plan it was in (a plan costs seconds
    of CPU: the provider starts to load its schema)."""
    errors: dict[str, str] = {}
    for ids in bad_input_plans({case: BAD_INPUT[case][0] for case in BAD_INPUT}):
        overrides = {k: v for case in ids for k, v in BAD_INPUT[case][0].items()}
        message = plan(dev_env, **overrides)
        errors.update(dict.fromkeys(ids, message))
    return errors


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_fails_at_plan_time_with_a_clear_message(
    bad_input_errors: dict[str, str], case: str
) -> None:
    assert BAD_INPUT[case][1] in bad_input_errors[case]


# Apply and destroy against moto ------------------------------------------------------------


@pytest.fixture
def moto(s3_server: str) -> Iterator[tuple[str, dict[str, object]]]:
    """moto's server (every service it implements answers on one endpoint) and boto3 kwargs."""
    kwargs: dict[str, object] = {
        "endpoint_url": s3_server,
        "region_name": "us-east-1",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
    }
    yield s3_server, kwargs


def moto_vars(endpoint: str, bucket: str) -> list[str]:
    return [f"-var=endpoint={endpoint}", f"-var=bucket_name={bucket}"]


@pytest.mark.slow
@pytest.mark.no_cluster
def test_apply_then_destroy_against_moto(
    moto: tuple[str, dict[str, object]], tmp_path: Path
) -> None:
    endpoint, kwargs = moto
    bucket = f"tfcheck-{uuid.uuid4().hex[:12]}"
    init(MOTO_ROOT, tmp_path)
    state = ["-state", str(tmp_path / "state" / "terraform.tfstate")]
    variables = moto_vars(endpoint, bucket)
    try:
        terraform(
            MOTO_ROOT, "apply", "-auto-approve", *state, *variables, data_dir=tmp_path, timeout=480
        )
        outputs = json.loads(
            terraform(MOTO_ROOT, "output", "-json", *state, data_dir=tmp_path).stdout
        )
        assert outputs["store_url"]["value"] == f"s3://{bucket}/db?region=us-east-1"
        _check_bucket(boto3.client("s3", **kwargs), bucket)  # type: ignore[call-overload]
        _check_functions(
            boto3.client("lambda", **kwargs),  # type: ignore[call-overload]
            boto3.client("iam", **kwargs),  # type: ignore[call-overload]
            outputs["functions"]["value"],
            bucket,
        )
    finally:
        # Without refreshing: the state is the apply's own, moments old (a refresh reads every
        # resource back from moto first, for nothing).
        terraform(
            MOTO_ROOT,
            "destroy",
            "-auto-approve",
            "-refresh=false",
            *state,
            *variables,
            data_dir=tmp_path,
            timeout=480,
        )
    names = {
        f["FunctionName"] for f in boto3.client("lambda", **kwargs).list_functions()["Functions"]
    }  # type: ignore[call-overload]
    assert not names & set(outputs["functions"]["value"].values())
    buckets = {b["Name"] for b in boto3.client("s3", **kwargs).list_buckets()["Buckets"]}  # type: ignore[call-overload]
    assert bucket not in buckets and f"{bucket}-access-logs" not in buckets


def _check_bucket(s3: object, bucket: str) -> None:
    encryption = s3.get_bucket_encryption(Bucket=bucket)  # type: ignore[attr-defined]
    rule = encryption["ServerSideEncryptionConfiguration"]["Rules"][0]
    assert rule["ApplyServerSideEncryptionByDefault"]["SSEAlgorithm"] == "aws:kms"
    policy = json.loads(s3.get_bucket_policy(Bucket=bucket)["Policy"])  # type: ignore[attr-defined]
    deny = [s for s in policy["Statement"] if s["Effect"] == "Deny"]
    assert deny and deny[0]["Condition"]["Bool"]["aws:SecureTransport"] == "false"
    logging = s3.get_bucket_logging(Bucket=bucket)["LoggingEnabled"]  # type: ignore[attr-defined]
    assert logging["TargetBucket"] == f"{bucket}-access-logs"
    block = s3.get_public_access_block(Bucket=bucket)["PublicAccessBlockConfiguration"]  # type: ignore[attr-defined]
    assert all(block.values())


def _check_functions(aws_lambda: object, iam: object, names: dict[str, str], bucket: str) -> None:
    assert set(names) == set(HANDLERS)
    for kind, name in names.items():
        function = aws_lambda.get_function(FunctionName=name)  # type: ignore[attr-defined]
        config = function["Configuration"]
        assert config["PackageType"] == "Image"
        assert config["ImageConfigResponse"]["ImageConfig"]["Command"] == [
            "function",
            HANDLERS[kind],
        ]
        assert function["Concurrency"]["ReservedConcurrentExecutions"] == 20
        role = config["Role"].rsplit("/", 1)[1]
        document = iam.get_role_policy(RoleName=role, PolicyName="least-privilege")  # type: ignore[attr-defined]
        text = json.dumps(document["PolicyDocument"])
        objects = set(re.findall(rf"arn:aws:s3:::{bucket}/db/([a-z]+)/\*", text))
        expected = {
            "log_sort": {"logs", "recovery"},
            "compaction": {"tables"},
            "gc": {"tables", "logs", "recovery", "snapshots"},
        }[kind]
        assert objects == expected, (kind, objects)
        assert '"s3:*"' not in text and f"arn:aws:s3:::{bucket}/*" not in text


@pytest.mark.slow
@pytest.mark.no_cluster
def test_a_bucket_name_already_taken_fails_the_apply_naming_it(
    moto: tuple[str, dict[str, object]], tmp_path: Path
) -> None:
    endpoint, kwargs = moto
    bucket = f"tftaken-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", **kwargs).create_bucket(Bucket=bucket)  # type: ignore[call-overload]
    init(MOTO_ROOT, tmp_path)
    state = ["-state", str(tmp_path / "state" / "terraform.tfstate")]
    target = ["-target=module.storage.aws_s3_bucket.objects"]
    variables = moto_vars(endpoint, bucket)
    try:
        result = terraform(
            MOTO_ROOT,
            "apply",
            "-auto-approve",
            *target,
            *state,
            *variables,
            data_dir=tmp_path,
            check=False,
            timeout=300,
        )
        assert result.returncode != 0
        message = " ".join(result.stderr.replace("│", " ").split())
        assert bucket in message and "BucketAlready" in message, message
    finally:
        # Whatever the apply made is destroyed; a state with nothing in it (the refused bucket
        # was all it tried) needs no destroy, a command that costs seconds of CPU.
        if _state_resources(tmp_path / "state" / "terraform.tfstate"):
            terraform(
                MOTO_ROOT,
                "destroy",
                "-auto-approve",
                *state,
                *variables,
                data_dir=tmp_path,
                timeout=300,
            )


def _state_resources(path: Path) -> list[dict[str, object]]:
    """The resources a local state file records (none if there is no file)."""
    if not path.exists():
        return []
    return list(json.loads(path.read_text()).get("resources", []))


def test_functions_module_and_functions_package_agree() -> None:
    """The Terraform functions and the handlers in functions/ name each other: a handler module
    that exists is deployed, with a callable ``handler``; the module names the three of the
    recovery issue (log sort, compaction, GC), whose code lands in functions/ beside them."""
    import importlib

    text = (TF / "modules" / "functions" / "main.tf").read_text()
    deployed = dict(re.findall(r'(\w+) = \{\s+handler\s+= "(functions\.\w+\.handler)"', text))
    assert deployed == HANDLERS
    package = ROOT / "functions"
    for path in sorted(package.glob("*.py")):
        module = importlib.import_module(f"functions.{path.stem}")
        if callable(getattr(module, "handler", None)):
            assert f"functions.{path.stem}.handler" in deployed.values(), path
    for handler in deployed.values():
        module_name = handler.rsplit(".", 1)[0]
        if (package / f"{module_name.split('.')[1]}.py").exists():
            assert callable(getattr(importlib.import_module(module_name), "handler", None))
