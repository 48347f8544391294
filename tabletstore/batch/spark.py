"""Apache Spark: a PySpark 4 Python Data Source for snapshots, and a writer (§8).

    from tabletstore.batch.spark import register
    register(spark)
    df = (spark.read.format("tabletstore")
          .option("store", "s3://bucket/prefix?endpoint_url=...")
          .option("snapshot", snapshot_id)
          .load())

One Spark partition per input split (``tabletstore.batch.reader``); each task reads its
split from the bucket alone and hands Spark Arrow record batches. Options:

* ``store`` (required): the database's URL or the store URL of its objects (as
  ``open_snapshot`` takes); ``snapshot`` (required);
* ``shape``: ``cells`` (default) or ``wide``; ``columns``: comma-separated ``family`` or
  ``family:qualifier`` (required for ``wide``);
* ``start_row`` / ``end_row`` (UTF-8 row keys, ``[start, end)``), ``start_ts`` / ``end_ts``
  (µs), ``max_split_bytes``.

Writing (small outputs, through the client's batched mutations):
``df.write.format("tabletstore").option("cluster", "etcd://...").option("table", t)
.mode("append").save()`` with columns ``row, family, qualifier, value[, timestamp]``.
Large outputs go through ``bulkload.write_sstables`` and ``tabletstore bulkload`` instead.

pyspark is the optional ``batch`` extra; this module imports it, and without it fails naming
the extra to install.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from tabletstore.batch.engines import write_rows
from tabletstore.batch.reader import Split, open_snapshot, read_split
from tabletstore.data.query import RowRange
from tabletstore.errors import InvalidArgument
from tabletstore.extras import needs_extra

with needs_extra("batch", what="the Spark data source (tabletstore.batch.spark)"):
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceArrowWriter,
        DataSourceReader,
        InputPartition,
        WriterCommitMessage,
    )
    from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

__all__ = ["TabletstoreDataSource", "register"]

_CELLS = StructType(
    [
        StructField("row", BinaryType()),
        StructField("family", StringType()),
        StructField("qualifier", BinaryType()),
        StructField("timestamp", LongType()),
        StructField("value", BinaryType()),
    ]
)


def register(spark: Any) -> None:
    """Make ``format("tabletstore")`` known to ``spark``."""
    spark.dataSource.register(TabletstoreDataSource)


def _columns(options: dict[str, str]) -> list[str] | None:
    raw = options.get("columns")
    return [c.strip() for c in raw.split(",") if c.strip()] if raw else None


def _read_kw(options: dict[str, str]) -> dict[str, Any]:
    kw: dict[str, Any] = {"shape": options.get("shape", "cells")}
    cols = _columns(options)
    if cols is not None:
        kw["columns"] = cols
    start, end = options.get("start_row"), options.get("end_row")
    if start is not None or end is not None:
        kw["row_range"] = RowRange(start.encode() if start else None, end.encode() if end else None)
    for name in ("start_ts", "end_ts"):
        if options.get(name) is not None:
            kw[name] = int(options[name])
    return kw


@dataclass(frozen=True)
class _SplitPartition(InputPartition):  # type: ignore[misc]
    split: Split


class TabletstoreDataSource(DataSource):  # type: ignore[misc]
    """``format("tabletstore")``: read a snapshot, or write rows through the client."""

    @classmethod
    def name(cls) -> str:
        return "tabletstore"

    def schema(self) -> StructType:
        opts = dict(self.options)
        if opts.get("shape", "cells") == "cells":
            return _CELLS
        cols = _columns(opts)
        if not cols:
            raise InvalidArgument("the wide shape needs option columns='family:qualifier,...'")
        return StructType(
            [StructField("row", BinaryType()), *(StructField(c, BinaryType()) for c in cols)]
        )

    def reader(self, schema: StructType) -> DataSourceReader:
        return _Reader(dict(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        if overwrite:
            raise InvalidArgument("tabletstore tables are written in append mode only")
        return _Writer(dict(self.options))


class _Reader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        for name in ("store", "snapshot"):
            if not options.get(name):
                raise InvalidArgument(f"the tabletstore data source needs option {name!r}")
        self._options = options
        self._kw = _read_kw(options)

    def partitions(self) -> list[InputPartition]:
        snap = open_snapshot(self._options["store"], self._options["snapshot"])
        mx = self._options.get("max_split_bytes")
        splits = snap.splits() if mx is None else snap.splits(max_split_bytes=int(mx))
        return [_SplitPartition(s) for s in splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _SplitPartition)
        yield from read_split(partition.split, **self._kw)


class _Writer(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, options: dict[str, str]) -> None:
        for name in ("cluster", "table"):
            if not options.get(name):
                raise InvalidArgument(f"writing to tabletstore needs option {name!r}")
        self._cluster = options["cluster"]
        self._table = options["table"]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        batches = list(iterator)
        if batches:
            write_rows(self._cluster, self._table, pa.Table.from_batches(batches))
        return WriterCommitMessage()
