"""Bulk-load parts: what one tablet's part of a bulk load added, and when it committed, kept for
point-in-time restore (§8's bulk loads; master/pitr_restore.py).

A bulk load adds SSTables to tablets in one METADATA update per tablet (engine/bulk_ingest.py)
and writes no commit log, so a restore that rebuilds a table from a checkpoint plus the log
cannot see a load made after the checkpoint. Each tablet's part is therefore recorded, right
after its update has committed, in ``loads/<table-id>/<part-id>.json``
(``storage_s3.layout.load_part_key``)::

    {
      "format": "tabletstore.load-part/1",        a newer format is refused, never guessed
      "load_id": "...", "table_id": "...", "tablet_id": "...",
      "start_row": b64, "end_row": b64 | null,   the rows of the part (within the tablet's)
      "committed_at": 1795000000.25,             the worker's clock when the update committed
      "cells": 1234,                             cells the part added
      "sstables": {"<group>": [ref, ...]}        the SSTables added, as the record names them
    }

The part's cells are the cells of those SSTables in its rows: their seqs (``seq_base``
included) are fresh seqs of the tablet's worker, so they order against the tablet's other
cells as writes made at the commit would. A restore as of T adds the parts committed at or
before T (and not before the checkpoint it starts from) and no others.

Written after the commit, a part never names SSTables no tablet took. A worker that dies
between the commit and the write leaves that part unrecorded; the restore finds this by
comparing a finished load's cells (its coordinator record, master/bulk_load.py) with its parts'
and refuses rather than rebuild without it. Garbage collection keeps a part, and the SSTables
it names, for as long as the longest history window needs the log (master/gc_plan.py rule 9).
"""

from __future__ import annotations

import base64
import json
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from tabletstore.errors import Corruption, InvalidArgument, Unimplemented
from tabletstore.metadata.record import SSTableRef
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore, object_url

__all__ = ["FORMAT", "LoadPart", "list_load_parts", "write_load_part"]

log = logging.getLogger(__name__)

_FORMAT_NAME = "tabletstore.load-part"
_FORMAT_VERSION = 1
FORMAT = f"{_FORMAT_NAME}/{_FORMAT_VERSION}"


def _b64(v: bytes | None) -> str | None:
    return None if v is None else base64.b64encode(v).decode()


def _unb64(v: str | None) -> bytes | None:
    return None if v is None else base64.b64decode(v)


@dataclass(frozen=True, slots=True)
class LoadPart:
    """One tablet's committed part of a bulk load (module docstring)."""

    load_id: str
    table_id: str
    tablet_id: str
    start_row: bytes
    end_row: bytes | None
    committed_at: float
    cells: int
    sstables: dict[str, tuple[SSTableRef, ...]]

    def keys(self) -> frozenset[str]:
        return frozenset(r.key for refs in self.sstables.values() for r in refs)

    def to_bytes(self) -> bytes:
        doc: dict[str, Any] = {
            "format": FORMAT,
            "load_id": self.load_id,
            "table_id": self.table_id,
            "tablet_id": self.tablet_id,
            "start_row": _b64(self.start_row),
            "end_row": _b64(self.end_row),
            "committed_at": self.committed_at,
            "cells": self.cells,
            "sstables": {g: [r.to_json() for r in refs] for g, refs in self.sstables.items()},
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, *, name: str = "<bulk load part>") -> LoadPart:
        """Parse a part. Unimplemented for a newer format, Corruption naming ``name`` for
        anything else that is not a part."""
        try:
            d = json.loads(data)
            if not isinstance(d, dict):
                raise ValueError("not a JSON object")
            fmt = d.get("format")
            if fmt != FORMAT:
                head, _, number = str(fmt).partition("/")
                if head == _FORMAT_NAME and number.isdigit() and int(number) > _FORMAT_VERSION:
                    raise Unimplemented(
                        f"bulk load part {name} has format {fmt}, newer than this build reads "
                        f"({FORMAT}); upgrade tabletstore to read it"
                    )
                raise ValueError(f"format is {fmt!r}, expected {FORMAT!r}")
            return cls(
                load_id=str(d["load_id"]),
                table_id=str(d["table_id"]),
                tablet_id=str(d["tablet_id"]),
                start_row=_unb64(d["start_row"]) or b"",
                end_row=_unb64(d["end_row"]),
                committed_at=float(d["committed_at"]),
                cells=int(d["cells"]),
                sstables={
                    str(g): tuple(SSTableRef.from_json(r) for r in refs)
                    for g, refs in d["sstables"].items()
                },
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise Corruption(f"bulk load part {name} is malformed: {exc}") from exc


async def write_load_part(store: ObjectStore, part: LoadPart) -> str:
    """Record ``part`` under a fresh key of its table; returns the key."""
    key = layout.load_part_key(part.table_id, uuid.uuid4().hex)
    await store.create(key, part.to_bytes())
    return key


async def list_load_parts(store: ObjectStore, table_id: str) -> list[LoadPart]:
    """Every recorded part of the bulk loads into table ``table_id``, oldest commit first.
    A part that cannot be read raises (a restore never goes on without one)."""
    out: list[LoadPart] = []
    async for info in store.list(layout.load_part_prefix(table_id)):
        try:
            layout.parse_load_part_key(info.key)
        except InvalidArgument:
            continue  # nothing else is written there
        data = await store.get(info.key)
        if data is None:
            continue  # deleted since the listing (garbage collection: out of every window)
        out.append(LoadPart.from_bytes(data, name=object_url(store.url, info.key)))
    return sorted(out, key=lambda p: (p.committed_at, p.load_id, p.tablet_id))
