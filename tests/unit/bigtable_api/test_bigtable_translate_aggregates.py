"""Aggregate families and mutations in the Cloud Bigtable front door's translation layer."""

from __future__ import annotations

import struct

import pytest

pytest.importorskip("google.cloud.bigtable")

from google.cloud.bigtable_admin_v2.types import table as admin_table
from google.cloud.bigtable_v2.types import data

from tabletstore import errors
from tabletstore.bigtable_api import translate as t
from tabletstore.bigtable_api.translate import TableName
from tabletstore.data.model import AddToCell, MergeToCell
from tabletstore.data.schema import ColumnFamily, TableSchema

M = data.Mutation.pb()
V = data.Value.pb()


def test_value_types_round_trip_through_the_admin_messages() -> None:
    families = {
        name: ColumnFamily.model_validate({"name": name, "value_type": vt})
        for name, vt in [("s", "sum"), ("lo", "min"), ("hi", "max"), ("u", "hll"), ("p", None)]
    }
    schema = TableSchema(name="t", families=families)
    pb = t.table_to_pb(TableName("p", "i", "t"), schema, 0)
    back = {fid: t.value_type_from_pb(fid, fam) for fid, fam in pb.column_families.items()}
    assert back == {"s": "sum", "lo": "min", "hi": "max", "u": "hll", "p": None}
    assert pb.column_families[
        "s"
    ].value_type.aggregate_type.input_type.int64_type.encoding.HasField("big_endian_bytes")


def test_unsupported_value_types_name_the_family() -> None:
    fam = admin_table.ColumnFamily.pb()()
    fam.value_type.string_type.SetInParent()
    with pytest.raises(errors.Unimplemented, match="'f'"):
        t.value_type_from_pb("f", fam)
    fam = admin_table.ColumnFamily.pb()()
    fam.value_type.aggregate_type.input_type.string_type.SetInParent()
    fam.value_type.aggregate_type.sum.SetInParent()
    with pytest.raises(errors.InvalidArgument, match="Int64 input"):
        t.value_type_from_pb("f", fam)


def test_add_and_merge_mutations() -> None:
    add = M(
        add_to_cell=M.AddToCell(
            family_name="s",
            column_qualifier=V(raw_value=b"q"),
            timestamp=V(raw_timestamp_micros=3000),
            input=V(int_value=-4),
        )
    )
    merge = M(
        merge_to_cell=M.MergeToCell(
            family_name="s",
            column_qualifier=V(raw_value=b"q"),
            timestamp=V(raw_timestamp_micros=3000),
            input=V(raw_value=struct.pack(">q", 9)),
        )
    )
    hll_add = M(
        add_to_cell=M.AddToCell(
            family_name="u", column_qualifier=V(raw_value=b"q"), input=V(raw_value=b"x")
        )
    )
    assert t.mutations_from_pb([add, merge, hll_add], 7000) == (
        AddToCell("s", b"q", -4, 3000),
        MergeToCell("s", b"q", struct.pack(">q", 9), 3000),
        AddToCell("u", b"q", b"x", 7000),
    )
    bad_ts = M(
        add_to_cell=M.AddToCell(
            family_name="s", timestamp=V(raw_timestamp_micros=3001), input=V(int_value=1)
        )
    )
    with pytest.raises(errors.InvalidArgument, match="millisecond"):
        t.mutations_from_pb([bad_ts], 0)
