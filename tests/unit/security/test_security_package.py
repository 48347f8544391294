"""The security package and the guards' decisions: certificates name their
principal, tokens are stored hashed and revocable, identities cannot be claimed."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tabletstore.coordination import open_coordinator
from tabletstore.coordination.tokens import TokenStore, token_digest
from tabletstore.errors import AlreadyExists, InvalidArgument, NotFound, PermissionDenied
from tabletstore.metadata.rows import METADATA_TABLE_ID
from tabletstore.rpc.messages import (
    AdoptCompactionRequest,
    LoadTabletRequest,
    MutateRowsRequest,
    MutateTabletsRequest,
    PointReadsRequest,
    ReadRowsRequest,
    TabletKeys,
    TabletMutations,
)
from tabletstore.security import Principal, TlsConfig, ca
from tabletstore.worker.tablet_service_guard import authorize

ALICE = Principal("alice", "client")
WORKER = Principal("w1", "worker")


def test_a_certificate_names_its_principal_and_role(tmp_path: Path) -> None:
    ca.init_ca(tmp_path)
    with pytest.raises(AlreadyExists):
        ca.init_ca(tmp_path)
    issued = ca.issue(tmp_path, "w1", role="worker")
    tls = TlsConfig(str(tmp_path / "ca.pem"), str(issued.cert), str(issued.key))
    assert tls.principal() == Principal("w1", "worker")
    assert (issued.key.stat().st_mode & 0o777) == 0o600
    tls.server_context()
    tls.client_context()
    with pytest.raises(InvalidArgument, match="unknown role"):
        ca.issue(tmp_path, "x", role="root")
    with pytest.raises(NotFound, match="certs init"):
        ca.issue(tmp_path / "nothing", "x")


def test_tls_config_says_what_is_missing(tmp_path: Path) -> None:
    assert TlsConfig.of(None) is None
    with pytest.raises(InvalidArgument, match="--tls-ca"):
        TlsConfig.of(None, "c.pem", "k.pem")
    with pytest.raises(InvalidArgument, match="both a certificate and its key"):
        TlsConfig.of(str(tmp_path), "c.pem")
    with pytest.raises(InvalidArgument, match="does not exist"):
        TlsConfig.of(str(tmp_path / "ca.pem"))


async def test_tokens_are_stored_hashed_and_revocable() -> None:
    coordinator = open_coordinator(f"memory://tokens-{uuid.uuid4().hex[:8]}")
    tokens = TokenStore(coordinator)
    token = await tokens.create("alice")
    assert token.startswith("tst_")
    assert await tokens.verify(token) == Principal("alice", "client", "token")
    (info,) = await tokens.list()
    assert info.digest == token_digest(token) and token not in repr(info)
    assert await tokens.revoke("alice") == 1
    with pytest.raises(PermissionDenied, match="revoked"):
        await tokens.verify(token)
    with pytest.raises(NotFound):
        await tokens.revoke("alice")
    await coordinator.close()


def test_the_identity_field_is_replaced_by_the_principal() -> None:
    read = ReadRowsRequest("t", "x", keys=(b"r",), identity="bob")
    assert authorize("read_row", read, ALICE, "w").identity == "alice"
    assert authorize("read_row", read, None, "w") is read  # no auth: as before
    # Only the delegating role (the front door's) may act for another identity; a worker's
    # or master's certificate naming one is refused.
    front_door = Principal("frontdoor", "function")
    assert authorize("read_row", read, front_door, "w").identity == "bob"
    with pytest.raises(PermissionDenied, match=r"w1 \(worker.*on behalf of 'bob'"):
        authorize("read_row", read, WORKER, "w")
    own = ReadRowsRequest("t", "x", keys=(b"r",), identity=WORKER.name)
    assert authorize("read_row", own, WORKER, "w") is own
    # Coalesced point reads of several tablets carry one identity, replaced the same way.
    points = PointReadsRequest((TabletKeys("t", "x", (b"r",)),), identity="bob")
    assert authorize("read_points", points, ALICE, "w").identity == "alice"
    assert authorize("read_points", points, front_door, "w").identity == "bob"


def test_control_requests_and_metadata_writes_are_for_the_cluster() -> None:
    with pytest.raises(PermissionDenied, match=r"alice may not call load_tablet.*table t"):
        authorize("load_tablet", LoadTabletRequest("t", "x"), ALICE, "worker w1")
    authorize("load_tablet", LoadTabletRequest("t", "x"), WORKER, "worker w1")
    # Adopting a compaction run elsewhere: a function (or the master) may, a user may not.
    adopt = AdoptCompactionRequest("t", "x", 1, b"{}", b"{}", b"{}")
    with pytest.raises(PermissionDenied, match="alice may not call adopt_compaction"):
        authorize("adopt_compaction", adopt, ALICE, "worker w1")
    authorize("adopt_compaction", adopt, Principal("compactor", "function"), "worker w1")
    write = MutateRowsRequest(METADATA_TABLE_ID, "root", ())
    with pytest.raises(PermissionDenied, match="METADATA"):
        authorize("mutate_rows", write, ALICE, "w")
    authorize("mutate_rows", write, WORKER, "w")
    # A coalesced write with a METADATA part (a cluster client sends those alone).
    several = MutateTabletsRequest(
        (TabletMutations("t", "x", ()), TabletMutations(METADATA_TABLE_ID, "root", ()))
    )
    with pytest.raises(PermissionDenied, match="METADATA"):
        authorize("mutate_tablets", several, ALICE, "w")
    authorize("mutate_tablets", several, WORKER, "w")
    user = MutateTabletsRequest((TabletMutations("t", "x", ()),), "mallory")
    assert authorize("mutate_tablets", user, ALICE, "w").identity == "alice"
