"""Schema records (metadata/catalog.py TableInfo): a replica's schema is stored as version 6
(whatever else it holds: the highest applicable version wins), a history opt-out as version 5, a
change retention as version 4, a history window alone as version 3, a plain schema without a
version; each reads back, records written by older builds read as they did (no window: the
database's default applies), and a version newer than the build reads is refused rather than
read without what it adds."""

from __future__ import annotations

import json

import pytest

from tabletstore.data.schema import HISTORY_OFF, ReplicaOf, TableSchema
from tabletstore.errors import Unimplemented
from tabletstore.master.checkpoints import window_of
from tabletstore.metadata.catalog import SCHEMA_RECORD_VERSION, TableInfo


@pytest.mark.parametrize(
    ("schema", "version"),
    [
        (TableSchema(name="t", changes=60.0, replica_of=ReplicaOf(source="e", table="t")), 6),
        (
            TableSchema(
                name="t",
                history=HISTORY_OFF,
                changes=60.0,
                replica_of=ReplicaOf(source="e", table="t"),
            ),
            6,
        ),
        (TableSchema(name="t", history=HISTORY_OFF), 5),
        (TableSchema(name="t", history=HISTORY_OFF, changes=3600.0), 5),
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


@pytest.mark.parametrize(
    ("record", "own", "window"),
    [
        # Version 1 (no version key, no history): not set, so the default applies.
        (b'{"table_id":"t-1","schema":{"name":"t"}}', None, 86400.0),
        # Version 3: a window of its own, over the default.
        (b'{"table_id":"t-1","schema":{"name":"t","history":7200.0},"version":3}', 7200.0, 7200.0),
        # Version 4: a change retention, the history not set.
        (b'{"table_id":"t-1","schema":{"name":"t","changes":60.0},"version":4}', None, 86400.0),
        # Version 5: opted out, whatever the default.
        (b'{"table_id":"t-1","schema":{"name":"t","history":0.0},"version":5}', HISTORY_OFF, None),
    ],
)
def test_older_records_read_as_before_and_an_opt_out_keeps_no_history(
    record: bytes, own: float | None, window: float | None
) -> None:
    history = TableInfo.from_bytes(record).schema.history
    assert history == own
    assert window_of(history, 86400.0) == window
    assert window_of(history, None) == (None if own in (None, HISTORY_OFF) else own)


def test_an_opt_out_is_not_a_window_and_a_negative_window_is_invalid() -> None:
    assert TableSchema(name="t", history=HISTORY_OFF).history == HISTORY_OFF
    with pytest.raises(ValueError, match="more than 0"):
        TableSchema(name="t", history=-1.0)
