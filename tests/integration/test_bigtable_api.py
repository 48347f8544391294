"""The Bigtable API front door driven by the official clients: the legacy ``Client``/``Table``,
the ``google.cloud.bigtable.data`` sync and async clients, ``google-cloud-happybase`` and
``cbt``; plus errors, UNIMPLEMENTED methods, resumed ReadRows and a real subprocess.

The front door runs over an in-memory database on a background thread (module fixture) with
tiny chunk and response sizes, so every multi-chunk code path of the clients is exercised.
"""

from __future__ import annotations

import datetime
import os
import shutil
import signal
import subprocess
import sys
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

import grpc
from google.api_core import exceptions as gexc
from google.cloud.bigtable import Client, column_family
from google.cloud.bigtable import row_filters as legacy_filters
from google.cloud.bigtable.data import (
    BigtableDataClient,
    BigtableDataClientAsync,
    DeleteAllFromFamily,
    DeleteAllFromRow,
    DeleteRangeFromColumn,
    MutationsExceptionGroup,
    ReadRowsQuery,
    RowMutationEntry,
    RowRange,
    SetCell,
)
from google.cloud.bigtable.data import row_filters as rf
from google.cloud.bigtable.data.read_modify_write_rules import (
    AppendValueRule,
    IncrementRule,
)

from tabletstore.bigtable_api.front_door import BackgroundServer

PROJECT, INSTANCE = "test-project", "test-instance"
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::PendingDeprecationWarning"),
]


