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

# The public API, re-exported lazily (PEP 562): ``import tabletstore`` stays cheap and importing
# any submodule (which first imports this package) never drags in the whole stack or creates an
# import cycle. ``from tabletstore import connect, SetCell, Chain`` works as usual.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["connect", "connect_async", "Database", "SyncDatabase"], "embedded"),
    **dict.fromkeys(["AsyncClient", "AsyncTable", "MutationError", "MutationsFailed"], "client"),
    **dict.fromkeys(
        [
            "AppendValue",
            "Cell",
            "DeleteCells",
            "DeleteFamily",
            "DeleteRow",
            "IncrementValue",
            "Mutation",
            "Row",
            "RowMutation",
            "SetCell",
        ],
        "model",
    ),
    **dict.fromkeys(
        [
            "ApplyLabel",
            "BlockAll",
            "CellsPerColumnLimit",
            "CellsPerRowLimit",
            "CellsPerRowOffset",
            "Chain",
            "ColumnQualifierRegex",
            "ColumnRange",
            "Condition",
            "FamilyNameRegex",
            "Interleave",
            "PassAll",
            "RowFilter",
            "RowKeyRegex",
            "RowSample",
            "Sink",
            "StripValue",
            "TimestampRange",
            "ValueRange",
            "ValueRegex",
        ],
        "filters",
    ),
    **dict.fromkeys(["RowRange", "RowSet"], "query"),
    **dict.fromkeys(
        [
            "Acl",
            "ColumnFamily",
            "IntersectionRule",
            "LocalityGroup",
            "MaxAgeRule",
            "MaxVersionsRule",
            "TableSchema",
            "UnionRule",
        ],
        "schema",
    ),
    **dict.fromkeys(
        [
            "AlreadyExists",
            "Closed",
            "Corruption",
            "Fenced",
            "Indeterminate",
            "InvalidArgument",
            "NotFound",
            "NotServing",
            "PermissionDenied",
            "PreconditionFailed",
            "TabletStoreError",
            "Unavailable",
            "Unimplemented",
        ],
        "errors",
    ),
}

__all__ = ["__version__", *sorted(_EXPORTS)]


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tabletstore' has no attribute {name!r}")
    import importlib

    if module == "client":
        module = "client.client"
    value = getattr(importlib.import_module(f"tabletstore.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
