"""Snapshot manifests: what a batch job reads instead of METADATA (§8; docs/architecture/design.md
§1, §3).

The manifest is a format, like a tablet record (record.py), so it lives here where every
layer that names snapshots (client, master, batch) can import it.

A snapshot is a consistent cut of one table as of one instant: every write acknowledged
before it is in, none that started after it (master/snapshots.py takes the cut). Its manifest
is one JSON object, created once (create-only PUT) at ``snapshots/<table-id>/<snapshot-id>.json``
and never rewritten; deleting it (or its TTL passing) releases what it pins::

    {
      "format": "tabletstore.snapshot/1",
      "snapshot_id": "s20261123T172130-3f2a...",      globally unique; sorts by time
      "table": "webtable", "table_id": "webtable-8c1e...",
      "created_at": 1795000000.25,                     seconds since the epoch (the cut)
      "expires_at": 1795086400.25 | null,              GC deletes it after this (TTL)
      "schema": {...},                                  TableSchema JSON at the cut
      "tablets": [                                      in row order, covering all rows
        {"tablet_id": "t00000", "start_row": b64, "end_row": b64 | null,
         "cut_seq": 1234,                               cells with a larger seq are after the cut
         "sstables": {"<locality group>": [SSTableRef JSON, newest first]}}
      ]
    }

Reading a tablet of the snapshot is the tablet's own read (engine/iterators.py): the merge
of its SSTables, then the visibility rules with ``snapshot_seq=cut_seq``, GC rules of the
schema evaluated at ``created_at``, rows clipped to ``[start_row, end_row)``. The SSTables a
manifest names may be shared with a sibling tablet after a split: clipping makes that right.

GC (master/gc_plan.py) keeps every SSTable a manifest names while the manifest exists and
has not expired.
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass
from typing import Any

from tabletstore.clock import wall_time
from tabletstore.data.schema import TableSchema
from tabletstore.errors import Corruption, InvalidArgument, NotFound
from tabletstore.metadata.record import SSTableRef
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore, object_url

__all__ = [
    "FORMAT",
    "SnapshotManifest",
    "TabletSnapshot",
    "check_tiling",
    "delete_manifest",
    "find_manifest",
    "list_manifests",
    "new_snapshot_id",
    "read_manifest",
    "write_manifest",
]

FORMAT = "tabletstore.snapshot/1"


def _b64(b: bytes | None) -> str | None:
    return None if b is None else base64.b64encode(b).decode("ascii")


def _unb64(s: str | None) -> bytes | None:
    return None if s is None else base64.b64decode(s, validate=True)


def new_snapshot_id(now: float | None = None) -> str:
    """A fresh snapshot id: UTC time of the cut (so ids sort by time) and 48 random bits."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(wall_time() if now is None else now))
    return f"s{stamp}-{secrets.token_hex(6)}"