@pytest.fixture(scope="module")
def front_door() -> Iterator[BackgroundServer]:
    server = BackgroundServer(
        f"memory://bigtable-api-{uuid.uuid4().hex}", max_value_chunk=1000, max_response_bytes=4096
    )
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def emulator_host(front_door: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", front_door.address)
    return front_door.address


@pytest.fixture
def admin(emulator_host: str) -> Iterator[Client]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = Client(project=PROJECT, admin=True)
    yield client
    client.close()


@pytest.fixture
def data_client(emulator_host: str) -> Iterator[BigtableDataClient]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = BigtableDataClient(project=PROJECT)
    yield client
    client.close()


def new_table(admin: Client, families: dict[str, Any] | None = None, **kw: Any) -> Any:
    table = admin.instance(INSTANCE).table(f"t-{uuid.uuid4().hex[:12]}")
    table.create(column_families=families if families is not None else {"cf": None}, **kw)
    return table


def ms(n: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(n / 1000, tz=datetime.UTC)


def cells(row: Any) -> list[tuple[str, bytes, int, bytes, list[str]]]:
    """(family, qualifier, timestamp_micros, value, labels) of a data-client Row."""
    return [(c.family, c.qualifier, c.timestamp_micros, c.value, list(c.labels)) for c in row]


# -- legacy Client / Table ---------------------------------------------------------------------
def test_legacy_admin_tables_and_families(admin: Client) -> None:
    table = new_table(
        admin,
        {
            "keep2": column_family.MaxVersionsGCRule(2),
            "week": column_family.MaxAgeGCRule(datetime.timedelta(days=7)),
            "both": column_family.GCRuleUnion(
                [
                    column_family.MaxVersionsGCRule(1),
                    column_family.MaxAgeGCRule(datetime.timedelta(hours=1)),
                ]
            ),
            "plain": None,
        },
    )
    assert table.exists()
    assert table.table_id in [t.table_id for t in admin.instance(INSTANCE).list_tables()]
    fams = table.list_column_families()
    assert set(fams) == {"keep2", "week", "both", "plain"}
    assert fams["keep2"].gc_rule == column_family.MaxVersionsGCRule(2)
    assert fams["week"].gc_rule == column_family.MaxAgeGCRule(datetime.timedelta(days=7))
    assert fams["plain"].gc_rule is None

    new = table.column_family("extra", gc_rule=column_family.MaxVersionsGCRule(3))
    new.create()
    table.column_family("extra", gc_rule=column_family.MaxVersionsGCRule(1)).update()
    assert table.list_column_families()["extra"].gc_rule == column_family.MaxVersionsGCRule(1)
    table.column_family("plain").delete()
    assert "plain" not in table.list_column_families()
    with pytest.raises(gexc.AlreadyExists):
        table.create(column_families={"cf": None})
    table.delete()
    assert not table.exists()
    with pytest.raises(gexc.NotFound):
        table.delete()


def test_legacy_gc_rules_are_enforced_on_read(admin: Client) -> None:
    table = new_table(admin, {"keep2": column_family.MaxVersionsGCRule(2)})
    for i in range(1, 5):
        row = table.direct_row(b"r")
        row.set_cell("keep2", b"q", b"v%d" % i, timestamp=ms(i))
        row.commit()
    got = table.read_row(b"r").cells["keep2"][b"q"]
    assert [c.value for c in got] == [b"v4", b"v3"]


def test_legacy_data_path(admin: Client) -> None:
    table = new_table(admin, {"cf": None, "cg": None})
    rows = []
    for i in range(20):
        row = table.direct_row(b"row-%02d" % i)
        row.set_cell("cf", b"q", b"value-%d" % i, timestamp=ms(1000 + i))
        row.set_cell("cg", b"big", b"x" * (2500 + i))  # split across chunks by the front door
        rows.append(row)
    statuses = table.mutate_rows(rows)
    assert all(s.code == 0 for s in statuses)

    one = table.read_row(b"row-03")
    assert one.cells["cf"][b"q"][0].value == b"value-3"
    assert one.cells["cf"][b"q"][0].timestamp == ms(1003)
    assert one.cells["cg"][b"big"][0].value == b"x" * 2503
    assert table.read_row(b"missing") is None

    scanned = list(table.read_rows(start_key=b"row-05", end_key=b"row-10", limit=3))
    assert [r.row_key for r in scanned] == [b"row-05", b"row-06", b"row-07"]
    only_cf = list(table.read_rows(filter_=legacy_filters.FamilyNameRegexFilter("cf")))
    assert len(only_cf) == 20 and all(set(r.cells) == {"cf"} for r in only_cf)

    # check-and-mutate
    cond = table.conditional_row(b"row-01", filter_=legacy_filters.ValueRegexFilter(b"value-1"))
    cond.set_cell("cf", b"matched", b"yes", state=True)
    cond.set_cell("cf", b"matched", b"no", state=False)
    assert cond.commit() is True
    assert table.read_row(b"row-01").cells["cf"][b"matched"][0].value == b"yes"

    # read-modify-write
    app = table.append_row(b"counter")
    app.increment_cell_value("cf", b"n", 5)
    app.append_cell_value("cf", b"s", b"ab")
    result = app.commit()
    assert result["cf"][b"n"][0][0] == (5).to_bytes(8, "big")
    assert result["cf"][b"s"][0][0] == b"ab"

    # deletes
    d = table.direct_row(b"row-02")
    d.delete_cells("cg", [b"big"])
    d.commit()
    assert set(table.read_row(b"row-02").cells) == {"cf"}
    d = table.direct_row(b"row-02")
    d.delete()
    d.commit()
    assert table.read_row(b"row-02") is None

    keys = [s.row_key for s in table.sample_row_keys()]
    assert keys[-1] == b""


def test_legacy_drop_row_range_and_consistency(admin: Client) -> None:
    table = new_table(admin)
    rows = []
    for prefix in (b"a", b"b"):
        for i in range(30):
            row = table.direct_row(prefix + b"-%02d" % i)
            row.set_cell("cf", b"q", b"v", timestamp=ms(1))
            rows.append(row)
    table.mutate_rows(rows)
    table.drop_by_prefix(b"a-")
    assert {r.row_key[:1] for r in table.read_rows()} == {b"b"}
    table.truncate()
    assert list(table.read_rows()) == []

    api = admin.table_admin_client
    token = api.generate_consistency_token(name=table.name).consistency_token
    assert api.check_consistency(name=table.name, consistency_token=token).consistent


# -- data client (sync) ------------------------------------------------------------------------
def test_data_client_mutations_filters_and_transactions(
    admin: Client, data_client: BigtableDataClient
) -> None:
    table_id = new_table(admin, {"cf": None, "cg": None}).table_id
    table = data_client.get_table(INSTANCE, table_id)
    table.mutate_row(
        b"r1",
        [
            SetCell("cf", b"a", b"1", timestamp_micros=1000),
            SetCell("cf", b"a", b"2", timestamp_micros=2000),
            SetCell("cf", b"a", b"3", timestamp_micros=3000),
            SetCell("cf", b"b", b"hello", timestamp_micros=1000),
            SetCell("cg", b"c", b"world", timestamp_micros=1000),
        ],
    )
    assert cells(table.read_row(b"r1", row_filter=rf.CellsColumnLimitFilter(1))) == [
        ("cf", b"a", 3000, b"3", []),
        ("cf", b"b", 1000, b"hello", []),
        ("cg", b"c", 1000, b"world", []),
    ]
    # delete_from_column with a time range: [2000, 3000) removes only version 2000.
    table.mutate_row(b"r1", [DeleteRangeFromColumn("cf", b"a", 2000, 3000)])
    assert [
        c.value for c in table.read_row(b"r1", row_filter=rf.ColumnQualifierRegexFilter(b"a"))
    ] == [
        b"3",
        b"1",
    ]
    labelled = table.read_row(
        b"r1",
        row_filter=rf.RowFilterChain(
            [
                rf.FamilyNameRegexFilter("cg"),
                rf.StripValueTransformerFilter(True),
                rf.ApplyLabelFilter("seen"),
            ]
        ),
    )
    assert cells(labelled) == [("cg", b"c", 1000, b"", ["seen"])]
    # Server timestamps are milliseconds.
    table.mutate_row(b"r2", [SetCell("cf", b"now", b"x")])
    (now_cell,) = table.read_row(b"r2")
    assert now_cell.timestamp_micros % 1000 == 0 and now_cell.timestamp_micros > 1.6e15

    assert table.check_and_mutate_row(
        b"r1",
        rf.ValueRegexFilter(b"hel.*"),
        true_case_mutations=[DeleteAllFromFamily("cg")],
        false_case_mutations=[SetCell("cg", b"c", b"not-matched")],
    )
    assert {c.family for c in table.read_row(b"r1")} == {"cf"}
    assert not table.check_and_mutate_row(b"absent", None, true_case_mutations=[DeleteAllFromRow()])
    assert not table.row_exists(b"absent")

    counter = table.read_modify_write_row(
        b"ctr", [IncrementRule("cf", b"n", 41), IncrementRule("cf", b"n", 1)]
    )
    assert cells(counter)[0][3] == (42).to_bytes(8, "big")
    appended = table.read_modify_write_row(b"ctr", AppendValueRule("cf", b"s", b"tail"))
    assert [c.value for c in appended] == [b"tail"]

    table.mutate_row(b"r1", DeleteAllFromRow())
    assert table.read_row(b"r1") is None


def test_data_client_bulk_mutations_report_per_entry_failures(
    admin: Client, data_client: BigtableDataClient
) -> None:
    table = data_client.get_table(INSTANCE, new_table(admin).table_id)
    entries = [
        RowMutationEntry(b"k%d" % i, [SetCell("cf", b"q", b"v%d" % i, timestamp_micros=1000)])
        for i in range(5)
    ]
    entries[2] = RowMutationEntry(b"k2", [SetCell("nosuchfamily", b"q", b"v")])
    with pytest.raises(MutationsExceptionGroup) as info:
        table.bulk_mutate_rows(entries)
    (failed,) = info.value.exceptions
    assert failed.index == 2
    assert isinstance(failed.__cause__, gexc.NotFound)
    assert [r.row_key for r in table.read_rows(ReadRowsQuery())] == [b"k0", b"k1", b"k3", b"k4"]


def test_data_client_reads_row_sets_limits_and_large_values(
    admin: Client, data_client: BigtableDataClient
) -> None:
    table = data_client.get_table(INSTANCE, new_table(admin).table_id)
    big = bytes(range(256)) * 400  # 100 KiB: split into 1000-byte chunks by the front door
    with table.mutations_batcher() as batcher:
        for i in range(50):
            batcher.append(
                RowMutationEntry(
                    b"row-%03d" % i,
                    [
                        SetCell("cf", b"q", b"%d" % i, 1000),
                        SetCell("cf", b"z", big if i == 7 else b"", 1000),
                    ],
                )
            )
    assert len(list(table.read_rows(ReadRowsQuery()))) == 50
    q = ReadRowsQuery(
        row_keys=[b"row-001", b"row-040", b"nope"],
        row_ranges=[
            RowRange(b"row-005", b"row-008"),
            RowRange(b"row-045", None, start_is_inclusive=False),
        ],
    )
    got = [r.row_key for r in table.read_rows(q)]
    assert got == [b"row-001", b"row-005", b"row-006", b"row-007", b"row-040"] + [
        b"row-%03d" % i for i in range(46, 50)
    ]
    assert [r.row_key for r in table.read_rows(ReadRowsQuery(limit=4))] == [
        b"row-%03d" % i for i in range(4)
    ]
    assert table.read_row(b"row-007").get_cells("cf", b"z")[0].value == big
    # A limit counts rows that survive the filter.
    only_even = ReadRowsQuery(limit=3, row_filter=rf.RowKeyRegexFilter(rb"row-\d\d[02468]"))
    assert [r.row_key for r in table.read_rows(only_even)] == [b"row-000", b"row-002", b"row-004"]
    shards = table.sample_row_keys()
    assert shards[-1][0] == b""
    sharded = table.read_rows_sharded(
        [ReadRowsQuery(row_ranges=[RowRange(b"row-010", b"row-020")])]
    )
    assert len(sharded) == 10


def test_data_client_errors(admin: Client, data_client: BigtableDataClient) -> None:
    with pytest.raises(gexc.NotFound):
        data_client.get_table(INSTANCE, "no-such-table").read_row(b"k")
    table = data_client.get_table(INSTANCE, new_table(admin).table_id)
    with pytest.raises(gexc.InvalidArgument, match="millisecond"):
        table.mutate_row(b"k", SetCell("cf", b"q", b"v", timestamp_micros=1001))
    with pytest.raises(gexc.InvalidArgument, match="regex"):
        table.read_row(b"k", row_filter=rf.RowKeyRegexFilter(b"("))
    with pytest.raises(gexc.InvalidArgument):
        table.read_row(b"k", row_filter=rf.CellsRowLimitFilter(0))


# -- data client (async) -----------------------------------------------------------------------
async def test_async_data_client(admin: Client, emulator_host: str) -> None:
    table_id = new_table(admin).table_id
    async with BigtableDataClientAsync(project=PROJECT) as client:
        table = client.get_table(INSTANCE, table_id)
        await table.bulk_mutate_rows(
            [RowMutationEntry(b"a%d" % i, SetCell("cf", b"q", b"%d" % i, 2000)) for i in range(12)]
        )
        rows = await table.read_rows(ReadRowsQuery(row_ranges=RowRange(b"a1", b"a3")))
        assert [r.row_key for r in rows] == [b"a1", b"a10", b"a11", b"a2"]
        stream = await table.read_rows_stream(ReadRowsQuery(limit=5))
        assert len([r async for r in stream]) == 5
        assert await table.check_and_mutate_row(
            b"a1", rf.PassAllFilter(True), true_case_mutations=SetCell("cf", b"x", b"y", 2000)
        )
        row = await table.read_modify_write_row(b"a1", IncrementRule("cf", b"n", 7))
        assert row.cells[0].value == (7).to_bytes(8, "big")
        assert await table.row_exists(b"a5")
        assert (await table.sample_row_keys())[-1][0] == b""


# -- happybase ---------------------------------------------------------------------------------
def test_happybase(admin: Client) -> None:
    happybase = pytest.importorskip("google.cloud.happybase")
    conn = happybase.Connection(instance=admin.instance(INSTANCE))
    name = f"hb-{uuid.uuid4().hex[:10]}"
    conn.create_table(name, {"cf": {"max_versions": 3}, "meta": {}})
    assert name in conn.tables()
    table = conn.table(name)
    table.put(b"row1", {b"cf:a": b"1", b"cf:b": b"2", b"meta:m": b"x"})
    table.put(b"row2", {b"cf:a": b"3"})
    table.put(b"row3", {b"cf:a": b"5"}, timestamp=1000)
    table.put(b"row3", {b"cf:a": b"6"}, timestamp=2000)
    assert table.row(b"row1") == {b"cf:a": b"1", b"cf:b": b"2", b"meta:m": b"x"}
    assert table.row(b"row1", columns=[b"cf"]) == {b"cf:a": b"1", b"cf:b": b"2"}
    assert dict(table.rows([b"row1", b"row2"], columns=[b"cf:a"])) == {
        b"row1": {b"cf:a": b"1"},
        b"row2": {b"cf:a": b"3"},
    }
    assert table.cells(b"row3", b"cf:a", include_timestamp=True) == [(b"6", 2000), (b"5", 1000)]
    assert [k for k, _ in table.scan(row_start=b"row2")] == [b"row2", b"row3"]
    assert [k for k, _ in table.scan(row_prefix=b"row", limit=2)] == [b"row1", b"row2"]
    assert [k for k, _ in table.scan(columns=[b"meta"])] == [b"row1"]
    assert [k for k, _ in table.scan(filter=legacy_filters.ValueRegexFilter(b"[35]"))] == [
        b"row2",
        b"row3",
    ]
    with table.batch() as b:
        b.put(b"row4", {b"cf:a": b"7"})
        b.delete(b"row1")
    assert table.row(b"row1") == {}
    assert table.row(b"row4") == {b"cf:a": b"7"}
    assert table.counter_inc(b"ctr", b"cf:n", 5) == 5
    assert table.counter_dec(b"ctr", b"cf:n", 2) == 3
    assert table.counter_get(b"ctr", b"cf:n") == 3
    table.counter_set(b"ctr", b"cf:n", 10)
    assert table.counter_get(b"ctr", b"cf:n") == 10
    conn.delete_table(name, disable=True)
    assert name not in conn.tables()


# -- cbt ---------------------------------------------------------------------------------------
CBT = shutil.which("cbt")


@pytest.mark.skipif(CBT is None, reason="cbt is not installed")
def test_cbt(emulator_host: str) -> None:
    def cbt(*args: str) -> str:
        proc = subprocess.run(
            [CBT or "cbt", "-project", PROJECT, "-instance", INSTANCE, *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "BIGTABLE_EMULATOR_HOST": emulator_host},
        )
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    name = f"cbt-{uuid.uuid4().hex[:10]}"
    cbt("createtable", name)
    cbt("createfamily", name, "fam")
    cbt("set", name, "r1", "fam:col=hello", "fam:c2=x")
    cbt("set", name, "r2", "fam:col=world")
    assert name in cbt("ls").split()
    out = cbt("read", name)
    assert '"hello"' in out and '"world"' in out and "fam:c2" in out
    looked = cbt("lookup", name, "r1")
    assert '"hello"' in looked and '"world"' not in looked
    assert cbt("count", name).strip() == "2"
    cbt("deletetable", name)
    assert name not in cbt("ls").split()


# -- protocol edges ----------------------------------------------------------------------------
def test_unimplemented_and_malformed_requests_never_break_the_server(emulator_host: str) -> None:
    with grpc.insecure_channel(emulator_host) as channel:
        for path in (
            "/google.bigtable.v2.Bigtable/ExecuteQuery",
            "/google.bigtable.admin.v2.BigtableTableAdmin/SnapshotTable",
            "/google.bigtable.admin.v2.BigtableInstanceAdmin/CreateAppProfile",
        ):
            call = channel.unary_unary(path)
            with pytest.raises(grpc.RpcError) as info:
                call(b"", timeout=10)
            assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED, path
        streaming = channel.unary_stream("/google.bigtable.v2.Bigtable/ReadChangeStream")
        with pytest.raises(grpc.RpcError) as info:
            list(streaming(b"", timeout=10))  # no table name
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # Bytes that are not a ReadRowsRequest, and a request for a bad table name.
        read = channel.unary_stream("/google.bigtable.v2.Bigtable/ReadRows")
        with pytest.raises(grpc.RpcError) as info:
            list(read(b"\xff\xff\xff", timeout=10))
        assert info.value.code() != grpc.StatusCode.OK
        from google.cloud.bigtable_v2.types import bigtable as bt

        bad = bt.ReadRowsRequest.pb()(table_name="not/a/table").SerializeToString()
        with pytest.raises(grpc.RpcError) as info:
            list(read(bad, timeout=10))
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        ping = channel.unary_unary(
            "/google.bigtable.v2.Bigtable/PingAndWarm",
            request_serializer=bt.PingAndWarmRequest.pb().SerializeToString,
            response_deserializer=bt.PingAndWarmResponse.pb().FromString,
        )
        ping(
            bt.PingAndWarmRequest.pb()(name=f"projects/{PROJECT}/instances/{INSTANCE}"), timeout=10
        )


def test_a_scan_the_client_abandons_mid_stream_is_no_server_error(
    admin: Client,
    data_client: BigtableDataClient,
    emulator_host: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """ReadRows is served by a unary handler that writes each response (server.py): a client
    that stops reading and cancels is gRPC's business, not an error the front door logs, and
    the next calls are served as usual."""
    from google.cloud.bigtable_v2.types import bigtable as bt

    legacy = new_table(admin)
    table = data_client.get_table(INSTANCE, legacy.table_id)
    table.bulk_mutate_rows(
        [RowMutationEntry(b"k%04d" % i, [SetCell("cf", b"q", b"x" * 2000)]) for i in range(300)]
    )
    request = bt.ReadRowsRequest.pb()(table_name=legacy.name).SerializeToString()
    with grpc.insecure_channel(emulator_host) as channel:
        read = channel.unary_stream("/google.bigtable.v2.Bigtable/ReadRows")
        for _ in range(3):
            stream = read(request, timeout=30)
            first = bt.ReadRowsResponse.pb().FromString(next(stream))
            assert first.chunks[0].row_key == b"k0000"
            stream.cancel()
        # An empty result is one empty response; then the stream ends OK.
        empty = bt.ReadRowsRequest.pb()(table_name=legacy.name)
        empty.rows.row_keys.append(b"missing")
        assert [
            bt.ReadRowsResponse.pb().FromString(r)
            for r in read(empty.SerializeToString(), timeout=30)
        ] == [bt.ReadRowsResponse.pb()()]
    assert len(table.read_rows(ReadRowsQuery())) == 300
    assert not [r for r in caplog.records if "unexpectedly" in r.getMessage()]


async def test_read_rows_resumes_after_a_broken_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client retries an UNAVAILABLE stream from after the last row it got; every row
    arrives once, in order."""
    from tabletstore.bigtable_api.front_door import BigtableApiServer
    from tabletstore.data.model import RowMutation
    from tabletstore.data.model import SetCell as TsSetCell
    from tabletstore.embedded import Database
    from tabletstore.errors import Unavailable

    db = await Database.open(f"memory://resume-{uuid.uuid4().hex}")
    table = await db.create_table("t", ["cf"])
    await table.mutate_rows(
        [RowMutation(b"k%03d" % i, (TsSetCell("cf", b"q", b"v" * 100, 1000),)) for i in range(60)]
    )
    server = BigtableApiServer(db, max_response_bytes=1000, plain_instance=INSTANCE)
    original = server.data.read_rows
    requests: list[Any] = []

    async def flaky(req: Any) -> Any:
        requests.append(req)
        sent = 0
        async for resp in original(req):
            yield resp
            sent += 1
            if len(requests) == 1 and sent == 3:
                raise Unavailable("injected: the tablet server went away")

    server.data.read_rows = flaky  # type: ignore[method-assign]
    await server.start()
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", server.address)
    try:
        async with BigtableDataClientAsync(project=PROJECT) as client:
            rows = await client.get_table(INSTANCE, "t").read_rows(ReadRowsQuery(limit=50))
        assert [r.row_key for r in rows] == [b"k%03d" % i for i in range(50)]
        assert len(requests) == 2
        # The retry asks only for what is left: after the last row received, fewer rows.
        resumed = requests[1]
        after = resumed.rows.row_ranges[0].start_key_open
        assert b"k000" <= after < b"k049"
        assert resumed.rows_limit == 50 - (int(after[1:]) + 1)
    finally:
        await server.stop()
        await db.close()


# -- a real subprocess -------------------------------------------------------------------------
@pytest.mark.slow
def test_subprocess_serves_and_persists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``tabletstore bigtable-api --port 0`` prints its address, serves a file database, stops
    cleanly on SIGTERM, and a second run over the same directory sees the data."""

    def start() -> tuple[subprocess.Popen[str], str]:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tabletstore.cli.main",
                "bigtable-api",
                "--url",
                f"file://{tmp_path}",
                "--port",
                "0",
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline()  # blocks until the server prints, or exits
        assert line.startswith("bigtable-api listening on "), line + (
            proc.stderr.read() if proc.stderr else ""
        )
        return proc, line.rsplit(" ", 1)[1].strip()

    def stop(proc: subprocess.Popen[str]) -> None:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0

    proc, address = start()
    try:
        monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", address)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            admin = Client(project=PROJECT, admin=True)
            admin.instance(INSTANCE).table("persisted").create(column_families={"cf": None})
            with BigtableDataClient(project=PROJECT) as client:
                client.get_table(INSTANCE, "persisted").mutate_row(
                    b"k", SetCell("cf", b"q", b"v", 5000)
                )
            admin.close()
    finally:
        stop(proc)

    proc, address = start()
    try:
        monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", address)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with BigtableDataClient(project=PROJECT) as client:
                row = client.get_table(INSTANCE, "persisted").read_row(b"k")
        assert row is not None and cells(row) == [("cf", b"q", 5000, b"v", [])]
    finally:
        stop(proc)
