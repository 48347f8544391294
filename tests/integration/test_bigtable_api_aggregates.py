"""Aggregate column families through the Cloud Bigtable front door and the official Python
clients, compared with Google's ``cbtemulator``.

What the emulator (the one installed here) supports, found by trying: it creates Int64
``sum``, ``min`` and ``max`` families and ``hllpp_unique_count`` ones and describes them in
GetTable; it sums ``AddToCell`` inputs (``int_value``) and ``MergeToCell`` states (8 big-endian
bytes as ``raw_value``); but its ``min`` and ``max`` keep the *last* input written to a cell
(adds of 5, -3, 2 read back 2 in both), it refuses every input to an hll family ("only int64
values are supported"), and a ``SetCell`` to an aggregate family crashes it. So the
differential part compares the schemas and ``sum`` families under random adds, merges,
deletions and plain writes; ``min``, ``max`` (unit tests) and hll families and the refusals are
checked against tabletstore alone.
"""

from __future__ import annotations

import random
import struct
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

from google.api_core import exceptions as gexc
from google.cloud.bigtable import Client
from google.cloud.bigtable.data import (
    AddToCell,
    BigtableDataClient,
    DeleteAllFromFamily,
    DeleteAllFromRow,
    DeleteRangeFromColumn,
    ReadRowsQuery,
    SetCell,
)
from google.cloud.bigtable.data.mutations import Mutation
from google.cloud.bigtable_admin_v2.types import ColumnFamily, Table, Type

from tabletstore.bigtable_api.front_door import BackgroundServer
from tabletstore.data import hll
from tests.integration.test_bigtable_api_differential import EMULATOR, cbtemulator

__all__ = ["cbtemulator"]  # fixture used by name

PROJECT, INSTANCE = "agg-project", "agg-instance"
KEYS = [b"r%d" % i for i in range(4)]
QUALS = [b"q0", b"q1"]
TIMES = [1000 * i for i in range(1, 5)]

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

_I64 = Type(int64_type=Type.Int64(encoding=Type.Int64.Encoding(big_endian_bytes={})))


def int_family(op: str) -> ColumnFamily:
    agg = {"sum": {"sum": {}}, "min": {"min_": {}}, "max": {"max_": {}}}[op]
    return ColumnFamily(value_type=Type(aggregate_type=Type.Aggregate(input_type=_I64, **agg)))


HLL_FAMILY = ColumnFamily(
    value_type=Type(
        aggregate_type=Type.Aggregate(
            input_type=Type(bytes_type={}),
            hllpp_unique_count=Type.Aggregate.HyperLogLogPlusPlusUniqueCount(),
        )
    )
)


class MergeToCell(Mutation):
    """The data client has no MergeToCell class: the request's dict form."""

    def __init__(self, family: str, qualifier: bytes, state: bytes, timestamp_micros: int) -> None:
        self.d = {
            "merge_to_cell": {
                "family_name": family,
                "column_qualifier": {"raw_value": qualifier},
                "timestamp": {"raw_timestamp_micros": timestamp_micros},
                "input": {"raw_value": state},
            }
        }

    def _to_dict(self) -> dict[str, Any]:
        return self.d

    def is_idempotent(self) -> bool:
        return False


class RawAdd(MergeToCell):
    """AddToCell with a bytes input (an hll family), which the data client cannot build."""

    def __init__(self, family: str, qualifier: bytes, value: bytes, timestamp_micros: int) -> None:
        super().__init__(family, qualifier, value, timestamp_micros)
        self.d = {"add_to_cell": self.d["merge_to_cell"]}


class Backend:
    def __init__(
        self, host: str, monkeypatch: pytest.MonkeyPatch, table_id: str, *, hll_family: bool
    ) -> None:
        monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", host)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.admin = Client(project=PROJECT, admin=True)
            self.data = BigtableDataClient(project=PROJECT)
        families = {
            "s": int_family("sum"),
            "lo": int_family("min"),
            "hi": int_family("max"),
            "p": ColumnFamily(),
        }
        if hll_family:
            families["u"] = HLL_FAMILY
        self.name = f"projects/{PROJECT}/instances/{INSTANCE}/tables/{table_id}"
        self.table_admin = self.admin.table_admin_client
        self.table_admin.create_table(
            parent=f"projects/{PROJECT}/instances/{INSTANCE}",
            table_id=table_id,
            table=Table(column_families=families),
        )
        self.table = self.data.get_table(INSTANCE, table_id)

    def value_types(self) -> dict[str, Any]:
        got = self.table_admin.get_table(name=self.name)
        return {fid: Type.pb(fam.value_type) for fid, fam in got.column_families.items()}

    def read(self) -> list[tuple[bytes, list[tuple[str, bytes, int, bytes]]]]:
        # Sorted by family: the emulator orders a row's families arbitrarily.
        return [
            (
                r.row_key,
                sorted(
                    [(c.family, c.qualifier, c.timestamp_micros, c.value) for c in r.cells],
                    key=lambda c: (c[0], c[1], -c[2]),
                ),
            )
            for r in self.table.read_rows(ReadRowsQuery())
        ]

    def close(self) -> None:
        self.data.close()
        self.admin.close()


