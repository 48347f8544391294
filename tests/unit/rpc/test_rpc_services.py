"""The typed services (rpc/services.py): every method of TabletService and MasterService is
served by the worker and the master and reachable through both transports, with the same
answers; the Transport contract's errors (Unreachable not sent, Indeterminate sent without an
answer) hold for the in-process transport too; no module names an RPC method by string.
"""

from __future__ import annotations

import ast
import asyncio
import pathlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import tabletstore
from tabletstore.batch.load_files import awrite_sstables
from tabletstore.data.model import AppendValue, RowMutation, SetCell
from tabletstore.data.schema import ColumnFamily, TableSchema
from tabletstore.embedded import Database
from tabletstore.errors import (
    ErrorCode,
    Indeterminate,
    InvalidArgument,
    NotServing,
    Unimplemented,
)
from tabletstore.master.remote_compaction import prepare
from tabletstore.metadata.backup import BackupManifest
from tabletstore.metadata.snapshot import SnapshotManifest
from tabletstore.rpc import messages as m
from tabletstore.rpc.inprocess import InProcessTransport
from tabletstore.rpc.services import MASTER, TABLET, MasterService, Service, TabletService
from tabletstore.rpc.tcp import RpcServer, TcpTransport
from tabletstore.rpc.transport import Transport
from tabletstore.rpc.wire import register_all
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore

pytestmark = pytest.mark.timeout(120)

SCHEMA = TableSchema(name="svc", families={"f": ColumnFamily(name="f")})


def test_the_protocols_declare_every_method_once() -> None:
    tablet = {m.name: m for m in TABLET.methods}
    assert set(tablet) == {
        "mutate_rows",
        "mutate_tablets",
        "read_rows",
        "read_row",
        "read_points",
        "check_and_mutate",
        "read_modify_write",
        "sample_row_keys",
        "load_tablet",
        "load_tablet_at",
        "unload_tablet",
        "compact_tablet",
        "adopt_compaction",
        "update_schema",
        "server_status",
        "snapshot_hold",
        "snapshot_write",
        "bulk_load_tablet",
    }
    assert [n for n, method in tablet.items() if method.streaming] == ["read_rows"]
    read_row = TABLET.method(TabletService.read_row)
    assert read_row.request is m.ReadRowsRequest
    assert read_row.response_types == (m.RowBatch, m.LargeRow)
    assert TABLET.method(TabletService.load_tablet).response_types == (type(None),)
    assert {method.name for method in MASTER.methods} == {
        "create_table",
        "delete_table",
        "list_tables",
        "get_table",
        "modify_families",
        "set_admins",
        "compact_table",
        "create_snapshot",
        "list_snapshots",
        "delete_snapshot",
        "bulk_load",
        "create_backup",
        "list_backups",
        "get_backup",
        "update_backup",
        "delete_backup",
        "restore_table",
        "restore_copied",
        "clone_table",
        "set_history",
        "set_changes",
        "set_replica",
        "history_default",
    }
    with pytest.raises(InvalidArgument, match="not a method of TabletService"):
        TABLET.method(MasterService.list_tables)


def test_a_dispatch_table_checks_the_implementation() -> None:
    class Half:
        async def mutate_rows(self, req: m.MutateRowsRequest) -> m.MutateRowsResponse:
            return m.MutateRowsResponse()

        async def mutate_tablets(self, req: m.MutateTabletsRequest) -> m.MutateRowsResponse:
            return m.MutateRowsResponse()

        async def read_rows(self, req: m.ReadRowsRequest) -> m.RowBatch:  # not a stream
            return m.RowBatch(())

    with pytest.raises(InvalidArgument, match=r"Half\.read_rows must be an async generator"):
        TABLET.handlers(Half())  # type: ignore[arg-type]


