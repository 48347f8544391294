"""Bulk load, the master's side: a job's SSTables added to a table, once (§8).

The paper's §8 has MapReduce jobs write their output into Bigtable; here a job writes sorted
SSTables (batch/load_files.py) into its staging area of the database's bucket and
``tabletstore bulkload TABLE LOAD-NAME`` hands them to the table.

**Where a load is read from.** Only from ``staging/<caller>/<load-name>/`` of the database's
own bucket (``storage_s3.layout.staging_prefix``; ``<caller>`` is the principal the RPC layer
proved, ``anonymous`` on a cluster without auth), through the store the master already has.
The request names the load (``LOAD-NAME``) or that staging area's full URL
(``layout.staging_url``); any other URL -- another bucket, endpoint or prefix, ``file://``, a
table's own objects, another principal's staging area -- is PermissionDenied naming the
staging area the caller may use, and nothing is fetched. The workers read the files the same
way (``BulkLoadTabletRequest.source_url`` must be their own store's URL, the keys must be
staging keys). The master checks every file first (nothing is committed if one is bad), then asks the worker
serving each tablet (§5.2: whoever serves it now) to add that tablet's part in one METADATA
update (§5.3: the tablet's record names its SSTables). This module makes that safe to repeat
and to resume after a crash of the master or of the client:

* **Load id.** Each load has an id: ``--load-id`` / ``load_id=``, by default a hash of the
  files' contents (batch/load_files.py ``content_load_id``), so running the same load again
  names the same load.
* **The load's record** in the coordinator, ``bulk_loads/<table-id>/<load-id>``
  (:class:`LoadRecord`, JSON): ``loading`` from before the first tablet is touched, ``done``
  once every tablet has its part. A done load loads nothing again: the call returns (0, 0).
* **Per-tablet marks.** The METADATA update that adds a tablet's part also adds a mark
  ``(load id, rows)`` to its record (metadata/record.py ``BulkLoadMark``; split children
  inherit it, a merge keeps both sides'). A worker skips rows its tablet's record marks as
  loaded by that load, checked again under the tablet's lock, so a load interrupted anywhere
  (the master dies between two tablets, a reply is lost, the client gives up) completes when
  run again, and no file's rows reach a tablet twice. The new master after a failover takes
  it from the records alone: nothing of a load lives in a master's memory.

A tablet that split or moved meanwhile refuses its call having committed nothing (its part is
one record update), so its rows are looked up again and loaded into what serves them now.

**Adoption** (batch/load_files.py step 2). While it checks a file, the master copies the bytes
it checked into the database's bucket when the file can be adopted and lies inside one
tablet's rows (``tables/<table-id>/bulk/<group>/<id>.parquet``: bytes the master verified,
in a bucket only the database writes, so no worker checks them again). A tablet whose rows
still to load cover such a file whole adds the copy as it is (``adopt`` of its call); any
other file goes through the cell path. Copies no tablet adopts (a refused load, a tablet
that split meanwhile) are named by no record: garbage collection deletes them after its
grace period; a refused load deletes its copies at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, replace

from tabletstore.batch.load_files import (
    SourceFile,
    content_load_id,
    inspect_sources,
    overlapping,
)
from tabletstore.clock import Clock
from tabletstore.coordination import paths
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import (
    Corruption,
    InvalidArgument,
    NotServing,
    PermissionDenied,
    Unavailable,
    Unreachable,
)
from tabletstore.metadata.catalog import Catalog, TableInfo
from tabletstore.metadata.record import TabletRecord, uncovered
from tabletstore.rpc.messages import BulkLoadTabletRequest, BulkLoadTabletResponse
from tabletstore.rpc.services import TabletService
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore, object_url

__all__ = [
    "ANONYMOUS",
    "DONE",
    "LOADING",
    "LoadRecord",
    "LoadResult",
    "bulk_load",
    "check_load_id",
    "source_prefix",
]

log = logging.getLogger(__name__)

LOADING = "loading"
DONE = "done"
#: The principal a load runs as on a cluster without auth.
ANONYMOUS = "anonymous"
_ATTEMPTS = 5
_LOAD_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")
#: The tablet-id component of the keys of files staged for adoption.
STAGED = "bulk"

#: The addresses of the workers serving these tablets (by tablet id); NotServing if one is not.
Locate = Callable[[list[TabletRecord]], Awaitable[Mapping[str, str]]]


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """A bulk load's record in the coordinator (``bulk_loads/<table-id>/<load-id>``)."""

    load_id: str
    table_id: str
    url: str
    state: str
    started_at: float
    finished_at: float | None = None
    #: Tablets that took cells and cells loaded, over every run of the load.
    tablets: int = 0
    cells: int = 0
    #: A hash of the files' contents (``content_load_id``): a load id names one set of files.
    content: str = ""

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> LoadRecord:
        try:
            rec = cls(**json.loads(data))
        except (TypeError, ValueError) as exc:
            raise Corruption(f"malformed bulk load record: {exc}") from exc
        if rec.state not in (LOADING, DONE):
            raise Corruption(f"bulk load record {rec.load_id!r} has state {rec.state!r}")
        return rec


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one call loaded: (0, 0) when the load had nothing left to load."""

    load_id: str
    tablets: int
    cells: int


def check_load_id(load_id: str) -> str:
    """``load_id`` if it is a valid one (letters, digits, ``.``, ``_``, ``:``, ``-``; at
    most 128 characters), else InvalidArgument naming it."""
    if not _LOAD_ID.fullmatch(load_id):
        raise InvalidArgument(
            f"bad bulk load id {load_id!r}: use 1 to 128 letters, digits, '.', '_', ':' or "
            f"'-', starting with a letter or digit"
        )
    return load_id


def source_prefix(store_url: str, principal: str, source: str) -> str:
    """The staging prefix (a key prefix of the store ``store_url``) that a load of
    ``principal`` named ``source`` reads: ``source`` is a load name or the full URL of
    ``principal``'s staging area for one (module docstring). PermissionDenied for anything
    else, naming what the caller may use."""
    if "://" not in source:
        return layout.staging_prefix(principal, source.rstrip("/"))
    area = layout.staging_url(store_url, principal, "LOAD-NAME")
    base, _, query = source.partition("?")
    store_base, _, store_query = layout.staging_url(store_url, principal, "x").partition("?")
    home = store_base[: -len("x")]
    name = base[len(home) :].rstrip("/") if base.startswith(home) else ""
    if not name or "/" in name or query != store_query:
        raise PermissionDenied(
            f"bulk load reads only the caller's staging area of the database's bucket, "
            f"{area} (or give just LOAD-NAME): {source} is not one"
        )
    return layout.staging_prefix(principal, name)


async def bulk_load(
    *,
    info: TableInfo,
    url: str,
    load_id: str | None,
    catalog: Catalog,
    coordinator: Coordinator,
    worker: Callable[[str], TabletService],
    locate: Locate,
    clock: Clock,
    store: ObjectStore,
    principal: str = ANONYMOUS,
) -> LoadResult:
    """Load the SSTables of load ``url`` (a load name, or the URL of ``principal``'s staging
    area for it: :func:`source_prefix`) into the table as load ``load_id`` (default: a hash
    of their contents), or the part of it not loaded yet (module docstring). ``store``: the
    database's bucket, the only place the files are read from and where adoptable files are
    staged."""
    if load_id is not None:
        check_load_id(load_id)
    prefix = source_prefix(store.url, principal, url)
    staged: list[str] = []
    try:
        return await _bulk_load(
            info, prefix, load_id, catalog, coordinator, worker, locate, clock, store, staged
        )
    except BaseException:
        if staged:
            # Refused (or failed) before any tablet took one: nothing names the copies.
            with contextlib.suppress(Exception):
                await store.delete_many(staged)
        raise


async def _stage_file(
    store: ObjectStore,
    info: TableInfo,
    records: list[TabletRecord],
    staged: list[str],
    file: SourceFile,
    data: bytes,
) -> str:
    """Copy ``data`` (the bytes of ``file`` that passed the checks) into the database's
    bucket for adoption, when the file is adoptable and inside one tablet's rows; its key, or
    "" when it is not staged."""
    if not file.adoptable or not any(_inside(file, r.start_row, r.end_row) for r in records):
        return ""
    key = layout.sstable_key(info.table_id, STAGED, file.groups[0], uuid.uuid4().hex)
    staged.append(key)  # first: a create that fails half-way is deleted too
    await store.create(key, data)
    return key


def _inside(file: SourceFile, start: bytes, end: bytes | None) -> bool:
    return start <= file.first_row and (end is None or file.last_row < end)


async def _bulk_load(
    info: TableInfo,
    prefix: str,
    load_id: str | None,
    catalog: Catalog,
    coordinator: Coordinator,
    worker: Callable[[str], TabletService],
    locate: Locate,
    clock: Clock,
    store: ObjectStore,
    staged: list[str],
) -> LoadResult:
    """:func:`bulk_load` of the files under ``prefix`` of ``store``; appends the keys of the
    files it stages to ``staged``, and clears it once a tablet may have adopted one (from then
    on only GC may delete them)."""
    url = object_url(store.url, prefix)
    records = await catalog.list_tablets(info.table_id)
    stage = functools.partial(_stage_file, store, info, records, staged)
    files: list[SourceFile] = await inspect_sources(store, info.schema, stage, prefix=prefix)
    content = content_load_id(files)
    load_id = load_id or content
    key = paths.bulk_load(info.table_id, load_id)
    kv = await coordinator.get(key)
    record = None if kv is None else LoadRecord.from_bytes(kv.value)
    name = info.schema.name
    if record is not None and record.content and record.content != content:
        # Resuming with other files would mix two outputs; repeating would drop the new one.
        raise InvalidArgument(
            f"bulk load {load_id!r} into {name!r} was of other files (from {record.url}): "
            f"the files under {url} differ; give this load another id"
        )
    if record is not None and record.state == DONE:
        log.info("bulk load %s into %s is done already: nothing to load", load_id, name)
        if staged:
            await store.delete_many(staged)
            staged.clear()
        return LoadResult(load_id, 0, 0)
    if record is None:
        record = LoadRecord(load_id, info.table_id, url, LOADING, clock.time(), content=content)
        await coordinator.put(key, record.to_bytes())
    else:
        log.info("bulk load %s into %s was interrupted: loading what is left", load_id, name)
    staged.clear()  # tablets may adopt them from here on
    tablets, cells = await _load_range(info, store.url, files, load_id, catalog, worker, locate)
    done = replace(
        record,
        state=DONE,
        finished_at=clock.time(),
        tablets=record.tablets + tablets,
        cells=record.cells + cells,
    )
    await coordinator.put(key, done.to_bytes())
    log.info("bulk load %s into %s: %d cells into %d tablets", load_id, name, cells, tablets)
    return LoadResult(load_id, tablets, cells)


#: One tablet's part of a load: (tablet, start, end, source keys, staged keys to adopt).
Job = tuple[TabletRecord, bytes, bytes | None, list[str], list[str]]


def _jobs(
    records: list[TabletRecord],
    pending: list[tuple[bytes, bytes | None]],
    files: list[SourceFile],
    load_id: str,
) -> list[Job]:
    """(tablet, start, end, source keys, staged keys) for each tablet with rows of
    ``pending`` that it has not got from load ``load_id`` yet and that the files have: a
    staged file that rows still to load cover whole is adopted, any other takes the cell
    path."""
    jobs = []
    for lo, hi in pending:
        for rec in records:
            if (hi is not None and rec.start_row >= hi) or (
                rec.end_row is not None and rec.end_row <= lo
            ):
                continue
            a = max(lo, rec.start_row)
            b = hi if rec.end_row is None else rec.end_row if hi is None else min(hi, rec.end_row)
            todo = uncovered(rec.bulk_loads, load_id, a, b)
            if not todo:
                continue
            by_key = {f.key: f for f in files}
            keys, adopt = [], []
            for key in overlapping(files, todo[0][0], todo[-1][1]):
                f = by_key[key]
                if f.staged and any(_inside(f, lo_, hi_) for lo_, hi_ in todo):
                    adopt.append(f.staged)
                else:
                    keys.append(key)
            if keys or adopt:
                jobs.append((rec, a, b, keys, adopt))
    return jobs


async def _load_range(
    info: TableInfo,
    url: str,
    files: list[SourceFile],
    load_id: str,
    catalog: Catalog,
    worker: Callable[[str], TabletService],
    locate: Locate,
) -> tuple[int, int]:
    """Load the files' rows into the tablets covering them, looking a range up again (up to
    ``_ATTEMPTS`` times) when its tablet refused the call having committed nothing."""
    tablets = cells = 0
    pending: list[tuple[bytes, bytes | None]] = [(b"", None)]
    for attempt in range(_ATTEMPTS):
        if not pending:
            break
        retry: list[tuple[bytes, bytes | None]] = []
        jobs = _jobs(await catalog.list_tablets(info.table_id), pending, files, load_id)
        try:
            where = await locate([job[0] for job in jobs])
        except NotServing as exc:
            log.info("bulk load into %s: %s; looking again", info.schema.name, exc)
            await asyncio.sleep(0.05 * 2**attempt)
            continue
        replies = await asyncio.gather(
            *(
                worker(where[rec.tablet_id]).bulk_load_tablet(
                    BulkLoadTabletRequest(
                        rec.table_id,
                        rec.tablet_id,
                        url,
                        tuple(keys),
                        a,
                        b,
                        load_id,
                        adopt=tuple(adopt),
                    )
                )
                for rec, a, b, keys, adopt in jobs
            ),
            return_exceptions=True,
        )
        for (_, a, b, _, _), reply in zip(jobs, replies, strict=True):
            if isinstance(reply, BulkLoadTabletResponse):
                tablets += reply.cells > 0
                cells += reply.cells
            elif isinstance(reply, (NotServing, Unreachable)):
                retry.append((a, b))  # nothing of it was committed: load it again
            elif isinstance(reply, BaseException):
                raise reply
        pending = retry
        if pending:
            await asyncio.sleep(0.05 * 2**attempt)
    if pending:
        raise Unavailable(
            f"bulk load {load_id} into {info.schema.name!r}: rows {pending} could not be "
            f"loaded (their tablets kept moving); {cells} cells in {tablets} tablets were "
            f"loaded: run the load again to load the rest"
        )
    return tablets, cells
