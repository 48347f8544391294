"""Batch jobs over tabletstore: Bigtable as MapReduce input and output (§8).

Glossary: a *snapshot* is a consistent cut of one table, described by a *manifest* in the
bucket (:mod:`tabletstore.metadata.snapshot`); an *input split* is a row range of one tablet
of a snapshot that one task reads; a *bulk load* adds SSTables a job wrote to a table.

* :mod:`tabletstore.batch.reader`: open a snapshot, cut it into splits, read a split with
  the engine's semantics as Arrow record batches (``cells`` or ``wide``), bucket only;
* :mod:`tabletstore.batch.engines`: a DuckDB relation, a Dask DataFrame, and Dask/Spark
  writers through the client's batched mutations;
* :mod:`tabletstore.batch.spark`: the PySpark 4 data source ``format("tabletstore")``;
* :mod:`tabletstore.batch.load_files`: write sorted SSTables from Arrow or a DataFrame, and the
  checks a bulk load makes before it commits anything.

Taking, listing and deleting snapshots and loading are admin operations of the client
(``client.snapshot(table)``, ``table.bulk_load(url)``) and the CLI
(``tabletstore snapshot create|list|delete``, ``tabletstore bulkload``).
"""

from __future__ import annotations

from tabletstore.batch.load_files import awrite_sstables, write_sstables
from tabletstore.batch.reader import (
    CELLS_SCHEMA,
    Snapshot,
    Split,
    aopen_snapshot,
    aread_split,
    open_snapshot,
    read_split,
    wide_schema,
)
from tabletstore.metadata.snapshot import SnapshotManifest, TabletSnapshot

__all__ = [
    "CELLS_SCHEMA",
    "Snapshot",
    "SnapshotManifest",
    "Split",
    "TabletSnapshot",
    "aopen_snapshot",
    "aread_split",
    "awrite_sstables",
    "open_snapshot",
    "read_split",
    "wide_schema",
    "write_sstables",
]