def _no_string_method_names(path: pathlib.Path, names: set[str]) -> list[str]:
    found = []
    tree = ast.parse(path.read_text())
    exports = {  # ``__all__`` lists Python names (a function may share a method's name)
        id(c)
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for c in ast.walk(node.value)
    }
    for node in ast.walk(tree):
        if id(node) in exports:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"{path}:{node.lineno}: {node.value!r}")
    return found


def test_no_module_names_an_rpc_method_by_string() -> None:
    """The Protocols are the one declaration: a method name spelled as a string anywhere in
    the package (a call site, a dispatch list, a comparison) would drift from it."""
    names = {method.name for service in (TABLET, MASTER) for method in service.methods}
    root = pathlib.Path(tabletstore.__file__).parent
    found = [hit for p in sorted(root.rglob("*.py")) for hit in _no_string_method_names(p, names)]
    assert found == []


# -- every method, both transports ------------------------------------------------------------


Call = Callable[[Any], Awaitable[Any]]


async def _exercise(
    worker: TabletService, master: MasterService, db: Database, bulk_source: str = "services-bulk"
) -> set[str]:
    """Call every method of both services through the stubs; returns the names called."""
    called: set[str] = set()

    async def call(fn: Callable[[Any], Awaitable[Any]], method: Any, req: Any) -> Any:
        spec = (TABLET if method in vars(TabletService).values() else MASTER).method(method)
        answer = await fn(req)
        assert isinstance(answer, spec.response_types), (spec, answer)
        called.add(spec.name)
        return answer

    info = (await call(master.create_table, MasterService.create_table, _create())).info()
    assert info.schema.name == "svc"
    listed = await call(master.list_tables, MasterService.list_tables, m.ListTablesRequest())
    assert "svc" in [i.schema.name for i in listed.infos()]
    got = await call(master.get_table, MasterService.get_table, m.TableNameRequest("svc"))
    assert got.info().table_id == info.table_id
    req = m.ModifyFamiliesRequest.of("svc", create=[ColumnFamily(name="g")])
    changed = await call(master.modify_families, MasterService.modify_families, req)
    assert set(changed.info().schema.families) == {"f", "g"}
    admins = await call(
        master.set_admins, MasterService.set_admins, m.SetAdminsRequest("svc", ("ann",))
    )
    assert admins.info().schema.admins == ["ann"]

    status = await call(worker.server_status, TabletService.server_status, m.ServerStatusRequest())
    (tablet,) = [t for t in status.tablets if t.table_id == info.table_id]
    tid, tab = info.table_id, tablet.tablet_id
    put = RowMutation(b"r", (SetCell("f", b"q", b"v"),))
    resp = await call(
        worker.mutate_rows, TabletService.mutate_rows, m.MutateRowsRequest(tid, tab, (put,))
    )
    assert resp.errors == ()
    other = RowMutation(b"u", (SetCell("f", b"q", b"w"),))
    several = m.MutateTabletsRequest(
        (m.TabletMutations(tid, tab, (other,)), m.TabletMutations(tid, "no-such-tablet", (put,)))
    )
    resp = await call(worker.mutate_tablets, TabletService.mutate_tablets, several)
    assert [(e.index, e.code) for e in resp.errors] == [(1, int(ErrorCode.NOT_SERVING))]
    row = await call(
        worker.read_row, TabletService.read_row, m.ReadRowsRequest(tid, tab, keys=(b"r",))
    )
    assert [c.value for c in row.rows[0].cells] == [b"v"]
    points = await call(
        worker.read_points,
        TabletService.read_points,
        m.PointReadsRequest((m.TabletKeys(tid, tab, (b"r", b"s")),)),
    )
    assert points.answers == (row,)
    items = [i async for i in worker.read_rows(m.ReadRowsRequest(tid, tab, keys=(b"r",)))]
    assert isinstance(items[0], TABLET.method(TabletService.read_rows).response_types)
    assert [r.key for i in items for r in i.rows] == [b"r"]
    called.add("read_rows")
    cam = m.CheckAndMutateRequest(tid, tab, b"r", None, (SetCell("f", b"c", b"1"),), ())
    assert (await call(worker.check_and_mutate, TabletService.check_and_mutate, cam)).matched
    rmw = m.ReadModifyWriteRequest(tid, tab, b"r", (AppendValue("f", b"q", b"w"),))
    new = await call(worker.read_modify_write, TabletService.read_modify_write, rmw)
    assert [c.value for c in new.cells] == [b"vw"]
    await call(
        worker.sample_row_keys, TabletService.sample_row_keys, m.SampleRowKeysRequest(tid, tab)
    )
    await call(
        worker.compact_tablet, TabletService.compact_tablet, m.CompactTabletRequest(tid, tab)
    )
    await call(worker.update_schema, TabletService.update_schema, m.UpdateSchemaRequest("svc"))
    # A major compaction run elsewhere (master/remote_compaction.py), adopted by the worker.
    prepared = await prepare(db.master.catalog, db.store, tid, tab, clock=db.master.clock)
    adopt = prepared.request()
    await call(worker.adopt_compaction, TabletService.adopt_compaction, adopt)
    assert (await db.master.catalog.get_tablet(tid, tab)).sstables == {
        g: (ref,) for g, ref in prepared.outputs.items()
    }
    await call(worker.unload_tablet, TabletService.unload_tablet, m.UnloadTabletRequest(tid, tab))
    with pytest.raises(NotServing):
        await worker.read_row(m.ReadRowsRequest(tid, tab, keys=(b"r",)))
    await call(worker.load_tablet, TabletService.load_tablet, m.LoadTabletRequest(tid, tab))
    again = await worker.read_row(m.ReadRowsRequest(tid, tab, keys=(b"r",)))
    assert isinstance(again, m.RowBatch)  # served again, with everything written before
    await call(worker.unload_tablet, TabletService.unload_tablet, m.UnloadTabletRequest(tid, tab))
    end_row = (await db.master.catalog.get_tablet(tid, tab)).end_row
    at = m.LoadTabletAtRequest(tid, tab, end_row)
    await call(worker.load_tablet_at, TabletService.load_tablet_at, at)
    again = await worker.read_row(m.ReadRowsRequest(tid, tab, keys=(b"r",)))
    assert isinstance(again, m.RowBatch)
    assert {(c.qualifier, c.value) for c in again.rows[0].cells} >= {(b"c", b"1"), (b"q", b"vw")}
    await call(
        master.compact_table, MasterService.compact_table, m.CompactTableRequest("svc", True)
    )
    hold = m.SnapshotHoldRequest("svc-cut", tid, (tab,), 10.0)
    await call(worker.snapshot_hold, TabletService.snapshot_hold, hold)
    cut = await call(
        worker.snapshot_write, TabletService.snapshot_write, m.SnapshotWriteRequest("svc-cut")
    )
    assert cut.held and [t.tablet_id for t in cut.tablets] == [tab]
    snap = await call(
        master.create_snapshot, MasterService.create_snapshot, m.CreateSnapshotRequest("svc")
    )
    listed_snaps = await call(
        master.list_snapshots, MasterService.list_snapshots, m.ListSnapshotsRequest("svc")
    )
    assert [s.manifest_json for s in listed_snaps.snapshots] == [snap.manifest_json]
    snapshot_id = SnapshotManifest.from_bytes(snap.manifest_json).snapshot_id
    await call(
        master.delete_snapshot,
        MasterService.delete_snapshot,
        m.DeleteSnapshotRequest(snapshot_id),
    )
    backup = await call(
        master.create_backup, MasterService.create_backup, m.CreateBackupRequest("svc", "bk")
    )
    listed_backups = await call(
        master.list_backups, MasterService.list_backups, m.ListBackupsRequest("svc")
    )
    assert [b.manifest_json for b in listed_backups.backups] == [backup.manifest_json]
    got_backup = await call(master.get_backup, MasterService.get_backup, m.BackupIdRequest("bk"))
    assert got_backup == backup
    later = m.UpdateBackupRequest("bk", db.master.clock.time() + 3600)
    updated = await call(master.update_backup, MasterService.update_backup, later)
    restored = await call(
        master.restore_table, MasterService.restore_table, m.RestoreTableRequest("bk", "svc-r")
    )
    assert restored.info().schema.name == "svc-r"
    # With what a copy verified: the optional third field crosses the wire.
    now = BackupManifest.from_bytes(updated.manifest_json)
    sizes = {r.key: r.size for t in now.tablets for refs in t.sstables.values() for r in refs}
    verified = m.CopiedBackup(now.version, sizes, dict(now.checksums))
    copied = m.RestoreTableRequest("bk", "svc-r2", verified)
    again = await call(master.restore_copied, MasterService.restore_copied, copied)
    assert again.info().schema.name == "svc-r2"
    cloned = await call(
        master.clone_table, MasterService.clone_table, m.CloneTableRequest("svc", "svc-c")
    )
    assert cloned.info().schema.name == "svc-c"
    windowed = await call(
        master.set_history, MasterService.set_history, m.SetHistoryRequest("svc-c", 7200.0)
    )
    assert windowed.info().schema.history == 7200.0
    kept = await call(
        master.set_changes, MasterService.set_changes, m.SetChangesRequest("svc-c", 3600.0)
    )
    assert kept.info().schema.changes == 3600.0
    follows = m.SetReplicaRequest("svc-c", "etcd://elsewhere/ns", "svc")
    made = await call(master.set_replica, MasterService.set_replica, follows)
    assert made.info().schema.replica_of is not None
    assert made.info().schema.replica_of.source == "etcd://elsewhere/ns"
    primary = await call(
        master.set_replica, MasterService.set_replica, m.SetReplicaRequest("svc-c", None)
    )
    assert primary.info().schema.replica_of is None
    set_default = m.HistoryDefaultRequest(change=True, seconds=3600.0)
    assert (await call(master.history_default, MasterService.history_default, set_default)) == (
        m.HistoryDefaultMessage(3600.0)
    )
    read_default = m.HistoryDefaultRequest()
    assert (
        await call(master.history_default, MasterService.history_default, read_default)
    ).seconds == 3600.0
    await call(master.delete_backup, MasterService.delete_backup, m.BackupIdRequest("bk"))
    # The job writes into its staging area of the database's (in-memory) store.
    area = layout.staging_prefix("anonymous", bulk_source)
    cells = {"row": [b"b1"], "family": ["f"], "qualifier": [b"q"], "value": [b"bulk"]}
    keys = await awrite_sstables(cells, "", store=_Under(db.store, area), now_micros=1_000_000)  # type: ignore[arg-type]
    load = m.BulkLoadRequest("svc", bulk_source)
    loaded = await call(master.bulk_load, MasterService.bulk_load, load)
    assert (loaded.tablets, loaded.cells) == (1, 1)
    # The master names the files to a worker by their keys in the database's own store.
    one = m.BulkLoadTabletRequest(tid, tab, db.store.url, tuple(area + k for k in keys))
    assert (await call(worker.bulk_load_tablet, TabletService.bulk_load_tablet, one)).cells == 1
    await call(master.delete_table, MasterService.delete_table, m.TableNameRequest("svc"))
    return called