@dataclass(frozen=True, slots=True)
class TabletSnapshot:
    """One tablet of a snapshot: its row range, its cut and the SSTables holding it."""

    tablet_id: str
    start_row: bytes
    end_row: bytes | None
    #: The largest seq of a cell before the cut: larger ones were written after it.
    cut_seq: int
    #: Per locality group, newest first.
    sstables: dict[str, tuple[SSTableRef, ...]]

    @property
    def size(self) -> int:
        return sum(r.size for refs in self.sstables.values() for r in refs)

    def to_json(self) -> dict[str, Any]:
        return {
            "tablet_id": self.tablet_id,
            "start_row": _b64(self.start_row),
            "end_row": _b64(self.end_row),
            "cut_seq": self.cut_seq,
            "sstables": {g: [r.to_json() for r in refs] for g, refs in self.sstables.items()},
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TabletSnapshot:
        return cls(
            tablet_id=str(d["tablet_id"]),
            start_row=_unb64(d["start_row"]) or b"",
            end_row=_unb64(d["end_row"]),
            cut_seq=int(d["cut_seq"]),
            sstables={
                str(g): tuple(SSTableRef.from_json(r) for r in refs)
                for g, refs in d["sstables"].items()
            },
        )


@dataclass(frozen=True, slots=True)
class SnapshotManifest:
    """A snapshot manifest (see the module docstring for its JSON)."""

    snapshot_id: str
    table: str
    table_id: str
    created_at: float
    expires_at: float | None
    schema: TableSchema
    tablets: tuple[TabletSnapshot, ...]

    @property
    def key(self) -> str:
        return layout.snapshot_key(self.table_id, self.snapshot_id)

    @property
    def cells(self) -> int:
        """Cells in the snapshot's SSTables (before deletions and versions are applied)."""
        return sum(r.cells for t in self.tablets for refs in t.sstables.values() for r in refs)

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at

    def sstable_keys(self) -> list[str]:
        return [r.key for t in self.tablets for refs in t.sstables.values() for r in refs]

    def to_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "snapshot_id": self.snapshot_id,
            "table": self.table,
            "table_id": self.table_id,
            "created_at": self.created_at,
            "expires_at": self.expires_at,
            "schema": self.schema.model_dump(mode="json"),
            "tablets": [t.to_json() for t in self.tablets],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, name: str = "<manifest>") -> SnapshotManifest:
        """Parse a manifest; Corruption naming ``name`` if it is not one."""
        try:
            d = json.loads(data)
            if d.get("format") != FORMAT:
                raise ValueError(f"format is {d.get('format')!r}, expected {FORMAT!r}")
            tablets = tuple(TabletSnapshot.from_json(t) for t in d["tablets"])
            expires = d["expires_at"]
            manifest = cls(
                snapshot_id=str(d["snapshot_id"]),
                table=str(d["table"]),
                table_id=str(d["table_id"]),
                created_at=float(d["created_at"]),
                expires_at=None if expires is None else float(expires),
                schema=TableSchema.model_validate(d["schema"]),
                tablets=tablets,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Corruption(f"snapshot manifest {name} is malformed: {exc}") from exc
        _check_covering(manifest, name)
        return manifest


def _check_covering(m: SnapshotManifest, name: str) -> None:
    check_tiling(m.tablets, f"snapshot manifest {name}")


def check_tiling(tablets: tuple[TabletSnapshot, ...], what: str) -> None:
    """Corruption naming ``what`` unless ``tablets`` tile the row space in order:
    ``[b"", ...) ... [..., None)`` (a snapshot's, a backup's)."""
    start = b""
    for i, t in enumerate(tablets):
        if t.start_row != start or (t.end_row is None) != (i == len(tablets) - 1):
            raise Corruption(
                f"{what}: tablet {t.tablet_id} does not continue the row ranges of the "
                "tablets before it"
            )
        start = t.end_row or b""
    if not tablets:
        raise Corruption(f"{what} lists no tablets")


async def write_manifest(store: ObjectStore, manifest: SnapshotManifest) -> str:
    """Create the manifest object (create-only); returns its key."""
    key = manifest.key
    await store.create(key, manifest.to_bytes())
    return key


async def read_manifest(store: ObjectStore, key: str) -> SnapshotManifest:
    data = await store.get(key)
    if data is None:
        raise NotFound(f"snapshot manifest {object_url(store.url, key)} does not exist")
    return SnapshotManifest.from_bytes(data, name=object_url(store.url, key))


async def list_manifests(store: ObjectStore, table_id: str | None = None) -> list[SnapshotManifest]:
    """Every snapshot's manifest (of one table, with ``table_id``), oldest first. A manifest
    that cannot be parsed is an error naming it: a batch job must not skip a snapshot."""
    keys = [
        info.key
        async for info in store.list(layout.snapshot_prefix(table_id))
        if info.key.endswith(".json")
    ]
    out = [await read_manifest(store, k) for k in keys]
    return sorted(out, key=lambda m: (m.created_at, m.snapshot_id))


async def find_manifest(
    store: ObjectStore, snapshot_id: str, *, where: str | None = None
) -> SnapshotManifest:
    """The manifest of ``snapshot_id`` (ids are unique across tables). NotFound names the
    store searched: ``where`` when given (e.g. the store and the database it belongs to),
    else the store's URL."""
    if not snapshot_id or "/" in snapshot_id:
        raise InvalidArgument(f"{snapshot_id!r} is not a snapshot id")
    suffix = f"/{snapshot_id}.json"
    async for info in store.list(layout.SNAPSHOTS):
        if info.key.endswith(suffix):
            return await read_manifest(store, info.key)
    raise NotFound(f"no snapshot {snapshot_id!r} in {where or store.url}")


async def delete_manifest(store: ObjectStore, snapshot_id: str) -> SnapshotManifest:
    """Delete a snapshot's manifest; its SSTables become garbage (if nothing else holds
    them) for the next GC round. Returns what was deleted."""
    manifest = await find_manifest(store, snapshot_id)
    await store.delete(manifest.key)
    return manifest
