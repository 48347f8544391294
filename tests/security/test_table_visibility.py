"""A principal learns of a table only what its rights on it allow, and only the front door's
role may act for another identity on a worker.

The secured cluster of tests/security/secure_cluster.py (a master and a worker with mutual TLS,
both serving status pages). alice's table ``vault`` has one family only she may read or write
and a tablet boundary at a secret row key. bob is another authenticated principal. Before:

- bob's ``list_tables`` named ``vault`` and ``describe_table`` showed its schema;
- bob's raw reads of METADATA returned vault's records (its boundaries, SSTables, events);
- the status pages (``/status``, ``/api/cluster``, the HTML) showed vault's boundaries and
  split keys to bob's certificate and to the status token;
- a worker or master certificate could name any identity in a data request's ``identity``
  field and be served as that identity.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tabletstore.coordination import paths
from tabletstore.data.filters import CellsPerRowLimit
from tabletstore.data.model import SetCell
from tabletstore.data.query import RowRange
from tabletstore.data.schema import Acl, ColumnFamily
from tabletstore.errors import NotFound, PermissionDenied, TabletStoreError
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import TabletRecord
from tabletstore.metadata.rows import METADATA_TABLE_ID, decode_row
from tabletstore.rpc.auth import ACTING_FOR, ClientAuth
from tabletstore.rpc.messages import ReadRowsRequest, RowBatch, TableNameRequest
from tabletstore.rpc.row_pieces import RowAssembler
from tabletstore.rpc.services import MASTER, TABLET
from tabletstore.rpc.tcp import TcpTransport
from tabletstore.security import ca
from tests.security.secure_cluster import (
    SECRET,
    STATUS_TOKEN,
    SecureCluster,
    alices_vault,
    secure_cluster,
    wait_for,
)

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SecureCluster]:
    async with secure_cluster(tmp_path) as running:
        yield running


async def _vault(cluster: SecureCluster) -> tuple[str, str]:
    """alice's vault (secure_cluster.alices_vault); (table id, the tablet id of the tablet
    starting at the secret)."""
    alice = await cluster.client("alice")
    try:
        await alices_vault(alice)
        table_id = (await Catalog(alice.coordinator).get_table("vault")).table_id
        status = await alice.status()
        return table_id, next(
            t.tablet_id
            for answer in status.workers.values()
            for t in answer.tablets  # type: ignore[union-attr]
            if t.table_id == table_id and t.start_row == SECRET
        )
    finally:
        await alice.close()


async def _metadata(cluster: SecureCluster, who: str, **extra: Any) -> list[Any]:
    """Every METADATA row a raw read of its tablets returns to ``who``'s certificate."""
    kv = await cluster.coordinator.get(paths.ROOT_TABLET)
    assert kv is not None
    root = TabletRecord.from_bytes(kv.value)
    transport = TcpTransport(timeout=10.0, auth=ClientAuth(cluster.tls(who)))
    try:
        stub = TABLET.client(transport, cluster.worker_address)
        rows: list[Any] = []
        holders = [root]
        seen = set()
        while holders:
            holder = holders.pop()
            if holder.tablet_id in seen:
                continue
            seen.add(holder.tablet_id)
            request = ReadRowsRequest(
                METADATA_TABLE_ID, holder.tablet_id, ranges=(RowRange(b"", None),), **extra
            )
            assembler = RowAssembler()
            async for item in stub.read_rows(request):
                for row in assembler.rows(item):
                    rows.append(row)
                    decoded = decode_row(row)
                    if decoded is not None and decoded.record.table_id == METADATA_TABLE_ID:
                        holders.append(decoded.record)
        return rows
    finally:
        await transport.close()


async def test_bob_neither_lists_nor_describes_alices_table(cluster: SecureCluster) -> None:
    await _vault(cluster)
    bob = await cluster.client("bob")
    alice = await cluster.client("alice")
    try:
        await bob.create_table("bobs", ["f"])
        assert await bob.list_tables() == ["bobs"]
        with pytest.raises(NotFound, match="table 'vault' does not exist"):
            await bob.describe_table("vault")
        with pytest.raises(NotFound, match="table 'nothing' does not exist"):
            await bob.describe_table("nothing")
        # Administering it is refused alike whether it exists or not, naming no admin.
        for name in ("vault", "nothing"):
            with pytest.raises(PermissionDenied, match=f"bob may not delete_table table '{name}'"):
                await bob.delete_table(name)
        assert "vault" in await alice.list_tables()
        assert (await alice.describe_table("vault")).admins == ["alice"]
    finally:
        await bob.close()
        await alice.close()


async def test_metadata_answers_only_what_the_reader_may_know(cluster: SecureCluster) -> None:
    table_id, _ = await _vault(cluster)

    def of_vault(rows: list[Any]) -> list[Any]:
        return [r for r in rows if r.key.startswith(table_id.encode() + b"\x00")]

    # alice reads her table's records whole (its SSTables name row keys she may read).
    assert len(of_vault(await _metadata(cluster, "alice"))) == 2
    # bob gets none of them, and METADATA's own rows only cut to routing.
    bob_rows = await _metadata(cluster, "bob")
    assert of_vault(bob_rows) == []
    assert all(SECRET not in c.value for r in bob_rows for c in r.cells)
    own = [decode_row(r) for r in bob_rows]
    assert own and all(d is not None and d.record.sstables == {} for d in own)
    assert all(d is not None and d.record.events == () for d in own)
    # A filter over the records' bytes would be an oracle: refused.
    with pytest.raises(PermissionDenied, match="METADATA with a filter"):
        await _metadata(cluster, "bob", filter=CellsPerRowLimit(1))
    # bob still routes to his own tables.
    bob = await cluster.client("bob")
    try:
        table = await bob.create_table("bobs", ["f"])

        async def written() -> bool:
            try:
                await table.mutate_row(b"r", [SetCell("f", b"q", b"v")])
            except TabletStoreError:
                return False
            return True

        await wait_for(written, "bob's table to be served")
        assert (await table.read_row(b"r")) is not None
    finally:
        await bob.close()


