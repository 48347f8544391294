"""A table with real data for the batch tests: several tablets, deletes of every scope,
several versions, per-family GC rules, all through the public API."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tabletstore.data.model import DeleteCells, DeleteFamily, DeleteRow, Row, SetCell
from tabletstore.data.schema import ColumnFamily, LocalityGroup, MaxVersionsRule
from tabletstore.embedded import Database
from tests.integration.cluster_harness import Cluster
from tests.plugins.s3_server import boto3_client

SPLITS = [b"row040", b"row080"]


@dataclass
class Loaded:
    db: Database
    table: str


def cells_of(rows: list[Row]) -> list[dict[str, object]]:
    """Rows as the reader's ``cells`` shape."""
    return [
        {
            "row": r.key,
            "family": c.family,
            "qualifier": c.qualifier,
            "timestamp": c.timestamp,
            "value": c.value,
        }
        for r in rows
        for c in r.cells
    ]


async def fill(db: Database, name: str = "web") -> None:
    """Versions, deletes of a row, a family and a column, across 3 tablets; some of it
    flushed to SSTables and some left in memtables."""
    t = await db.create_table(
        name,
        [
            ColumnFamily(name="contents", gc_rule=MaxVersionsRule(max_versions=2)),
            "anchor",
            ColumnFamily(name="meta", locality_group="small"),
        ],
        split_keys=SPLITS,
        locality_groups=[LocalityGroup(name="small", block_size=1024)],
    )
    for i in range(120):
        row = b"row%03d" % i
        await t.mutate_row(
            row,
            [
                *(
                    SetCell("contents", b"html", b"<v%d of %d>" % (v, i) * 20, 1000 + v)
                    for v in range(3)
                ),
                SetCell("anchor", b"site%d.com" % (i % 7), b"link %d" % i),
                SetCell("meta", b"len", str(i).encode()),
            ],
        )
        if i == 60:
            await db.flush(name)
    for i in range(0, 120, 11):
        await t.mutate_row(b"row%03d" % i, [DeleteRow()])
    for i in range(3, 120, 13):
        await t.mutate_row(b"row%03d" % i, [DeleteFamily("anchor")])
    for i in range(5, 120, 17):
        await t.mutate_row(b"row%03d" % i, [DeleteCells("contents", b"html", 1002, 1003)])


@pytest.fixture(scope="module")
def cluster(
    etcd_server: str, s3_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    name = f"batch-{uuid.uuid4().hex[:12]}"
    boto3_client(s3_server).create_bucket(Bucket=name)
    c = Cluster(
        url=f"etcd://{etcd_server}/{name}",
        store_url=f"s3://{name}/data?endpoint_url={s3_server}&region=us-east-1",
        directory=tmp_path_factory.mktemp("batch-cluster"),
        lease_ttl=5.0,
    )
    try:
        c.start_master()
        for _ in range(2):
            c.start_worker()
        yield c
    finally:
        c.close()


@pytest.fixture
async def loaded(tmp_path: Path) -> AsyncIterator[Loaded]:
    db = await Database.open(f"file://{tmp_path}/db")
    try:
        await fill(db)
        yield Loaded(db, "web")
    finally:
        await db.close()
