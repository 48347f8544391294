"""Backup manifests: a table as of one cut, kept for restores (§5.4's immutable SSTables make
a backup a list of names; docs/architecture/gc.md, docs/operations/backups.md).

A backup is the snapshot machinery's cut (master/snapshots.py) kept for an operator rather than
a batch job: every SSTable it names holds only cells written before the cut (the tablet's
SSTables at the cut, whose seqs are all at or below it, plus the memtables' cells at or below
it written out for the backup), so a restore needs no sequence-number filter. Its manifest is
versioned, not overwritten: version ``n`` lives at ``backups/<backup-id>/<n:020d>.json``
(``storage_s3.layout.backup_key``), a change creates version ``n + 1`` (a create-only PUT: two
writers racing, one loses) and then deletes the older ones, and the newest version is the
manifest::

    {
      "format": "tabletstore.backup/1",                 a newer format is refused, never guessed
      "backup_id": "b20261128T120000-3f2a...",          unique in its location
      "version": 1,                                     the number in the object's key
      "state": "creating" | "ready",                    only a ready backup restores
      "table": "webtable", "table_id": "webtable-8c1e...",
      "source_url": "s3://bucket/db",                   the database it was taken from
      "created_at": 1795000000.25,                      the cut (seconds since the epoch)
      "expires_at": 1795604800.25 | null,               GC deletes it after this; null: never
      "size_bytes": 123456,                             bytes of the SSTables it names
      "copied_from": "s3://bucket/db" | null,           where a copy's source backup lived
      "checksums": {"<sstable key>": "sha256:..."},     for bytes that passed through a copy
      "schema": {...},                                  TableSchema JSON at the cut
      "tablets": [... as a snapshot's: tablet_id, start_row, end_row, cut_seq,
                  sstables per locality group, newest first ...]
    }

Where it lives. In a database's bucket the SSTables it names are that database's own objects
(``tables/<table-id>/...``), pinned by the manifest: GC keeps every SSTable a manifest names
while the manifest exists and has not expired, whether or not the table still exists
(master/gc_plan.py). In a backup location outside any database (``s3://other/prefix``) the
SSTables are copies kept under the same ``tables/...`` keys beside the manifest
(metadata/backup_copy.py), so the location restores on its own.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import time
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from tabletstore.clock import wall_time
from tabletstore.data.schema import TableSchema
from tabletstore.errors import (
    AlreadyExists,
    Corruption,
    InvalidArgument,
    NotFound,
    PreconditionFailed,
    TabletStoreError,
    Unimplemented,
)
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot, check_tiling
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore, object_url

__all__ = [
    "COPIED_VERSION",
    "FORMAT",
    "BackupManifest",
    "BackupState",
    "check_backup_id",
    "delete_backup_versions",
    "list_backups",
    "new_backup_id",
    "read_backup",
    "write_backup",
    "write_next_version",
]

log = logging.getLogger(__name__)

_FORMAT_NAME = "tabletstore.backup"
_FORMAT_VERSION = 1
FORMAT = f"{_FORMAT_NAME}/{_FORMAT_VERSION}"
#: What a backup id may be (Cloud Bigtable's backup ids, longer): it is a key component too.
_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,99}")


#: The version of a copied backup's ready manifest (the copy's creating version is 0; a backup
#: taken in its table's bucket is version 0, ready): what a restore from another location
#: reads, first in that location, then in the database's bucket.
COPIED_VERSION = 1


class BackupState(StrEnum):
    """``creating`` until every object it names is in its location; then ``ready``."""

    CREATING = "creating"
    READY = "ready"


def new_backup_id(now: float | None = None) -> str:
    """A fresh backup id: UTC time of the cut (so ids sort by time) and 48 random bits."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall_time() if now is None else now))
    return f"b{stamp}-{secrets.token_hex(6)}"


def check_backup_id(backup_id: str) -> str:
    """``backup_id`` if it can name a backup; else InvalidArgument saying what may."""
    if not isinstance(backup_id, str) or not _ID.fullmatch(backup_id):
        raise InvalidArgument(
            f"{backup_id!r} is not a backup id: 1-100 letters, digits, '_', '-' or '.', "
            "not starting with '-' or '.'"
        )
    return backup_id


