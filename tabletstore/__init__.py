"""tabletstore: Google's Bigtable (OSDI 2006) on object storage and etcd.

One folder per subsystem, named with the paper's nouns: docs/architecture/modules.md draws
them, and the import-linter contract in pyproject.toml is the one layer map, checked in CI.

Glossary (the paper's words, docs/architecture/conventions.md convention 1):

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

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

__version__ = "0.1.0"

# The public API, re-exported lazily (PEP 562): ``import tabletstore`` stays cheap and importing
# any submodule (which first imports this package) never drags in the whole stack or creates an
# import cycle. ``from tabletstore import connect, SetCell, Chain`` works as usual.
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(["connect", "connect_async", "Database", "SyncDatabase"], "embedded"),
    "TlsConfig": "security.tls",
    "warm_up_process": "ops.process_warmup",
    "AsyncClient": "client.client",
    "AsyncTable": "client.table",
    **dict.fromkeys(["MutationError", "MutationsFailed"], "client.mutate_rows"),
    **dict.fromkeys(
        [
            "AddToCell",
            "AppendValue",
            "Cell",
            "DeleteCells",
            "DeleteFamily",
            "DeleteRow",
            "IncrementValue",
            "MergeToCell",
            "Mutation",
            "Row",
            "RowMutation",
            "SetCell",
        ],
        "data.model",
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
        "data.filters",
    ),
    **dict.fromkeys(["RowRange", "RowSet"], "data.query"),
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
        "data.schema",
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

#: The public modules of the data model keep their short names (``from tabletstore.model
#: import SetCell``, ``tabletstore.filters``): each is the same module object as its home in
#: ``data/``, installed under the short name on first import.
_ALIASES = {
    f"tabletstore.{name}": f"tabletstore.data.{name}"
    for name in ("model", "schema", "query", "filters")
}


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _ALIASES:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(_ALIASES[spec.name])

    def exec_module(self, module: types.ModuleType) -> None:
        """The real module ran already (create_module imported it)."""


if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _AliasFinder())


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tabletstore' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"tabletstore.{module}"), name)
    globals()[name] = value  # later look-ups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