class _Under:
    """Writes into ``store`` under ``prefix`` (a job writing to its staging area)."""

    def __init__(self, store: ObjectStore, prefix: str) -> None:
        self.store, self.prefix, self.url = store, prefix, store.url

    async def create(self, key: str, data: bytes) -> None:
        await self.store.create(self.prefix + key, data)


def _create() -> m.CreateTableRequest:
    return m.CreateTableRequest.of(SCHEMA)


def _all_names() -> set[str]:
    return {method.name for service in (TABLET, MASTER) for method in service.methods}


async def test_every_method_is_served_in_process() -> None:
    db = await Database.open("memory://services-inprocess")
    transport = InProcessTransport()
    transport.register("w", TABLET.handlers(db.worker.services))
    transport.register("m", MASTER.handlers(db.master))
    try:
        called = await _exercise(TABLET.client(transport, "w"), MASTER.client(transport, "m"), db)
        assert called == _all_names()
    finally:
        await db.close()


async def test_every_method_is_served_over_tcp() -> None:
    register_all()
    db = await Database.open("memory://services-tcp")
    worker = RpcServer(TABLET.handlers(db.worker.services))
    master = RpcServer(MASTER.handlers(db.master))
    transport = TcpTransport(timeout=30.0)
    await worker.start()
    await master.start()
    try:
        called = await _exercise(
            TABLET.client(transport, worker.address),
            MASTER.client(transport, master.address),
            db,
            "services-bulk-tcp",
        )
        assert called == _all_names()
        assert worker.methods == sorted(method.name for method in TABLET.methods)
        assert master.methods == sorted(method.name for method in MASTER.methods)
    finally:
        await transport.close()
        await worker.close()
        await master.close()
        await db.close()


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (
            lambda t, b: m.MutateRowsRequest(t, b, (RowMutation(1, (SetCell("f", b"q", b"v"),)),)),
            "row",
        ),  # type: ignore[arg-type]
        (lambda t, b: m.MutateRowsRequest(t, b, 5), "entries"),  # type: ignore[arg-type]
        (lambda t, b: m.MutateRowsRequest(t, b, (b"not a mutation",)), "entries"),  # type: ignore[arg-type]
        (lambda t, b: m.MutateRowsRequest(t, b, (RowMutation(b"r", 7),)), "mutations"),  # type: ignore[arg-type]
        (
            lambda t, b: m.MutateRowsRequest(
                t, b, (RowMutation(b"r", (SetCell("f", b"q", b"v", "5"),)),)
            ),
            "timestamp",
        ),  # type: ignore[arg-type]
        (
            lambda t, b: m.MutateRowsRequest(t, b, (RowMutation(b"r", (SetCell(0, b"q", b"v"),)),)),
            "family",
        ),  # type: ignore[arg-type]
        (lambda t, b: m.MutateRowsRequest(t, 3, ()), "tablet_id"),  # type: ignore[arg-type]
        (lambda t, b: m.ReadRowsRequest(t, b, keys=(1, 2)), "keys"),  # type: ignore[arg-type]
        (lambda t, b: m.PointReadsRequest((m.TabletKeys(t, b, (None,)),)), "keys"),  # type: ignore[arg-type]
        (lambda t, b: m.LoadTabletRequest(t, None), "tablet_id"),  # type: ignore[arg-type]
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
async def test_a_request_whose_fields_are_of_the_wrong_type_is_refused_by_name(
    make: Callable[[str, str], Any], field: str, request: pytest.FixtureRequest
) -> None:
    """A peer's request is checked against its fields' annotations as it is decoded: before,
    a row key that was a number or a mutation list that was not a list reached the tablet and
    failed inside it (an internal error, or a wrong value stored); now the caller gets an
    InvalidArgument naming the field, and the worker goes on serving."""
    register_all()
    db = await Database.open(f"memory://services-malformed-{request.node.callspec.id}")
    server = RpcServer(TABLET.handlers(db.worker.services))
    transport = TcpTransport(timeout=30.0)
    await server.start()
    try:
        info = (await db.master.create_table(_create())).info()
        status = await db.worker.services.server_status(m.ServerStatusRequest())
        (tablet,) = [t.tablet_id for t in status.tablets if t.table_id == info.table_id]
        worker = TABLET.client(transport, server.address)
        bad = make(info.table_id, tablet)
        call = worker.read_points if isinstance(bad, m.PointReadsRequest) else None
        if isinstance(bad, m.MutateRowsRequest):
            call = worker.mutate_rows
        elif isinstance(bad, m.ReadRowsRequest):
            call = worker.read_row
        elif isinstance(bad, m.LoadTabletRequest):
            call = worker.load_tablet
        assert call is not None
        with pytest.raises(InvalidArgument, match=f"field {field!r} must be"):
            await call(bad)
        put = RowMutation(b"r", (SetCell("f", b"q", b"v"),))
        ok = await worker.mutate_rows(m.MutateRowsRequest(info.table_id, tablet, (put,)))
        assert ok.errors == ()
    finally:
        await transport.close()
        await server.close()
        await db.close()


