"""The plan -> docker run translation (tests/cloud/containers.py)."""

from __future__ import annotations

import pytest

from tests.cloud.containers import (
    LAMBDA_USER,
    Function,
    Loopback,
    PlanError,
    Platform,
    function_run_args,
    health_command,
    start_order,
    substitute,
    task_run_args,
)

LOOP = Loopback(etcd="127.0.0.1:23790", s3="http://127.0.0.1:8333", etcd_scheme="https")
PLATFORM = Platform(
    credentials={"AWS_ACCESS_KEY_ID": "AKID", "AWS_SECRET_ACCESS_KEY": "SECRET"},
    endpoints={"lambda": "http://127.0.0.1:5001"},
    address="127.0.0.7",
)


def env_of(args: list[str]) -> dict[str, str]:
    pairs = [args[i + 1] for i, a in enumerate(args) if a == "--env"]
    return dict(p.split("=", 1) for p in pairs)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("etcd://127.0.0.1:2379/tabletstore", "etcd://127.0.0.1:23790/tabletstore"),
        (
            "etcd://u@10.0.0.1:2379,10.0.0.2:2379/ns?ca=/tmp/t/ca.pem&cert=/tmp/t/c.pem",
            "etcd://u@127.0.0.1:23790/ns?ca=/tmp/t/ca.pem&cert=/tmp/t/c.pem",
        ),
        (
            "s3://bucket-1/dev?region=us-east-1",
            "s3://bucket-1/dev?region=us-east-1&addressing_style=path",
        ),
        (
            "s3://b/p?endpoint_url=https://elsewhere&region=eu-west-1",
            "s3://b/p?region=eu-west-1&addressing_style=path",
        ),
        ("https://10.40.0.10:2379,https://10.40.16.10:2379", "https://127.0.0.1:23790"),
        ("--port", "--port"),
        ("https://example.com:443", "https://example.com:443"),
        ("lambda:dev-tabletstore-log-sort", "lambda:dev-tabletstore-log-sort"),
    ],
)
def test_substitute_replaces_only_endpoints(value: str, expected: str) -> None:
    assert substitute(value, LOOP) == expected


def test_substitute_names_every_loopback_member() -> None:
    members = Loopback(etcd="127.0.1.1:2379,127.0.1.2:2379", s3="http://s3", etcd_scheme="https")
    assert substitute("etcd://10.0.0.1:2379,10.0.0.2:2379/ns?ca=/t/ca", members) == (
        "etcd://127.0.1.1:2379,127.0.1.2:2379/ns?ca=/t/ca"
    )
    assert substitute("https://10.0.0.1:2379,https://10.0.0.2:2379", members) == (
        "https://127.0.1.1:2379,https://127.0.1.2:2379"
    )


MASTER = {
    "name": "master",
    "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/tabletstore:1",
    "essential": True,
    "user": "10001:10001",
    "command": ["master", "--store", "s3://b/dev?region=us-east-1", "--port", "7000"],
    "environment": [
        {"name": "TABLETSTORE_URL", "value": "etcd://10.0.0.9:2379/tabletstore"},
        {"name": "TABLETSTORE_EXECUTOR", "value": "lambda"},
    ],
    "secrets": [{"name": "ETCD_CA_CERT", "valueFrom": "arn:aws:secretsmanager:r:1:secret:c:ca::"}],
    "readonlyRootFilesystem": True,
    "mountPoints": [{"sourceVolume": "tmp", "containerPath": "/tmp"}],
    "portMappings": [{"containerPort": 7000, "protocol": "tcp"}],
    "healthCheck": {"command": ["CMD", "/usr/local/bin/tabletstore-entrypoint", "health", "7000"]},
    "dependsOn": [{"containerName": "scratch", "condition": "SUCCESS"}],
    "logConfiguration": {"logDriver": "awslogs", "options": {}},
}
SECRETS = {"arn:aws:secretsmanager:r:1:secret:c": {"ca": "PEM", "cert": "C", "key": "K"}}


def test_a_task_container_runs_with_the_plans_command_user_env_and_read_only_root() -> None:
    args = task_run_args(
        MASTER,
        image="tabletstore:rehearsal",
        name="master-1",
        loopback=LOOP,
        platform=PLATFORM,
        volumes={"tmp": "/srv/task-1/tmp"},
        secrets=SECRETS,
    )
    image = args.index("tabletstore:rehearsal")
    assert args[image + 1 :] == [
        "master", "--store", "s3://b/dev?region=us-east-1&addressing_style=path",
        "--port", "7000",
    ]  # fmt: skip
    flags = args[:image]
    assert flags[flags.index("--user") + 1] == "10001:10001"
    assert "--read-only" in flags and flags[flags.index("--network") + 1] == "host"
    assert "type=bind,src=/srv/task-1/tmp,dst=/tmp" in flags
    assert env_of(flags) == {
        "TABLETSTORE_URL": "etcd://127.0.0.1:23790/tabletstore",
        "TABLETSTORE_EXECUTOR": "lambda",
        "ETCD_CA_CERT": "PEM",
        "AWS_ACCESS_KEY_ID": "AKID",
        "AWS_SECRET_ACCESS_KEY": "SECRET",
        "AWS_REGION": "us-east-1",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL_LAMBDA": "http://127.0.0.1:5001",
        "TABLETSTORE_ADVERTISE_HOST": "127.0.0.7",
        "AWS_ENDPOINT_URL_S3": "http://127.0.0.1:8333",
    }
    assert "--entrypoint" not in flags  # the image's own


