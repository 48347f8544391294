"""A major compaction of one tablet run away from its worker (§5.4; docs/architecture/design.md §7):
what the serverless function ``functions/compaction.py`` does, and what any process that reaches the
cluster can do.

Paper §5.4: "Bigtable cycles through all of its tablets and regularly applies major
compactions to them"; a major compaction "produces an SSTable that contains no deletion
information or deleted data". Reading and rewriting a whole tablet is the costly part, and it
needs nothing the worker holds in memory: the SSTables are immutable objects in the bucket.
So it can run anywhere, in two steps:

1. :func:`prepare` reads the tablet's record from METADATA (its epoch, its location, every
   SSTable it lists) and its table's schema, reads those SSTables from the bucket, rewrites
   them exactly as the worker's own major compaction does
   (:func:`~tabletstore.engine.compaction.schema_rewrite`: deletions applied, GC rules
   applied, a dropped family's cells gone, one SSTable per locality group of the current
   schema) and writes the outputs under the tablet's prefix with create-only PUTs;
2. :func:`hand_over` asks the worker serving the tablet to adopt them (``adopt_compaction``,
   ``Tablet.adopt_major``), and the worker commits them with the same epoch-conditional
   METADATA update every compaction of the tablet uses, under the tablet's compaction lock.

Why the serving worker commits, not the function. The record's conditional update compares
the owner's epoch only, and the serving worker keeps working meanwhile: its minor compactions
add SSTables and move the redo point, and it holds the record in memory for its next update.
A function committing by itself would either drop an SSTable a minor compaction added since
its read (acknowledged writes lost once their log is trimmed), or see its commit overwritten
by the worker's next update, and the SSTables it replaced deleted by GC under the worker's
reads. The worker instead checks, under its lock, that the tablet is still the one at the
epoch the function read, with the function's schema, and that its SSTables are those the
function read with at most newer ones in front (``engine.state.adoptable``); it keeps those
newer ones in front of the output, and its memtable is untouched. Anything else -- the
tablet moved (a new epoch), split or merged away (not served there), merged or compacted
since the read (its SSTables changed), its schema changed -- refuses the result: a zombie
function's late output is never adopted. A refused output is referenced by nothing, and GC
deletes it after its grace period (``MasterOptions.gc_grace``, an hour by default: far past
the 15-minute limit of one Lambda invocation, so an output is adopted, if at all, long
before GC could take it).

Deletions and versions: the SSTables written after the read (and the worker's memtable) are
outside the rewrite. A deletion entry masks only cells of its own row with a smaller seq, and a
row's writes reach the tablet's sources in seq order, so a deletion dropped by the rewrite had
nothing left to mask in the newer sources. The other way round is not harmless: a deletion the
rewrite did not see may delete the newest version of a column, and the rewrite, counting
versions without it, may have dropped the version that is the newest now. The worker's own
major compaction counts with its memtables' deletions (``engine.compaction``); a rewrite run
here cannot, so the worker refuses it when its families count versions and a deletion came
since the read (``CompactionRunner._check_no_unseen_deletions``). The cycle tries again later,
and the worker's own compactions go on meanwhile.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from tabletstore.clock import Clock, micros
from tabletstore.data.schema import TableSchema
from tabletstore.engine import compaction
from tabletstore.errors import Fenced, NotServing, Unavailable
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import SSTableRef, TabletRecord
from tabletstore.rpc.messages import AdoptCompactionRequest
from tabletstore.rpc.services import TabletService
from tabletstore.storage_s3 import layout
from tabletstore.storage_s3.base import ObjectStore

__all__ = [
    "PreparedCompaction",
    "RemoteCompaction",
    "RemoteCompactionExecutor",
    "compact_remotely",
    "hand_over",
    "prepare",
]


@dataclass(frozen=True, slots=True)
class PreparedCompaction:
    """A rewrite written to the bucket, not adopted yet: ``record`` is what it read (every
    SSTable listed there is an input), ``outputs`` what it wrote (one per locality group)."""

    record: TabletRecord
    schema: TableSchema
    outputs: dict[str, SSTableRef]
    bytes_read: int

    @property
    def inputs(self) -> int:
        return sum(len(refs) for refs in self.record.sstables.values())

    def request(self) -> AdoptCompactionRequest:
        return AdoptCompactionRequest.of(self.record, self.schema, self.outputs)


@dataclass(frozen=True, slots=True)
class RemoteCompaction:
    """What :func:`compact_remotely` did (the function's answer)."""

    table_id: str
    tablet_id: str
    epoch: int
    inputs: int
    outputs: tuple[str, ...]
    bytes_read: int
    bytes_written: int

    def to_json(self) -> dict[str, object]:
        return {
            "table_id": self.table_id,
            "tablet_id": self.tablet_id,
            "epoch": self.epoch,
            "inputs": self.inputs,
            "outputs": list(self.outputs),
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
        }


async def prepare(
    catalog: Catalog,
    store: ObjectStore,
    table_id: str,
    tablet_id: str,
    *,
    clock: Clock,
    epoch: int | None = None,
) -> PreparedCompaction:
    """Step 1 (module docstring): read the record and its SSTables, write the rewrite (no
    inputs, nothing written: the tablet has no SSTable). Refused before anything is read:
    a tablet not served right now (NotServing: no worker could adopt the output), and with
    ``epoch`` (the caller's view of the record) a record at another epoch (Fenced: the
    request is stale, the tablet moved since)."""
    record = await catalog.get_tablet(table_id, tablet_id)
    if record.location is None:
        raise NotServing(f"tablet {tablet_id} is not served right now")
    if epoch is not None and record.epoch != epoch:
        raise Fenced(
            f"tablet {tablet_id} is at epoch {record.epoch}, not {epoch}: it moved since "
            "this compaction was asked for"
        )
    schema = (await catalog.table_by_id(table_id)).schema
    refs = [ref for group_refs in record.sstables.values() for ref in group_refs]
    keys = [ref.key for ref in refs]
    if not keys:
        return PreparedCompaction(record, schema, {}, 0)
    blobs = await asyncio.gather(*(store.get(key) for key in keys))
    missing = [k for k, b in zip(keys, blobs, strict=True) if b is None]
    if missing:
        # Compacted away and collected since the record was read: it changed, try again.
        raise Unavailable(f"tablet {tablet_id}: SSTables vanished before compaction: {missing}")
    inputs = [b for b in blobs if b is not None]
    rewrite = compaction.schema_rewrite(
        inputs,
        schema,
        now_micros=micros(clock.time()),
        start_row=record.start_row,
        end_row=record.end_row,
        seq_bases=[ref.seq_base for ref in refs],  # adopted bulk-load SSTables (§6c)
    )
    outputs: dict[str, SSTableRef] = {}
    for group, (data, info) in sorted((await asyncio.to_thread(rewrite)).items()):
        key = layout.sstable_key(table_id, tablet_id, group, uuid.uuid4().hex)
        await store.create(key, data)  # create-only: never overwrites an object
        outputs[group] = SSTableRef.of(key, len(data), info)
    return PreparedCompaction(record, schema, outputs, sum(len(b) for b in inputs))


async def hand_over(prepared: PreparedCompaction, worker: TabletService) -> None:
    """Step 2: the serving worker adopts the output under its own conditional commit, or
    refuses it (Fenced, NotServing, PreconditionFailed; the output is then garbage)."""
    await worker.adopt_compaction(prepared.request())


async def compact_remotely(
    catalog: Catalog,
    store: ObjectStore,
    worker: Callable[[str], TabletService],
    table_id: str,
    tablet_id: str,
    *,
    clock: Clock,
    epoch: int | None = None,
) -> RemoteCompaction:
    """Both steps: a major compaction of one tablet, adopted by the worker serving it
    (``worker(address)``: a stub of the tablet server at that address)."""
    prepared = await prepare(catalog, store, table_id, tablet_id, clock=clock, epoch=epoch)
    location = prepared.record.location
    assert location is not None  # prepare refuses a tablet without one
    if prepared.inputs:
        await hand_over(prepared, worker(location))
    return RemoteCompaction(
        table_id,
        tablet_id,
        prepared.record.epoch,
        prepared.inputs,
        tuple(ref.key for _, ref in sorted(prepared.outputs.items())),
        prepared.bytes_read,
        sum(ref.size for ref in prepared.outputs.values()),
    )


class RemoteCompactionExecutor:
    """The cycle's compactions (``master.compaction_cycle``) run by :func:`compact_remotely`
    in this process: the function's code without Lambda (the embedded database, tests, a
    master with spare cores). The rewrite runs on a thread, at most ``parallel`` at once."""

    def __init__(
        self,
        catalog: Catalog,
        store: ObjectStore,
        worker: Callable[[str], TabletService],
        *,
        clock: Clock,
        parallel: int = 1,
    ) -> None:
        self._catalog = catalog
        self._store = store
        self._worker = worker
        self._clock = clock
        self._slots = asyncio.Semaphore(parallel)
        #: The compactions this executor saw adopted (for tests and status).
        self.done: list[RemoteCompaction] = []

    async def compact(self, record: TabletRecord) -> None:
        async with self._slots:
            done = await compact_remotely(
                self._catalog,
                self._store,
                self._worker,
                record.table_id,
                record.tablet_id,
                clock=self._clock,
                epoch=record.epoch,
            )
        self.done.append(done)

    async def close(self) -> None:
        """Nothing held: the store is the caller's."""