async def test_a_master_that_does_not_lead_refuses_admin_calls() -> None:
    db = await Database.open("memory://services-standby")
    try:
        db.master.leading = False
        with pytest.raises(NotServing, match="not the elected master"):
            await db.master.list_tables(m.ListTablesRequest())
    finally:
        db.master.leading = True
        await db.close()


# -- the Transport contract, in process ------------------------------------------------------


class Slow:
    """A service whose handlers wait until released."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def server_status(self, req: m.ServerStatusRequest) -> m.ServerStatusResponse:
        await self.release.wait()
        return m.ServerStatusResponse("w", "here", ())

    async def read_rows(self, req: m.ReadRowsRequest) -> AsyncIterator[m.RowBatch]:
        yield m.RowBatch(())
        await self.release.wait()
        yield m.RowBatch(())


async def test_in_process_timeout_is_indeterminate_and_nothing_served_is_not_serving() -> None:
    transport = InProcessTransport()
    slow = Slow()
    transport.register(
        "w",
        {"server_status": slow.server_status, "read_rows": slow.read_rows},
    )
    stub = TABLET.client(transport, "w", timeout=0.1)
    with pytest.raises(Indeterminate, match=r"did not answer within 0\.1 s"):
        await stub.server_status(m.ServerStatusRequest())
    items = stub.read_rows(m.ReadRowsRequest("t", "t0"))
    assert await anext(items) == m.RowBatch(())
    with pytest.raises(Indeterminate, match=r"no item within 0\.1 s"):
        await anext(items)
    with pytest.raises(Unimplemented, match=r"no method <TabletService\.load_tablet>"):
        await stub.load_tablet(m.LoadTabletRequest("t", "t0"))
    with pytest.raises(NotServing, match="nothing is served at x"):
        await TABLET.client(transport, "x").server_status(m.ServerStatusRequest())


def _transport_contract(t: Transport) -> Transport:
    return t  # mypy: both transports are Transports


def test_both_transports_are_transports() -> None:
    _transport_contract(InProcessTransport())
    _transport_contract(TcpTransport())
    assert isinstance(TABLET, Service)


async def test_a_master_without_restore_copied_refuses_it_before_running_anything() -> None:
    """A master of protocol version 8 built before ``restore_copied`` has no such method: over
    TCP the call fails Unimplemented at the method lookup, before its request is read or run
    (the client then sends ``restore_table``: client/backup_admin.py)."""
    register_all()
    db = await Database.open("memory://services-no-restore-copied")
    handlers = dict(MASTER.handlers(db.master))
    name = MASTER.method(MasterService.restore_copied).name
    del handlers[name]
    master = RpcServer(handlers)
    transport = TcpTransport(timeout=30.0)
    await master.start()
    try:
        stub = MASTER.client(transport, master.address)
        copied = m.CopiedBackup(1, {}, {})
        with pytest.raises(Unimplemented, match=f"no RPC method '{name}'"):
            await stub.restore_copied(m.RestoreTableRequest("b", "t", copied))
        assert await db.list_tables() == []
    finally:
        await transport.close()
        await master.close()
        await db.close()
