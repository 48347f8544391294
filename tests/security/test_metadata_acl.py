"""A table's row keys are shown only to principals that may read the table.

A master and a worker with mutual TLS and authorization on loopback (the secured cluster of
tests/security/secure_cluster.py). alice's table ``vault`` has one family only she may read
and a tablet boundary at a secret row key. bob, another authenticated principal, used to read
that key from ``sample_row_keys``, from every worker's ``server_status`` (the tablets'
boundaries) and from ``list_snapshots`` (a snapshot's manifest lists its tablets' ranges).
Now ``sample_row_keys`` (a raw request to the worker; through the client the table does not
exist for bob) and ``list_snapshots("vault")`` are PermissionDenied for bob,
``server_status`` and the unfiltered ``list_snapshots`` leave alice's table out, and alice still
sees all of it. A principal may see a table's keys when it administers the table or may read
one of its families.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tabletstore.errors import NotFound, PermissionDenied
from tabletstore.metadata.catalog import Catalog
from tabletstore.rpc.auth import ClientAuth
from tabletstore.rpc.messages import SampleRowKeysRequest
from tabletstore.rpc.services import TABLET
from tabletstore.rpc.tcp import TcpTransport
from tests.security.secure_cluster import SECRET, SecureCluster, alices_vault, secure_cluster

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[SecureCluster]:
    async with secure_cluster(tmp_path) as running:
        yield running


async def test_bob_sees_no_row_key_of_alices_table(cluster: SecureCluster) -> None:
    alice = await cluster.client("alice")
    bob = await cluster.client("bob")
    try:
        table = await alices_vault(alice)
        table_id = (await Catalog(alice.coordinator).get_table("vault")).table_id
        snapshot = await table.snapshot(ttl=600)

        # alice sees her table's keys.
        assert SECRET in [key for key, _ in await table.sample_row_keys()]
        assert SECRET in _boundaries(await alice.status(), table_id)
        assert [m.snapshot_id for m in await alice.list_snapshots("vault")] == [
            snapshot.snapshot_id
        ]

        # bob sees none of them: the table does not exist for him, and its worker refuses
        # his certificate's raw request.
        with pytest.raises(NotFound, match="table 'vault' does not exist"):
            await bob.table("vault").sample_row_keys()
        tablet_id = next(
            t.tablet_id
            for answer in (await alice.status()).workers.values()
            for t in answer.tablets  # type: ignore[union-attr]
            if t.table_id == table_id
        )
        transport = TcpTransport(timeout=10.0, auth=ClientAuth(cluster.tls("bob")))
        try:
            stub = TABLET.client(transport, cluster.worker_address)
            with pytest.raises(PermissionDenied, match="permission: read"):
                await stub.sample_row_keys(SampleRowKeysRequest(table_id, tablet_id))
        finally:
            await transport.close()
        assert _boundaries(await bob.status(), table_id) == set()
        with pytest.raises(PermissionDenied, match="permission: read"):
            await bob.list_snapshots("vault")
        listed = await bob.list_snapshots()
        assert snapshot.snapshot_id not in [m.snapshot_id for m in listed]
    finally:
        await alice.close()
        await bob.close()


def _boundaries(status: object, table_id: str) -> set[bytes]:
    """The tablet boundaries of ``table_id`` in a cluster status, as its workers report them."""
    out: set[bytes] = set()
    for answer in status.workers.values():  # type: ignore[attr-defined]
        assert not isinstance(answer, str), answer
        for t in answer.tablets:
            if t.table_id == table_id:
                out.add(t.start_row)
                if t.end_row is not None:
                    out.add(t.end_row)
    return out
