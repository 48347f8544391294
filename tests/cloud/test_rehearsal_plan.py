"""The cloud rehearsal's plan (tests/cloud/plan.py): ``environments/dev`` planned against moto
as scripts/cloud-rehearsal.sh plans it, and what the rehearsal reads of it known at plan time:
every task definition's containers and task role, every function's role, the GC schedule's
event, and the policies of each of those roles (the rehearsal checks each role's S3 calls
against them).

On a full run scripts/test.sh names the rehearsal's cache (CLOUD_REHEARSAL_CACHE): the plan is
made there, beside the other tests, and the rehearsal after the suite finds it (keyed by the
hash of infra/terraform) instead of planning again once every test is done. Without it the
plan goes to this test's own directory.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cloud import plan as tfplan

pytestmark = [pytest.mark.slow, pytest.mark.no_cluster, pytest.mark.timeout(900)]

#: The rehearsal's cache directory (scripts/cloud-rehearsal.sh), when the caller names it.
CACHE_ENV = "CLOUD_REHEARSAL_CACHE"


def test_the_rehearsal_plan_knows_every_task_function_schedule_and_role_policy(
    tmp_path: Path,
) -> None:
    cache = Path(os.environ[CACHE_ENV]) if os.environ.get(CACHE_ENV) else tmp_path / "cache"
    plan = tfplan.plan_json(tmp_path / "work", cache, log=lambda _: None)
    assert list(cache.glob("plan-*.json")), "the plan was not cached for the rehearsal"

    tasks = tfplan.task_definitions(plan)  # raises on a definition or role not known at plan
    assert {f"{tfplan.ENVIRONMENT}-tabletstore-{role}" for role in ("master", "worker")} <= set(
        tasks
    ), sorted(tasks)
    for family, task in tasks.items():
        assert task["containers"], family
    functions = tfplan.functions(plan)
    prefix = f"{tfplan.ENVIRONMENT}-tabletstore-"
    assert set(functions) == {prefix + kind for kind in ("compaction", "gc", "log-sort")}
    gc = prefix + "gc"
    event = tfplan.scheduled_events(plan).get(gc)
    assert event is not None and event.get("cluster_url", "").startswith("etcd://"), event

    policies = tfplan.role_policies(plan)
    roles = {task["task_role"] for task in tasks.values()}
    roles |= {values["role_address"] for values in functions.values()}
    for role in sorted(roles):
        documents = policies.get(role, [])
        unknown = [d["unknown"] for d in documents if "unknown" in d]
        assert documents and not unknown, f"{role}: policies not known from the plan: {unknown}"
