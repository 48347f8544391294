"""SSTables: immutable sorted maps of cells stored as Parquet objects (§4, §6).

Modules, one noun each:

* ``format``      the specification of the bytes (Parquet schema, footer metadata, block index)
* ``bloom``       bloom filters over row keys (and optionally row+column)
* ``writer``      cells -> SSTable bytes (pure) and the create-only upload
* ``block``       one decoded block and the row-group decoder
* ``pages``       format 2's pages: the page index, page headers, one page decoded
* ``block_cache`` the process-wide block cache and the scan cache (§6 "Caching")
* ``reader``      open / point read / scan / load_all over an ObjectStore
"""

from __future__ import annotations

from tabletstore.sstable.block import Block
from tabletstore.sstable.block_cache import BlockCache, CacheStats, ScanCache
from tabletstore.sstable.bloom import BloomFilter
from tabletstore.sstable.format import DEFAULT_BLOCK_SIZE, FORMAT_VERSION, BlockHandle, Footer
from tabletstore.sstable.reader import (
    SSTable,
    SSTableCore,
    SSTableExcerpt,
    iter_sstable_bytes,
    read_sstable_bytes,
)
from tabletstore.sstable.writer import SSTableBuilder, SSTableInfo, upload_sstable, write_sstable

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "FORMAT_VERSION",
    "Block",
    "BlockCache",
    "BlockHandle",
    "BloomFilter",
    "CacheStats",
    "Footer",
    "SSTable",
    "SSTableBuilder",
    "SSTableCore",
    "SSTableExcerpt",
    "SSTableInfo",
    "ScanCache",
    "iter_sstable_bytes",
    "read_sstable_bytes",
    "upload_sstable",
    "write_sstable",
]