async def test_a_writer_only_principal_gets_routing_not_keys(cluster: SecureCluster) -> None:
    alice = await cluster.client("alice")
    try:
        table = await alice.create_table(
            "dropbox",
            [ColumnFamily(name="in", acl=Acl(readers=["alice"], writers=["alice", "bob"]))],
            split_keys=[SECRET],
        )

        async def writable() -> bool:
            try:
                await table.mutate_row(SECRET, [SetCell("in", b"q", b"v")])
            except TabletStoreError:
                return False
            return True

        await wait_for(writable, "alice's drop box to be served")
        table_id = (await Catalog(alice.coordinator).get_table("dropbox")).table_id
    finally:
        await alice.close()
    rows = [
        r for r in await _metadata(cluster, "bob") if r.key.startswith(table_id.encode() + b"\0")
    ]
    assert len(rows) == 2  # bob may write: he needs to know where
    for row in rows:
        decoded = decode_row(row)
        assert decoded is not None and decoded.record.location is not None
        assert decoded.record.sstables == {} and decoded.record.events == ()
    bob = await cluster.client("bob")
    try:
        await bob.table("dropbox").mutate_row(SECRET + b"!", [SetCell("in", b"q", b"bob's")])
    finally:
        await bob.close()


@pytest.mark.parametrize("role", ["worker", "master"])
async def test_only_the_front_doors_role_acts_for_another_identity(
    cluster: SecureCluster, role: str
) -> None:
    table_id, tablet_id = await _vault(cluster)
    ca.issue(cluster.certs, f"{role}2", role=role)
    ca.issue(cluster.certs, "frontdoor", role="function")
    read = ReadRowsRequest(table_id, tablet_id, keys=(SECRET + b"/x",), identity="alice")

    async def as_(name: str) -> Any:
        transport = TcpTransport(timeout=10.0, auth=ClientAuth(cluster.tls(name)))
        try:
            return await TABLET.client(transport, cluster.worker_address).read_row(read)
        finally:
            await transport.close()

    with pytest.raises(PermissionDenied, match=rf"{role}2 .*on behalf of 'alice'"):
        await as_(f"{role}2")
    answer = await as_("frontdoor")
    assert isinstance(answer, RowBatch) and answer.rows[0].cells[0].family == "p"

    # The master refuses the same certificate's requests on alice's behalf (REQUEST_AS).
    transport = TcpTransport(timeout=10.0, auth=ClientAuth(cluster.tls(f"{role}2")))
    token = ACTING_FOR.set("alice")
    try:
        master = MASTER.client(transport, await Catalog(cluster.coordinator).master_address())
        with pytest.raises(PermissionDenied, match=rf"{role}2 .*on behalf of 'alice'"):
            await master.delete_table(TableNameRequest("vault"))
    finally:
        ACTING_FOR.reset(token)
        await transport.close()


async def _get(url: str, cluster: SecureCluster, who: str | None) -> str:
    """GET ``url`` with ``who``'s certificate, or with the status token (None)."""
    tls = cluster.tls(who) if who is not None else cluster.ca_only()
    headers = {} if who is not None else {"Authorization": f"Bearer {STATUS_TOKEN}"}
    connector = aiohttp.TCPConnector(ssl=tls.client_context())
    async with aiohttp.ClientSession(connector=connector) as session:
        async with session.get(url, headers=headers) as response:
            assert response.status == 200, await response.text()
            return await response.text()


async def test_status_pages_show_row_keys_only_to_readers(cluster: SecureCluster) -> None:
    table_id, _ = await _vault(cluster)
    secret = SECRET.decode()
    worker, master = cluster.status_url, cluster.master_status_url

    async def split_event_shown() -> bool:
        # The master's page sees the worker's tablets once it has sampled its /status.
        return secret in await _get(f"{master}/api/cluster", cluster, "master")

    await wait_for(split_event_shown, "the master's page to show the vault")
    for who in ("alice", "master"):
        for path in (f"{worker}/status", f"{worker}/api/worker", f"{master}/api/cluster"):
            assert secret in await _get(path, cluster, who), (who, path)
    for who in ("bob", None):
        for path in (
            f"{worker}/status",
            f"{worker}/api/worker",
            f"{worker}/",
            f"{master}/api/cluster",
            f"{master}/status",
            f"{master}/",
        ):
            assert secret not in await _get(path, cluster, who), (who, path)
        # The counts stay: two tablets of the vault, their boundaries blanked.
        status = json.loads(await _get(f"{worker}/status", cluster, who))
        vault = [t for t in status["tablets"] if t["table_id"] == table_id]
        assert len(vault) == 2 and all(t["keys_hidden"] for t in vault)
        view = json.loads(await _get(f"{master}/api/cluster", cluster, who))
        (table,) = [t for t in view["tables"] if t["table_id"] == table_id]
        assert len(table["tablets"]) == 2 and all(t["keys_hidden"] for t in table["tablets"])
