"""tabletstore: Google's Bigtable (OSDI 2006) on object storage and etcd.

Layer map (dependencies point down; checked by import-linter, see pyproject.toml)::

    cli
    embedded
    master | worker
    client
    tablet | compaction | rpc
    sstable | memtable | commitlog | iterators
    storage_s3 | coordination | keys | schema
    model | options | clock
    errors

Glossary (the paper's words, STYLE.md convention 1):

- tablet: a contiguous row range of one table, the unit of distribution (§5).
- SSTable: an immutable sorted file of cells, here a Parquet object in the bucket (§4).
- memtable: the sorted in-memory buffer of recent writes (§5.3).
- commit log: the per-worker redo log, a sequence of immutable segment objects (§5.3, §6).
- redo point: the log position up to which a tablet's SSTables already hold its writes (§5.3).
- minor / merging / major compaction: memtable to SSTable / a few SSTables into one /
  everything into one without deletion entries (§5.4).
- locality group: families stored together in their own SSTables (§6).
- deletion entry: a stored cell that masks older cells (keys.CellKind).
"""

from __future__ import annotations

__version__ = "0.1.0"
