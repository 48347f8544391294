"""The read-only etcd user a ``local-stack up --tls`` gives clients reads only what a client
needs: the master's address, the root tablet's location, the settings, the live workers and
status pages, and token records (by digest). Not the schemas (every table's name, families
and admins), ACLs, tablet records, claims or assignments.

Before, its role could read the whole namespace: any client saw every tenant's table names and
ACLs in etcd, whatever the master would list to it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tabletstore import connect
from tabletstore.cli import localstack
from tabletstore.coordination import open_coordinator, paths
from tabletstore.data.model import SetCell
from tabletstore.errors import PermissionDenied

pytestmark = pytest.mark.timeout(180)

#: Ranges a client's etcd user may not read.
_HIDDEN = (paths.SCHEMAS, paths.ACLS, paths.CLAIMS, paths.ASSIGNMENTS)
#: What it still reads (module docstring; localstack.READER_KEYS says why).
_READABLE = (paths.ELECTIONS, paths.SETTINGS, paths.SERVERS, paths.TOKENS)


async def _reads(url: str) -> dict[str, object]:
    coordinator = open_coordinator(url)
    got: dict[str, object] = {}
    try:
        for prefix in (*_HIDDEN, *_READABLE):
            try:
                got[prefix] = len(await coordinator.get_prefix(prefix))
            except PermissionDenied:
                got[prefix] = "denied"
        got[paths.ROOT_TABLET] = await coordinator.get(paths.ROOT_TABLET) is not None
    finally:
        await coordinator.close()
    return got


def test_the_reader_user_reads_only_what_clients_need(tmp_path: Path) -> None:
    directory = tmp_path / "stack"
    stack = localstack.up(directory, workers=1, tls=True)
    try:
        assert stack.cluster_url is not None and stack.admin_url is not None
        db = connect(stack.cluster_url, tls=stack.tls("client"))
        try:
            table = db.create_table("ledger", ["f"])
            table.mutate_row(b"r", [SetCell("f", b"c", b"v")])
            row = table.read_row(b"r")
            assert row is not None and row.cells[0].value == b"v"
            # `tabletstore status` works with it: tables come from the master.
            status = db.status()
            assert status.master is not None and status.workers
        finally:
            db.close()
        reader = asyncio.run(_reads(stack.cluster_url))
        operator = asyncio.run(_reads(stack.admin_url))
        # The cluster's user reads them all, and schemas and claims are there to be read.
        assert all(operator[p] != "denied" for p in _HIDDEN), operator
        assert operator[paths.SCHEMAS] and operator[paths.CLAIMS], operator
        assert reader == {
            **dict.fromkeys(_HIDDEN, "denied"),
            **{p: operator[p] for p in _READABLE},
            paths.ROOT_TABLET: True,
        }, reader
    finally:
        localstack.down(directory)