def test_an_entry_point_and_its_arguments_come_before_the_command() -> None:
    init = {"name": "scratch", "user": "0", "entryPoint": ["/bin/sh", "-c"], "command": ["id"]}
    args = task_run_args(init, image="img", name="s", loopback=LOOP, platform=PLATFORM, volumes={})
    assert args[args.index("--entrypoint") + 1] == "/bin/sh"
    assert args[args.index("img") :] == ["img", "-c", "id"]
    assert "--read-only" not in args


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"privileged": True}, "fields not rehearsed: {'privileged'}"),
        ({"linuxParameters": {"initProcessEnabled": True}}, "linuxParameters is not rehearsed"),
        ({"mountPoints": [{"sourceVolume": "data", "containerPath": "/d"}]}, "unknown volume"),
        ({"secrets": [{"name": "X", "valueFrom": "arn:other"}]}, "no value for the secret"),
        (
            {"secrets": [{"name": "X", "valueFrom": "arn:aws:secretsmanager:r:1:secret:c:pw::"}]},
            "has no key 'pw'",
        ),
    ],
)
def test_what_cannot_be_rehearsed_is_an_error(change: dict[str, object], message: str) -> None:
    with pytest.raises(PlanError, match=message.replace("{", r"\{").replace("}", r"\}")):
        task_run_args(
            {**MASTER, **change},
            image="img",
            name="m",
            loopback=LOOP,
            platform=PLATFORM,
            volumes={"tmp": "/x"},
            secrets=SECRETS,
        )


def test_health_checks_take_ecs_form() -> None:
    assert health_command(MASTER) == ["/usr/local/bin/tabletstore-entrypoint", "health", "7000"]
    shell = {"name": "x", "healthCheck": {"command": ["CMD-SHELL", "exit 0"]}}
    assert health_command(shell) == ["/bin/sh", "-c", "exit 0"]
    assert health_command({"name": "x"}) is None
    bare = {"name": "x", "healthCheck": {"command": ["/usr/local/bin/e", "health", "7000"]}}
    with pytest.raises(PlanError, match="must start with CMD or CMD-SHELL"):
        health_command(bare)


def test_start_order_follows_depends_on() -> None:
    containers = [
        {"name": "app", "dependsOn": [{"containerName": "init", "condition": "SUCCESS"}]},
        {"name": "init"},
    ]
    assert [c["name"] for c in start_order(containers)] == ["init", "app"]
    with pytest.raises(PlanError, match="names no container"):
        start_order([{"name": "a", "dependsOn": [{"containerName": "b"}]}])
    with pytest.raises(PlanError, match="cycle"):
        start_order(
            [
                {"name": "a", "dependsOn": [{"containerName": "b"}]},
                {"name": "b", "dependsOn": [{"containerName": "a"}]},
            ]
        )


PLANNED_FUNCTION = {
    "function_name": "dev-tabletstore-log-sort",
    "package_type": "Image",
    "image_config": [{"command": ["function", "functions.log_sort.handler"], "entry_point": []}],
    "environment": [{"variables": {"TABLETSTORE_STORE_URL": "s3://b/dev?region=us-east-1"}}],
    "memory_size": 2048,
    "timeout": 300,
}


def test_a_function_runs_as_lambda_runs_an_image() -> None:
    function = Function.from_plan(PLANNED_FUNCTION)
    args = function_run_args(
        function,
        image="img",
        name="log-sort",
        loopback=LOOP,
        platform=Platform(credentials={"AWS_ACCESS_KEY_ID": "F"}),
        runtime_api="127.0.0.1:9001",
    )
    image = args.index("img")
    assert args[image:] == ["img", "function", "functions.log_sort.handler"]
    flags = args[:image]
    assert flags[flags.index("--user") + 1] == LAMBDA_USER
    assert "--read-only" in flags and "--entrypoint" not in flags
    assert any(f.startswith("/tmp:rw") for f in flags)
    env = env_of(flags)
    assert env["AWS_LAMBDA_RUNTIME_API"] == "127.0.0.1:9001"
    assert env["AWS_LAMBDA_FUNCTION_NAME"] == "dev-tabletstore-log-sort"
    assert env["AWS_LAMBDA_FUNCTION_MEMORY_SIZE"] == "2048"
    assert env["TABLETSTORE_STORE_URL"].endswith("&addressing_style=path")
    assert env["AWS_ENDPOINT_URL_S3"] == "http://127.0.0.1:8333"
    with pytest.raises(PlanError, match="only image functions"):
        Function.from_plan({**PLANNED_FUNCTION, "package_type": "Zip"})
