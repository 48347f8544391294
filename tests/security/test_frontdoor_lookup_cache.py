"""Through the front door, what a caller learns of a table depends on that caller alone.

The front door serves every caller through one cluster client, which keeps each table's id and
schema once looked up. Before, that answer was shared: once alice had used her table through
the front door, bob's writes and reads of it skipped the master's lookup (which answers bob
NOT_FOUND, as for a table that does not exist) and reached the tablet server, which refused
them PERMISSION_DENIED -- bob learnt that the table exists, and only because of alice's use.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tabletstore.security import ca
from tests.security.secure_cluster import alices_vault, secure_cluster
from tests.security.test_frontdoor_tenancy import (
    DATA,
    PLAIN,
    PROJECT,
    FrontDoor,
    _code,
    open_front_door,
)

pytestmark = pytest.mark.timeout(180)

grpc = pytest.importorskip("grpc")

VAULT = f"projects/{PROJECT}/instances/{PLAIN}/tables/vault"
MISSING = f"projects/{PROJECT}/instances/{PLAIN}/tables/no-such-table"


@pytest.fixture
async def door_and_tokens(tmp_path: Path) -> AsyncIterator[tuple[FrontDoor, str, str]]:
    async with secure_cluster(tmp_path) as cluster:
        ca.issue(cluster.certs, "frontdoor", role="function")
        alice = await cluster.client("alice")
        try:
            await alices_vault(alice)
            async with open_front_door(cluster, "alice", "bob") as opened:
                yield opened
        finally:
            await alice.close()


def _probes(m: dict[str, Any], table: str) -> dict[str, Any]:
    """One data call of each kind on ``table``."""
    cell = m["data"].Mutation(
        set_cell=m["data"].Mutation.SetCell(
            family_name="p", column_qualifier=b"q", timestamp_micros=-1, value=b"bob"
        )
    )
    rule = m["data"].ReadModifyWriteRule(family_name="p", column_qualifier=b"n", append_value=b"x")
    return {
        "MutateRow": m["bt"].MutateRowRequest(table_name=table, row_key=b"a", mutations=[cell]),
        "CheckAndMutateRow": m["bt"].CheckAndMutateRowRequest(
            table_name=table, row_key=b"a", true_mutations=[cell]
        ),
        "ReadModifyWriteRow": m["bt"].ReadModifyWriteRowRequest(
            table_name=table, row_key=b"a", rules=[rule]
        ),
    }


async def _answers(door: FrontDoor, token: str, table: str) -> dict[str, str]:
    got = {
        method: await _code(door.call(token, DATA, method, request))
        for method, request in _probes(door.m, table).items()
    }
    got["ReadRows"] = await _code(door.rows(token, table))
    return got


async def test_bobs_answers_do_not_depend_on_alices_use(
    door_and_tokens: tuple[FrontDoor, str, str],
) -> None:
    door, alice, bob = door_and_tokens
    missing = await _answers(door, bob, MISSING)
    assert missing == dict.fromkeys(missing, "NOT_FOUND"), missing
    # bob may not know of alice's vault: every call is answered as for a missing table ...
    assert await _answers(door, bob, VAULT) == missing
    # ... and still after alice has used it through the same front door.
    assert await door.rows(alice, VAULT) == [b"a", b"patient-0042-hiv-positive/x"]
    assert await _answers(door, bob, VAULT) == missing
    # alice's own answers are hers: her write goes through.
    write = _probes(door.m, VAULT)["MutateRow"]
    assert await _code(door.call(alice, DATA, "MutateRow", write)) == "OK"
