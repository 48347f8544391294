"""Schema records (metadata/catalog.py TableInfo): a replica's schema is stored as version 5,
a change retention as version 4,
a history window alone as version 3, a plain schema without a version; each reads back, and a
version newer than the build reads is refused rather than read without what it adds."""

from __future__ import annotations

import json

import pytest

from tabletstore.data.schema import ReplicaOf, TableSchema
from tabletstore.errors import Unimplemented
from tabletstore.metadata.catalog import SCHEMA_RECORD_VERSION, TableInfo


@pytest.mark.parametrize(
    ("schema", "version"),
    [
        (TableSchema(name="t", changes=60.0, replica_of=ReplicaOf(source="e", table="t")), 5),
        (TableSchema(name="t", changes=86400.0), 4),
        (TableSchema(name="t", changes=3600.0, history=7200.0), 4),
        (TableSchema(name="t", history=7200.0), 3),
        (TableSchema(name="t"), None),
    ],
)
def test_each_schema_is_stored_at_the_version_that_holds_it(
    schema: TableSchema, version: int | None
) -> None:
    data = TableInfo("t-1", schema).to_bytes()
    assert json.loads(data).get("version") == version
    assert TableInfo.from_bytes(data).schema == schema


def test_a_newer_record_is_refused_and_a_retention_out_of_range_is_invalid() -> None:
    record = json.loads(TableInfo("t-1", TableSchema(name="t", changes=60.0)).to_bytes())
    record["version"] = SCHEMA_RECORD_VERSION + 1
    with pytest.raises(Unimplemented, match="newer than this build reads"):
        TableInfo.from_bytes(json.dumps(record).encode())
    with pytest.raises(ValueError, match="at most 7 days"):
        TableSchema(name="t", changes=8 * 86400.0)
    with pytest.raises(ValueError, match="more than 0"):
        TableSchema(name="t", changes=0.0)
