"""A snapshot on the engines a data engineer already runs: DuckDB, Dask (and Spark, in
``spark.py``), and small outputs written back through the client (§8).

* :func:`duckdb_relation`: a DuckDB relation over a snapshot (read on this process).
* :func:`dask_dataframe`: a Dask DataFrame with one partition per input split; each
  partition is read by whichever Dask worker runs it, from the bucket alone.
* :func:`dask_write_sstables`: each partition of a Dask DataFrame written as sorted SSTables
  for a bulk load (partitions must hold disjoint row ranges, as HBase's bulk output does).
* :func:`write_rows` (and :func:`dask_write_rows`): cells written through the client's
  batched mutations (``MutateRows``), for outputs too small to be worth a bulk load.

Binary columns (row keys, qualifiers, values) stay bytes: pandas frames use Arrow-backed
dtypes (``pd.ArrowDtype(pa.binary())``), so neither pandas nor Dask turns them into strings.
dask and pandas are the optional ``batch`` extra; they are imported when first used, and a
missing one names the extra to install (:mod:`tabletstore.extras`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tabletstore.batch.load_files import to_cells_table, write_sstables
from tabletstore.batch.reader import CELLS_SCHEMA, Split, open_snapshot, read_split, wide_schema
from tabletstore.client.cluster import ClusterClient
from tabletstore.data.model import RowMutation, SetCell
from tabletstore.extras import needs_extra

if TYPE_CHECKING:
    import duckdb

__all__ = [
    "awrite_rows",
    "dask_dataframe",
    "dask_write_rows",
    "dask_write_sstables",
    "duckdb_relation",
    "write_rows",
]

#: Who needs the batch extra, in the error that names it.
_DASK = "tabletstore.batch's Dask engine"
#: Cells per MutateRows call made by :func:`write_rows`.
WRITE_BATCH_CELLS = 2000


def _schema(shape: str, columns: Sequence[str] | None) -> pa.Schema:
    return CELLS_SCHEMA if shape == "cells" else wide_schema(list(columns or ()))


def duckdb_relation(
    con: duckdb.DuckDBPyConnection,
    store_url: str,
    snapshot_id: str,
    *,
    view: str | None = None,
    **kw: Any,
) -> duckdb.DuckDBPyRelation:
    """A DuckDB relation over snapshot ``snapshot_id`` of the database at ``store_url`` (its
    URL or its store's, as :func:`~tabletstore.batch.reader.open_snapshot` takes; keyword
    arguments as :func:`~tabletstore.batch.reader.aread_split`: ``columns``, ``row_range``,
    ``start_ts``, ``end_ts``, ``filter``, ``shape``); with ``view``, also a view of that name
    for SQL."""
    table = open_snapshot(store_url, snapshot_id).read(**kw)
    rel = con.from_arrow(table)
    if view is not None:
        rel.create_view(view)
    return rel


def _to_pandas(table: pa.Table) -> Any:
    with needs_extra("batch", what=_DASK):
        import pandas as pd

    return table.to_pandas(types_mapper=pd.ArrowDtype)


def _read_partition(split: Split, kw: dict[str, Any]) -> Any:
    schema = _schema(kw.get("shape", "cells"), kw.get("columns"))
    return _to_pandas(pa.Table.from_batches(list(read_split(split, **kw)), schema=schema))


def dask_dataframe(
    store_url: str,
    snapshot_id: str,
    *,
    max_split_bytes: int | None = None,
    **kw: Any,
) -> Any:
    """A Dask DataFrame over a snapshot of the database at ``store_url`` (its URL or its
    store's, as :func:`~tabletstore.batch.reader.open_snapshot` takes), one partition per
    input split (keyword arguments as :func:`~tabletstore.batch.reader.aread_split`). Nothing
    is read until it is computed."""
    with needs_extra("batch", what=_DASK):
        import dask.dataframe as dd

    snapshot = open_snapshot(store_url, snapshot_id)
    splits = (
        snapshot.splits()
        if max_split_bytes is None
        else snapshot.splits(max_split_bytes=max_split_bytes)
    )
    meta = _to_pandas(_schema(kw.get("shape", "cells"), kw.get("columns")).empty_table())
    return dd.from_map(  # type: ignore[no-untyped-call]
        _read_partition,
        splits,
        args=(kw,),
        meta=meta,
        label="tabletstore-snapshot",
        enforce_metadata=False,
    )


def dask_write_sstables(df: Any, url: str) -> list[str]:
    """Write each partition of ``df`` (columns as ``bulkload.write_sstables``) as SSTables
    under ``url``, ready for ``tabletstore bulkload``; returns the keys written."""
    with needs_extra("batch", what=_DASK):
        import pandas as pd

    def one(part: Any) -> Any:
        keys = (
            write_sstables(pa.Table.from_pandas(part, preserve_index=False), url)
            if len(part)
            else []
        )
        return pd.DataFrame({"key": pd.Series(keys, dtype=object)})

    out = df.map_partitions(one, meta={"key": object}).compute()
    return list(out["key"])


async def awrite_rows(cluster_url: str, table: str, data: Any) -> int:
    """Write cells (columns as ``bulkload.write_sstables``) through the client's batched
    mutations to ``table`` of the cluster ``cluster_url`` (``etcd://...``); returns cells."""
    cells = to_cells_table(data)
    rows, fams, quals, tss, vals = (cells.column(i).to_pylist() for i in (0, 1, 2, 3, 6))
    async with await ClusterClient.open(cluster_url) as client:
        t = client.table(table)
        entries: list[RowMutation] = []
        n = 0
        i = 0
        while i < len(rows):
            row = rows[i]
            muts = []
            while i < len(rows) and rows[i] == row:
                muts.append(SetCell(fams[i], quals[i], vals[i], tss[i]))
                i += 1
            entries.append(RowMutation(row, tuple(muts)))
            n += len(muts)
            if n >= WRITE_BATCH_CELLS:
                await t.mutate_rows(entries)
                entries, n = [], 0
        if entries:
            await t.mutate_rows(entries)
    return len(rows)


def write_rows(cluster_url: str, table: str, data: Any) -> int:
    """:func:`awrite_rows` from synchronous code (a Dask or Spark task)."""
    return asyncio.run(awrite_rows(cluster_url, table, data))


def dask_write_rows(df: Any, cluster_url: str, table: str) -> int:
    """Write every partition of ``df`` through the client (see :func:`write_rows`)."""
    with needs_extra("batch", what=_DASK):
        import pandas as pd

    def one(part: Any) -> Any:
        n = (
            write_rows(cluster_url, table, pa.Table.from_pandas(part, preserve_index=False))
            if len(part)
            else 0
        )
        return pd.DataFrame({"cells": [n]})

    return int(df.map_partitions(one, meta={"cells": "int64"}).compute()["cells"].sum())
