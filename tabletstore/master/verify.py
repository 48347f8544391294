"""Whether a bucket is whole: the verifier's shell (gathers the inputs of
:func:`tabletstore.master.verify_plan.check`).

:func:`verify` lists the bucket (or, for one table, its SSTables, its snapshots and the logs
its tablets list), then reads the garbage collector's roots, the tablet records and the
snapshot manifests, reads the header of every log segment a tablet needs, and hands it all
to the pure checker. ``tabletstore verify``, :meth:`tabletstore.embedded.Database.verify` and
the chaos harness call it; :func:`verify_backup` checks a backup's objects (in the database's
bucket or in a backup location: a location holds its manifest and objects together) through
:func:`verify_references`.

The order is the garbage collector's (:mod:`tabletstore.master.gc`): the listing first, the
references second. An object referenced at the second read either was listed, or was created
after the listing: it is then looked up (``head``) before being called missing. Nothing that a
record references when it is read is deleted meanwhile: garbage collection deletes only what
no record has referenced for its grace period. So a verify running beside a live cluster
reports no damage that is not there.

Costs: one listing, one read per table's records and per manifest, and one ranged GET of a
segment's header per segment a tablet needs (segments before a tablet's log position are not
read). ``deep`` GETs every referenced object that records a checksum and every needed segment
whole, and decodes the segments (every record's checksum).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import replace

from crc32c import crc32c

from tabletstore.clock import Clock
from tabletstore.commitlog.format import decode_segment
from tabletstore.commitlog.reader import read_segment_header
from tabletstore.coordination.base import Coordinator
from tabletstore.errors import Corruption, InvalidArgument, TabletStoreError
from tabletstore.master import gc
from tabletstore.master import verify_plan as vp
from tabletstore.metadata.backup import BackupManifest, BackupState, read_backup
from tabletstore.metadata.backup_copy import checksum as backup_checksum
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.load_part import LoadPart
from tabletstore.metadata.record import LogRef, TabletRecord
from tabletstore.metadata.snapshot import SnapshotManifest
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectInfo, ObjectStore, object_url

__all__ = ["verify", "verify_backup", "verify_references"]

#: Object requests the verifier keeps in flight.
PARALLEL = 16
#: How a backup manifest's checksums begin.
_SHA256 = "sha256:"


async def verify(
    store: ObjectStore,
    catalog: Catalog,
    coordinator: Coordinator,
    *,
    clock: Clock,
    table: str | None = None,
    deep: bool = False,
) -> vp.VerifyReport:
    """Verify the whole database, or the table named ``table`` (NotFound if there is none)."""
    table_id = None if table is None else (await catalog.get_table(table)).table_id
    if table_id is None:
        listed = await gc.list_objects(store)
    else:
        listed = [
            o
            for prefix in (
                layout.tables_prefix(table_id),
                layout.snapshot_prefix(table_id),
                layout.load_part_prefix(table_id),
            )
            async for o in store.list(prefix)
        ]
    live = await gc.mark(catalog, coordinator, store, listed)
    ids = sorted(live.tables) if table_id is None else [table_id]
    tables = {tid: await catalog.list_tablets(tid) for tid in ids}
    found: list[vp.Finding] = []
    refs: list[vp.ObjectRef] = []
    for info in listed:
        if info.key.startswith(layout.SNAPSHOTS) and info.key.endswith(".json"):
            refs.extend(await _snapshot_refs(store, info.key, found))
        elif info.key.startswith(layout.LOADS):
            refs.extend(await _load_part_refs(store, info.key, found))
    logs = await _gather_logs(store, tables, listed if table_id is None else None, deep, found)
    if table_id is not None:
        listed = [*listed, *(o for lf in logs for o in lf[1])]
    seen = {o.key for o in listed}
    wanted = {r.key for r in refs} | {
        r.key for recs in tables.values() for rec in recs for r in vp.refs_of_record(rec)
    }
    late = await _heads(store, sorted(wanted - seen))
    checksums = await _checksums(store, refs) if deep else {}
    return vp.check(
        vp.VerifyInputs(
            listed=[*listed, *late],
            tables=tables,
            refs=refs,
            logs=[facts for facts, _ in logs],
            found=found,
            live=live,
            checksums=checksums,
            now=clock.time(),
        )
    )


async def verify_references(
    store: ObjectStore, refs: Sequence[vp.ObjectRef], *, deep: bool = False
) -> vp.VerifyReport:
    """Check that every object of ``refs`` (a manifest's, in ``store``) exists with its
    recorded size, and with its recorded checksum when ``deep``. No tiling, logs or orphans."""
    infos = await _heads(store, sorted({r.key for r in refs}))
    checksums = await _checksums(store, refs) if deep else {}
    return vp.check(vp.VerifyInputs(listed=infos, tables={}, refs=refs, checksums=checksums))


async def verify_backup(store: ObjectStore, backup_id: str, *, now: float) -> vp.VerifyReport:
    """Check backup ``backup_id`` of ``store`` (the database's bucket or a backup location):
    it is ready and not expired at ``now`` (a restore refuses it otherwise, and garbage
    collection frees an expired backup's objects), and every SSTable its manifest names
    exists with its recorded size, and with its recorded SHA-256 where the manifest records
    one (the objects a copy passed through; those are read whole). NotFound if there is no
    such backup; a manifest this build cannot read raises (Corruption, Unimplemented) rather
    than being reported as whole."""
    manifest = await read_backup(store, backup_id)
    owner = f"backup {manifest.backup_id}"
    refs = [
        vp.ObjectRef(r.key, r.size, owner, checksum=manifest.checksums.get(r.key))
        for t in manifest.tablets
        for group in t.sstables.values()
        for r in group
    ]
    report = await verify_references(store, refs, deep=True)
    return replace(report, findings=(*_backup_state(manifest, now), *report.findings))


def _backup_state(manifest: BackupManifest, now: float) -> list[vp.Finding]:
    """Findings for a backup that cannot be restored whatever its objects: not ready (its
    creation or copy never finished), or expired."""
    subject = f"backup {manifest.backup_id}"
    out = []
    if manifest.state is not BackupState.READY:
        out.append(
            vp.Finding(
                vp.Kind.INCOMPLETE,
                subject,
                f"state {manifest.state}: its creation or copy has not finished",
            )
        )
    if manifest.expired(now):
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(manifest.expires_at or 0.0))
        out.append(
            vp.Finding(
                vp.Kind.EXPIRED,
                subject,
                f"expired at {when}: it cannot be restored, and garbage collection frees its "
                "objects",
            )
        )
    return out


async def _snapshot_refs(
    store: ObjectStore, key: str, found: list[vp.Finding]
) -> list[vp.ObjectRef]:
    data = await store.get(key)
    if data is None:
        return []  # deleted since the listing: it references nothing any more
    try:
        manifest = SnapshotManifest.from_bytes(data, name=object_url(store.url, key))
    except (Corruption, TabletStoreError) as exc:
        found.append(vp.Finding(vp.Kind.MANIFEST, key, str(exc)))
        return []
    owner = f"snapshot {manifest.snapshot_id}"
    return vp.sstable_refs(
        (r for t in manifest.tablets for refs in t.sstables.values() for r in refs), owner
    )


async def _load_part_refs(
    store: ObjectStore, key: str, found: list[vp.Finding]
) -> list[vp.ObjectRef]:
    """The SSTables a bulk-load part names (metadata/load_part.py): a point-in-time restore
    adds them, so one missing is damage to the table's history."""
    try:
        layout.parse_load_part_key(key)
    except InvalidArgument:
        return []  # nothing else is written there; the orphan listing shows it
    data = await store.get(key)
    if data is None:
        return []  # deleted since the listing (out of every history window)
    try:
        part = LoadPart.from_bytes(data, name=object_url(store.url, key))
    except TabletStoreError as exc:
        found.append(vp.Finding(vp.Kind.MANIFEST, key, str(exc)))
        return []
    owner = f"bulk-load part {part.load_id} of tablet {part.table_id}/{part.tablet_id}"
    return vp.sstable_refs((r for refs in part.sstables.values() for r in refs), owner)


async def _gather_logs(
    store: ObjectStore,
    tables: dict[str, list[TabletRecord]],
    listed: Sequence[ObjectInfo] | None,
    deep: bool,
    found: list[vp.Finding],
) -> list[tuple[vp.LogFacts, list[ObjectInfo]]]:
    """Each log the records list, with its segments from the least position any tablet needs;
    ``listed`` (the whole bucket's listing) or, when None, a listing of each log."""
    starts: dict[LogRef, dict[str, int]] = {}
    for records in tables.values():
        for rec in records:
            for ref in rec.logs:
                starts.setdefault(ref, {})[f"{rec.table_id}/{rec.tablet_id}"] = rec.log_start(ref)
    by_log: dict[LogRef, list[ObjectInfo]] = {ref: [] for ref in starts}
    if listed is None:
        for ref in starts:
            prefix = layout.log_prefix(ref.worker_id, ref.incarnation)
            by_log[ref] = [o async for o in store.list(prefix)]
    else:
        for info in listed:
            if not info.key.startswith(layout.LOGS):
                continue
            try:
                key = layout.parse_log_segment_key(info.key)
            except TabletStoreError:
                continue
            ref = LogRef(key.worker_id, key.incarnation)
            if ref in by_log:
                by_log[ref].append(info)
    sem = asyncio.Semaphore(PARALLEL)
    out: list[tuple[vp.LogFacts, list[ObjectInfo]]] = []
    for ref, infos in by_log.items():
        low = min(starts[ref].values())
        numbered = sorted(
            (layout.parse_log_segment_key(o.key).seq, o) for o in infos if _is_segment(o.key)
        )
        needed = [(n, o) for n, o in numbered if n >= low]
        facts = await asyncio.gather(
            *(_segment_facts(store, ref, n, o, sem, deep) for n, o in needed)
        )
        out.append((vp.LogFacts(ref, tuple(facts), starts[ref]), infos))
    return out


def _is_segment(key: str) -> bool:
    try:
        layout.parse_log_segment_key(key)
    except TabletStoreError:
        return False
    return True


async def _segment_facts(
    store: ObjectStore,
    ref: LogRef,
    number: int,
    info: ObjectInfo,
    sem: asyncio.Semaphore,
    deep: bool,
) -> vp.SegmentFacts:
    if info.size == 0:
        return vp.SegmentFacts(number, 0)
    where = object_url(store.url, info.key)
    try:
        async with sem:
            if deep:
                data = await store.get(info.key)
                found = None
                if data is not None:
                    contents = decode_segment(data, where=where)
                    assert contents.header is not None
                    found = contents.header, len(data)
            else:
                found = await read_segment_header(store, info.key, info.size, where=where)
    except Corruption as exc:
        return vp.SegmentFacts(number, info.size, problem=str(exc))
    if found is None:
        return vp.SegmentFacts(number, info.size, problem="deleted while being verified")
    header, declared = found
    if (header.worker_id, header.incarnation, header.segment) != (
        ref.worker_id,
        ref.incarnation,
        number,
    ):
        return vp.SegmentFacts(
            number,
            info.size,
            problem=f"its header names {header.worker_id}/{header.incarnation} segment "
            f"{header.segment}",
        )
    return vp.SegmentFacts(number, info.size, declared=declared)


async def _heads(store: ObjectStore, keys: Sequence[str]) -> list[ObjectInfo]:
    sem = asyncio.Semaphore(PARALLEL)

    async def one(key: str) -> ObjectInfo | None:
        async with sem:
            return await store.head(key)

    infos = await asyncio.gather(*(one(k) for k in keys))
    return [i for i in infos if i is not None]


async def _checksums(store: ObjectStore, refs: Sequence[vp.ObjectRef]) -> dict[str, str]:
    """The checksum of every object a reference records one of, in the form it records:
    ``sha256:<hex>`` (a backup manifest's, metadata/backup_copy.py) or crc32c hex."""
    forms = {r.key: r.checksum for r in refs if r.checksum is not None}
    sem = asyncio.Semaphore(PARALLEL)
    out: dict[str, str] = {}

    async def one(key: str, recorded: str) -> None:
        async with sem:
            data = await store.get(key)
        if data is None:
            return
        if recorded.startswith(_SHA256):
            out[key] = await asyncio.to_thread(backup_checksum, data)
        else:
            out[key] = f"{crc32c(data):08x}"

    await asyncio.gather(*(one(k, c) for k, c in sorted(forms.items())))
    return out