@dataclass(frozen=True, slots=True)
class BackupManifest:
    """A backup manifest (see the module docstring for its JSON). Immutable: a change is a
    new version (:meth:`changed`)."""

    backup_id: str
    table: str
    table_id: str
    source_url: str
    created_at: float
    expires_at: float | None
    state: BackupState
    schema: TableSchema
    tablets: tuple[TabletSnapshot, ...]
    version: int = 0
    copied_from: str | None = None
    checksums: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of_cut(
        cls,
        cut: SnapshotManifest,
        *,
        backup_id: str,
        source_url: str,
        expires_at: float | None,
    ) -> BackupManifest:
        """The backup of a table's cut (master/snapshots.py ``cut_table``), ready."""
        return cls(
            backup_id=check_backup_id(backup_id),
            table=cut.table,
            table_id=cut.table_id,
            source_url=source_url,
            created_at=cut.created_at,
            expires_at=expires_at,
            state=BackupState.READY,
            schema=cut.schema,
            tablets=cut.tablets,
        )

    @property
    def key(self) -> str:
        return layout.backup_key(self.backup_id, self.version)

    @property
    def size_bytes(self) -> int:
        return sum(t.size for t in self.tablets)

    @property
    def cells(self) -> int:
        return sum(r.cells for t in self.tablets for refs in t.sstables.values() for r in refs)

    def sstable_keys(self) -> list[str]:
        """Every SSTable key it names, each once, in tablet order."""
        keys = (r.key for t in self.tablets for refs in t.sstables.values() for r in refs)
        return list(dict.fromkeys(keys))

    def split_keys(self) -> list[bytes]:
        """The table's split points at the cut (each tablet's end row but the last's)."""
        return [t.end_row for t in self.tablets if t.end_row is not None]

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def changed(self, **changes: Any) -> BackupManifest:
        """The next version with ``changes`` (fields of this class)."""
        return replace(self, version=self.version + 1, **changes)

    def check_restorable(self, now: float, where: str) -> None:
        """InvalidArgument unless this backup can be restored now (ready, not expired)."""
        if self.state is not BackupState.READY:
            raise InvalidArgument(
                f"backup {self.backup_id!r} in {where} is incomplete (state {self.state}): "
                "its creation or copy has not finished; it cannot be restored"
            )
        if self.expired(now):
            when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.expires_at or 0.0))
            raise InvalidArgument(
                f"backup {self.backup_id!r} in {where} expired at {when}; it cannot be "
                "restored (garbage collection may already have freed its objects)"
            )

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "backup_id": self.backup_id,
            "version": self.version,
            "state": str(self.state),
            "table": self.table,
            "table_id": self.table_id,
            "source_url": self.source_url,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "size_bytes": self.size_bytes,
            "copied_from": self.copied_from,
            "checksums": dict(sorted(self.checksums.items())),
            "schema": self.schema.model_dump(mode="json"),
            "tablets": [t.to_json() for t in self.tablets],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, name: str = "<backup manifest>") -> BackupManifest:
        """Parse a manifest. Unimplemented for a newer format (upgrade to read it), Corruption
        naming ``name`` for anything else that is not a backup manifest."""
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            _check_format(d.get("format"), name)
            expires = d["expires_at"]
            manifest = cls(
                backup_id=str(d["backup_id"]),
                table=str(d["table"]),
                table_id=str(d["table_id"]),
                source_url=str(d["source_url"]),
                created_at=float(d["created_at"]),
                expires_at=None if expires is None else float(expires),
                state=BackupState(d["state"]),
                schema=TableSchema.model_validate(d["schema"]),
                tablets=tuple(TabletSnapshot.from_json(t) for t in d["tablets"]),
                version=int(d["version"]),
                copied_from=None if d.get("copied_from") is None else str(d["copied_from"]),
                checksums={str(k): str(v) for k, v in d.get("checksums", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Corruption(f"backup manifest {name} is malformed: {exc}") from exc
        check_tiling(manifest.tablets, f"backup manifest {name}")
        return manifest


def _check_format(fmt: object, name: str) -> None:
    """Unimplemented for ``tabletstore.backup/N`` with N newer than this build's."""
    if fmt == FORMAT:
        return
    head, _, number = str(fmt).partition("/")
    if head == _FORMAT_NAME and number.isdigit() and int(number) > _FORMAT_VERSION:
        raise Unimplemented(
            f"backup manifest {name} has format {fmt}, newer than this build reads ({FORMAT}); "
            "upgrade tabletstore to read it (nothing was changed)"
        )
    raise ValueError(f"format is {fmt!r}, expected {FORMAT!r}")


async def _version_keys(store: ObjectStore, backup_id: str) -> list[str]:
    """The keys of every version of ``backup_id``'s manifest, oldest first."""
    prefix = layout.backup_prefix(check_backup_id(backup_id))
    out = []
    async for info in store.list(prefix):
        try:
            layout.parse_backup_key(info.key)
        except InvalidArgument:
            continue  # not a manifest version (nothing else is written there)
        out.append(info.key)
    return out


async def write_backup(
    store: ObjectStore, manifest: BackupManifest, *, listed: bool = False
) -> BackupManifest:
    """Create a new backup's first manifest version; AlreadyExists if the id is taken here.
    ``listed``: the caller has just found no version of the id in ``store`` (one LIST fewer;
    a first version created meanwhile still collides, and a later one makes the copy's next
    version collide)."""
    if not listed and await _version_keys(store, manifest.backup_id):
        raise AlreadyExists(f"backup {manifest.backup_id!r} already exists in {store.url}")
    try:
        await store.create(manifest.key, manifest.to_bytes())
    except PreconditionFailed as exc:
        raise AlreadyExists(f"backup {manifest.backup_id!r} already exists in {store.url}") from exc
    return manifest


async def write_next_version(
    store: ObjectStore,
    manifest: BackupManifest,
    *,
    only: BackupManifest | None = None,
    later: asyncio.TaskGroup | None = None,
) -> BackupManifest:
    """Publish ``manifest`` (a :meth:`BackupManifest.changed` version), then delete the
    versions before it. PreconditionFailed if another writer published that version first.
    ``only``: the one version before it, which the caller created (it is deleted without
    listing them). ``later``: that deletion runs in this task group, and the caller goes on
    as soon as ``manifest`` is published. A version left behind (its deletion failed, or the
    process died first) is harmless: every reader takes the newest version (GC too), and
    the next change of the backup deletes it."""
    try:
        await store.create(manifest.key, manifest.to_bytes())
    except PreconditionFailed as exc:
        raise PreconditionFailed(
            f"backup {manifest.backup_id!r} was changed by someone else meanwhile; try again"
        ) from exc
    if only is not None and later is not None:
        later.create_task(_delete_superseded(store, only.key))
        return manifest
    if only is not None:
        await store.delete(only.key)
        return manifest
    older = [k for k in await _version_keys(store, manifest.backup_id) if k < manifest.key]
    await store.delete_many(older)
    return manifest


async def _delete_superseded(store: ObjectStore, key: str) -> None:
    """Delete the older manifest version ``key``; a failure is logged (it is harmless:
    :func:`write_next_version`)."""
    try:
        await store.delete(key)
    except TabletStoreError as exc:
        log.warning(
            "superseded backup manifest %s not deleted: %s", object_url(store.url, key), exc
        )


async def read_backup(
    store: ObjectStore, backup_id: str, *, guess: int | None = None
) -> BackupManifest:
    """The newest version of ``backup_id``'s manifest in ``store``; NotFound if none.

    ``guess``: the version the caller expects to be the newest (:data:`COPIED_VERSION` for a
    backup copied in), read while the versions are listed instead of after: one round trip
    instead of two when it is the newest. Its bytes are used only if the listing names it
    newest (a version key is created once and never rewritten, so they are what a GET after
    the listing would return); otherwise the newest is read as without a guess."""
    guessed, guessed_key = None, ""
    if guess is None:
        keys = await _version_keys(store, backup_id)
    else:
        guessed_key = layout.backup_key(check_backup_id(backup_id), guess)
        keys, guessed = await asyncio.gather(
            _version_keys(store, backup_id), store.get(guessed_key)
        )
    if guessed is not None and keys and keys[-1] == guessed_key:
        return BackupManifest.from_bytes(guessed, name=object_url(store.url, keys[-1]))
    for key in reversed(keys):
        data = await store.get(key)
        if data is not None:  # a version deleted since the listing: an older one is newest
            return BackupManifest.from_bytes(data, name=object_url(store.url, key))
    raise NotFound(f"no backup {backup_id!r} in {store.url}")


async def list_backups(store: ObjectStore, table: str | None = None) -> list[BackupManifest]:
    """Every backup in ``store`` (of table ``table``, by name), oldest first. A manifest this
    build cannot read is logged and left out: describing it names the problem."""
    ids: list[str] = []
    async for info in store.list(layout.BACKUPS):
        try:
            backup_id = layout.parse_backup_key(info.key).backup_id
        except InvalidArgument:
            continue
        if not ids or ids[-1] != backup_id:
            ids.append(backup_id)
    out = []
    for backup_id in ids:
        try:
            manifest = await read_backup(store, backup_id)
        except (Corruption, Unimplemented, NotFound) as exc:
            log.warning("backup %s in %s is left out of the listing: %s", backup_id, store.url, exc)
            continue
        if table is None or manifest.table == table:
            out.append(manifest)
    return sorted(out, key=lambda m: (m.created_at, m.backup_id))


async def delete_backup_versions(store: ObjectStore, backup_id: str) -> None:
    """Delete every version of ``backup_id``'s manifest (NotFound if it has none). What it
    pinned becomes garbage for GC (in a database's bucket) unless something else names it."""
    keys = await _version_keys(store, backup_id)
    if not keys:
        raise NotFound(f"no backup {backup_id!r} in {store.url}")
    await store.delete_many(keys)
