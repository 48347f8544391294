"""What a create call tells a token holder about names it may not know of, through the front
door (docs/architecture/bigtable-api.md, "Names").

As in Cloud Bigtable, table names live in an instance and rights are checked on the instance
first: in another principal's instance every create (and every lookup) is PERMISSION_DENIED
whether or not the table exists, so names there cannot be probed. The plain instance is the
database's one shared table namespace (off by default), like the instance ids themselves:
there a taken name answers ALREADY_EXISTS to anyone who tries to create it, as a bucket name
does in S3; the table's schema, rows and place in listings stay hidden.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.security.test_frontdoor_tenancy import (
    INSTANCE,
    INSTANCES,
    PLAIN_TABLE,
    PROJECT,
    TABLES,
    FrontDoor,
    _code,
    _t1_builds,
    cluster,  # noqa: F401 (a fixture)
    front_door,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.timeout(180)

grpc = pytest.importorskip("grpc")


def _create(m: dict[str, Any], parent: str, table_id: str) -> Any:
    return m["bta"].CreateTableRequest(parent=parent, table_id=table_id, table=m["table"].Table())


async def test_creates_in_another_principals_instance_reveal_no_table_names(
    front_door: tuple[FrontDoor, str, str],  # noqa: F811
) -> None:
    door, t1, t2 = front_door
    m = door.m
    await _t1_builds(door, t1)

    async def create(parent: str, table_id: str) -> str:
        return await _code(door.call(t2, TABLES, "CreateTable", _create(m, parent, table_id)))

    async def get(name: str) -> str:
        return await _code(door.call(t2, TABLES, "GetTable", m["bta"].GetTableRequest(name=name)))

    # In t1's instance: the same answer for t1's table and for a name nobody took.
    assert (
        await create(INSTANCE, "ledger")
        == await create(INSTANCE, "unused")
        == ("PERMISSION_DENIED")
    )
    assert await get(f"{INSTANCE}/tables/ledger") == await get(f"{INSTANCE}/tables/unused")
    # The shared namespaces answer a taken name as taken (documented), and nothing more.
    plain_parent = PLAIN_TABLE.rsplit("/tables/")[0]
    assert await create(plain_parent, "plain-ledger") == "ALREADY_EXISTS"
    assert await get(PLAIN_TABLE) == "NOT_FOUND"
    taken = m["bia"].CreateInstanceRequest(
        parent=f"projects/{PROJECT}", instance_id="t1-instance", instance=m["instance"].Instance()
    )
    assert await _code(door.call(t2, INSTANCES, "CreateInstance", taken)) == "ALREADY_EXISTS"
