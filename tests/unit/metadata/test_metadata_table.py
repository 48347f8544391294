"""The METADATA table's layout (metadata_table.py): key ranges of the three levels, the row
codec, split intents and the epoch predicate."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tabletstore.data.filters import apply_filter
from tabletstore.data.model import Cell, Row, SetCell
from tabletstore.errors import Corruption, InvalidArgument
from tabletstore.metadata import rows as mt
from tabletstore.metadata.record import TabletRecord, metadata_row_key

table_ids = st.from_regex(r"[A-Za-z0-9_.\-]{1,64}-[0-9a-f]{12}", fullmatch=True)
rows = st.binary(max_size=40)


@given(table_ids, rows, rows)
def test_user_rows_sort_after_the_root_and_metadata_rows_inside_it(
    table_id: str, row: bytes, end: bytes
) -> None:
    assert metadata_row_key(table_id, row) > mt.ROOT_END
    assert metadata_row_key(table_id, None) > mt.ROOT_END
    assert metadata_row_key(mt.METADATA_TABLE_ID, metadata_row_key(table_id, end)) < mt.ROOT_END
    assert metadata_row_key(mt.METADATA_TABLE_ID, None) < mt.ROOT_END
    lo, hi = mt.table_range(table_id)
    assert lo < metadata_row_key(table_id, row) <= hi


def test_initial_metadata_tablets_tile_everything_after_the_root() -> None:
    k1, k2 = metadata_row_key("a-1", b"m"), metadata_row_key("b-1", b"")
    recs = mt.initial_metadata_records([k2, k1], at=1.0)
    assert [(r.start_row, r.end_row) for r in recs] == [
        (mt.ROOT_END, k1),
        (k1, k2),
        (k2, None),
    ]
    assert all(mt.level(r.table_id, r.tablet_id) == 2 for r in recs)
    assert mt.level(mt.METADATA_TABLE_ID, mt.ROOT_TABLET_ID) == 1
    assert mt.level("a-1", "t0") == 3
    assert mt.root_record(0.0).end_row == mt.ROOT_END
    with pytest.raises(InvalidArgument, match="after the root"):
        mt.initial_metadata_records([b"!metadata\x00\x01x"], at=1.0)


def _row(key: bytes, mutations: tuple[SetCell, ...], ts: int = 0) -> Row:
    cells = sorted(
        (Cell(m.family, m.qualifier, ts, m.value) for m in mutations),
        key=lambda c: (c.family, c.qualifier),
    )
    return Row(key, cells)


def test_record_and_split_intent_round_trip() -> None:
    parent = TabletRecord("web-1", "t1", b"k", b"z", epoch=7, location="w:1")
    left = TabletRecord("web-1", "t2", b"a", b"k", epoch=8)
    muts = mt.record_mutations(parent) + mt.split_mutations([left])
    assert all(m.timestamp == 0 for m in muts if isinstance(m, SetCell))
    decoded = mt.decode_row(_row(parent.row_key, muts))  # type: ignore[arg-type]
    assert decoded is not None
    assert decoded.record == parent and decoded.pending == (left,)
    assert mt.decode_row(Row(parent.row_key, [])) is None


def test_a_row_holding_another_tablets_record_is_corruption() -> None:
    rec = TabletRecord("web-1", "t1", b"", b"m")
    muts = mt.record_mutations(rec)
    with pytest.raises(Corruption, match="holds the record"):
        mt.decode_row(_row(b"web-1\x00\x02", muts))  # type: ignore[arg-type]


def test_epoch_predicate_matches_only_that_epoch() -> None:
    rec = TabletRecord("web-1", "t1", b"", None, epoch=258)
    row = _row(rec.row_key, mt.record_mutations(rec))  # type: ignore[arg-type]
    assert apply_filter(mt.epoch_is(258), row.key, row.cells)
    assert not apply_filter(mt.epoch_is(257), row.key, row.cells)
    assert not apply_filter(mt.epoch_is(2), row.key, row.cells)


def test_metadata_schema_keeps_one_version_in_memory() -> None:
    schema = mt.metadata_schema()
    fam = schema.families[mt.FAMILY]
    assert schema.name == mt.METADATA_TABLE
    assert schema.locality_groups[fam.locality_group].in_memory
    assert fam.gc_rule is not None
