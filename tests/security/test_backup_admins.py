"""Backups belong to their table's admins, on a master with auth on (the guard around the
master's handlers, run in a proven principal's scope as the RPC layer would).

Mallory, who does not administer ``t``, may neither back it up, clone it, restore, describe,
re-date nor delete its backup, and does not see it listed; after the table is deleted the
backup still answers only to the admins its manifest recorded. A restored table belongs to
the restorer as well as to the source's admins.

History windows, which decide what backups of any instant exist, likewise: a table's window
is changed only by its admins (``set_history``, and a change retention by ``set_changes``); the database's default window, which governs
every table without its own, only by the cluster's master identity; anyone authenticated may
read the default. A refusal changes nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tabletstore.data.schema import TableSchema
from tabletstore.embedded import Database
from tabletstore.errors import PermissionDenied
from tabletstore.master.master_service_guard import guard
from tabletstore.rpc import messages as m
from tabletstore.rpc.auth import principal_scope
from tabletstore.rpc.services import MASTER
from tabletstore.security.principal import Principal

ALICE = Principal("alice", "client")
MALLORY = Principal("mallory", "client")
MASTER_ID = Principal("master", "master")


Call = Callable[[Principal, str, object], Awaitable[object]]


def _caller(db: Database) -> Call:
    """Calls of the master's handlers behind the guard, as ``who``."""
    handlers = guard(db.master, MASTER.handlers(db.master))

    async def call(who: Principal, method: str, req: object) -> object:
        with principal_scope(who):
            return await handlers[method](req)

    return call


async def test_backups_answer_only_to_their_tables_admins(tmp_path: Path) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        call = _caller(db)
        schema = TableSchema(name="t", families={}, admins=["alice"])
        await call(ALICE, "create_table", m.CreateTableRequest.of(schema))
        await call(ALICE, "create_backup", m.CreateBackupRequest("t", "b1"))
        for method, req in [
            ("create_backup", m.CreateBackupRequest("t", "b2")),
            ("clone_table", m.CloneTableRequest("t", "mine")),
            ("get_backup", m.BackupIdRequest("b1")),
            ("update_backup", m.UpdateBackupRequest("b1", None)),
            ("restore_table", m.RestoreTableRequest("b1", "mine")),
            ("delete_backup", m.BackupIdRequest("b1")),
        ]:
            with pytest.raises(PermissionDenied, match="mallory may not"):
                await call(MALLORY, method, req)
        listed = await call(MALLORY, "list_backups", m.ListBackupsRequest(None))
        assert isinstance(listed, m.ListBackupsResponse) and listed.backups == ()
        await call(ALICE, "delete_table", m.TableNameRequest("t"))
        with pytest.raises(PermissionDenied):
            await call(MALLORY, "restore_table", m.RestoreTableRequest("b1", "mine"))
        restored = await call(ALICE, "restore_table", m.RestoreTableRequest("b1", "r"))
        assert isinstance(restored, m.TableInfoMessage)
        assert restored.info().schema.admins == ["alice"]
        assert await db.list_tables() == ["r"]
    finally:
        await db.close()


async def test_only_admins_change_history_windows(tmp_path: Path) -> None:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        call = _caller(db)
        schema = TableSchema(name="t", families={}, admins=["alice"])
        await call(ALICE, "create_table", m.CreateTableRequest.of(schema))
        with pytest.raises(PermissionDenied, match="mallory may not set_history"):
            await call(MALLORY, "set_history", m.SetHistoryRequest("t", 3600.0))
        assert (await db.describe_table("t")).history is None
        done = await call(ALICE, "set_history", m.SetHistoryRequest("t", 3600.0))
        assert isinstance(done, m.TableInfoMessage) and done.info().schema.history == 3600.0
        with pytest.raises(PermissionDenied, match="mallory may not set_changes"):
            await call(MALLORY, "set_changes", m.SetChangesRequest("t", 3600.0))
        assert (await db.describe_table("t")).changes is None
        kept = await call(ALICE, "set_changes", m.SetChangesRequest("t", 3600.0))
        assert isinstance(kept, m.TableInfoMessage) and kept.info().schema.changes == 3600.0
        await db.set_changes("t", None)  # the client's call, through the same RPC
        assert (await db.describe_table("t")).changes is None
        # Making a table a replica decides who may write it: its admins only.
        with pytest.raises(PermissionDenied, match="mallory may not set_replica"):
            await call(MALLORY, "set_replica", m.SetReplicaRequest("t", "etcd://x/ns", "t"))
        assert (await db.describe_table("t")).replica_of is None
        change = m.HistoryDefaultRequest(change=True, seconds=86400.0)
        for who in (ALICE, MALLORY):
            with pytest.raises(PermissionDenied, match="default history window"):
                await call(who, "history_default", change)
        read = await call(MALLORY, "history_default", m.HistoryDefaultRequest())
        assert read == m.HistoryDefaultMessage(None)
        assert await call(MASTER_ID, "history_default", change) == m.HistoryDefaultMessage(86400.0)
        assert await db.history_default() == 86400.0
    finally:
        await db.close()