@pytest.fixture(scope="module")
def front_door() -> Iterator[str]:
    with BackgroundServer(f"memory://agg-{uuid.uuid4().hex}") as server:
        yield server.address


def rand_mutation(rng: random.Random) -> Any:
    kind = rng.choices(
        ["add", "merge", "del_col", "del_fam", "del_row", "set"], [10, 3, 2, 1, 1, 2]
    )[0]
    fam = "s"  # the emulator's min and max do not aggregate (module docstring)
    q, ts = rng.choice(QUALS), rng.choice(TIMES)
    if kind == "add":
        return AddToCell(fam, q, rng.randint(-1000, 1000), ts)
    if kind == "merge":
        return MergeToCell(fam, q, struct.pack(">q", rng.randint(-1000, 1000)), ts)
    if kind == "del_col":
        start = rng.choice([None, *TIMES])
        end = rng.choice([None, *[t for t in TIMES if start is None or t > start]])
        return DeleteRangeFromColumn(fam, q, start, end)
    if kind == "del_fam":
        return DeleteAllFromFamily(fam)
    if kind == "del_row":
        return DeleteAllFromRow()
    return SetCell("p", q, b"plain", ts)


@pytest.mark.skipif(not EMULATOR.exists(), reason="cbtemulator is not installed")
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_int64_aggregates_read_like_the_emulator(
    seed: int, cbtemulator: str, front_door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_id = f"agg-{seed}-{uuid.uuid4().hex[:8]}"
    emulator = Backend(cbtemulator, monkeypatch, table_id, hll_family=False)
    ours = Backend(front_door, monkeypatch, table_id, hll_family=False)
    rng = random.Random(seed)
    try:
        assert ours.value_types() == emulator.value_types()
        for step in range(40):
            row = rng.choice(KEYS)
            muts = [rand_mutation(rng) for _ in range(rng.randint(1, 3))]
            emulator.table.mutate_row(row, muts)
            ours.table.mutate_row(row, muts)
            if step % 10 == 9:
                assert ours.read() == emulator.read(), f"seed {seed} step {step}"
        assert ours.read() == emulator.read()
    finally:
        emulator.close()
        ours.close()


def test_hll_families_and_refusals_through_the_front_door(
    front_door: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ours = Backend(front_door, monkeypatch, f"hll-{uuid.uuid4().hex[:8]}", hll_family=True)
    try:
        types = ours.value_types()
        assert types["u"].aggregate_type.HasField("hllpp_unique_count")
        assert types["s"].aggregate_type.HasField("sum")
        for i in range(300):
            ours.table.mutate_row(b"page", [RawAdd("u", b"day", b"user-%d" % (i % 120), 5000)])
        other = hll.add_values([b"user-%d" % i for i in range(100, 150)])
        ours.table.mutate_row(b"page", [MergeToCell("u", b"day", other, 5000)])
        for v in (5, -3, 2):
            ours.table.mutate_row(
                b"page", [AddToCell("lo", b"day", v, 5000), AddToCell("hi", b"day", v, 5000)]
            )
        row = ours.table.read_row(b"page")
        assert row is not None
        cells = {c.family: c.value for c in row.cells}
        assert abs(hll.estimate(cells["u"]) - 150) <= 3
        assert cells["lo"] == struct.pack(">q", -3) and cells["hi"] == struct.pack(">q", 5)
        with pytest.raises(gexc.InvalidArgument, match="aggregate family"):
            ours.table.mutate_row(b"page", [SetCell("s", b"q", b"x", 1000)])
        with pytest.raises(gexc.InvalidArgument, match="p has no value type"):
            ours.table.mutate_row(b"page", [AddToCell("p", b"q", 1, 1000)])
        with pytest.raises(gexc.InvalidArgument, match="millisecond"):
            ours.table.mutate_row(b"page", [AddToCell("s", b"q", 1, 1001)])
        # The value type of a family cannot change.
        with pytest.raises(gexc.InvalidArgument, match="cannot change"):
            from google.cloud.bigtable_admin_v2.types import ModifyColumnFamiliesRequest

            ours.table_admin.modify_column_families(
                name=ours.name,
                modifications=[
                    ModifyColumnFamiliesRequest.Modification(id="s", update=int_family("max"))
                ],
            )
    finally:
        ours.close()
