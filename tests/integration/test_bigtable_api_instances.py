"""Instances as namespaces through the front door, driven by the official clients: the
instance admin API (create, get, list, update, delete, clusters), tables kept apart per
instance, the plain instance that serves the database's own tables, and the namespace
mapping itself."""

from __future__ import annotations

import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

from google.api_core import exceptions as gexc
from google.cloud.bigtable import Client, enums
from google.cloud.bigtable.data import BigtableDataClient, ReadRowsQuery, SetCell

from tabletstore.bigtable_api.front_door import BackgroundServer
from tabletstore.bigtable_api.instances import (
    PREFIX_RE,
    REGISTRY_TABLE,
    Namespaces,
    instance_prefix,
)
from tabletstore.bigtable_api.translate import TableName
from tabletstore.data.schema import validate_table_name

PROJECT = "ns-project"
PLAIN = "plain-instance"

pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(f"memory://ns-{uuid.uuid4().hex}", plain_instance=PLAIN) as srv:
        yield srv


@pytest.fixture
def admin(server: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Client]:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", server.address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = Client(project=PROJECT, admin=True)
    yield client
    client.close()


@pytest.fixture
def data_client(server: BackgroundServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", server.address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with BigtableDataClient(project=PROJECT) as client:
            yield client


def new_instance_id() -> str:
    return f"i-{uuid.uuid4().hex[:10]}"


def test_prefixes_are_short_stable_and_distinct() -> None:
    a = instance_prefix("p", "a")
    assert a == instance_prefix("p", "a") and PREFIX_RE.match(a) and len(a) == 12
    assert len({a, instance_prefix("p", "b"), instance_prefix("q", "a")}) == 3
    # A 50-character table id under a prefix is a valid tabletstore table name.
    assert validate_table_name(a + "x" * 50)
    ns = Namespaces("plain")
    assert ns.table(TableName("p", "plain", "t")) == "t"
    assert ns.table(TableName("p", "a", "t")) == a + "t"
    stored = ["t", a + "t", a + "u", instance_prefix("p", "b") + "t", REGISTRY_TABLE]
    assert ns.table_ids("p", "a", stored) == ["t", "u"]
    assert ns.table_ids("any", "plain", stored) == ["t"]


def test_create_an_instance_then_its_tables(admin: Client, data_client: Any) -> None:
    iid = new_instance_id()
    instance = admin.instance(
        iid,
        display_name="My instance",
        instance_type=enums.Instance.Type.PRODUCTION,
        labels={"env": "test"},
    )
    assert not instance.exists()
    cluster = instance.cluster(f"{iid}-c1", location_id="us-central1-c", serve_nodes=1)
    operation = instance.create(clusters=[cluster])
    created = operation.result(timeout=30)
    assert created.name == f"projects/{PROJECT}/instances/{iid}"
    assert instance.exists()

    got = admin.instance(iid)
    got.reload()
    assert got.display_name == "My instance"
    assert got.labels == {"env": "test"}
    assert got.state == enums.Instance.State.READY
    clusters, failed = got.list_clusters()
    assert [c.cluster_id for c in clusters] == [f"{iid}-c1"] and failed == []
    assert clusters[0].location_id == "us-central1-c"

    with pytest.raises(gexc.AlreadyExists):
        admin.instance(iid).create(clusters=[cluster]).result(timeout=30)

    got.table("events").create(column_families={"cf": None})
    table = data_client.get_table(iid, "events")
    table.mutate_row(b"k", SetCell("cf", b"q", b"v", 1000))
    assert [r.row_key for r in table.read_rows(ReadRowsQuery())] == [b"k"]
    assert [t.table_id for t in got.list_tables()] == ["events"]


def test_tables_of_two_instances_are_separate(admin: Client, data_client: Any) -> None:
    a, b = new_instance_id(), new_instance_id()
    for iid in (a, b):
        admin.instance(iid).create().result(timeout=30)
    admin.instance(a).table("t").create(column_families={"cf": None})
    admin.instance(a).table("only-a").create(column_families={"cf": None})
    assert sorted(t.table_id for t in admin.instance(a).list_tables()) == ["only-a", "t"]
    assert admin.instance(b).list_tables() == []
    with pytest.raises(gexc.NotFound) as info:
        data_client.get_table(b, "t").mutate_row(b"k", SetCell("cf", b"q", b"v", 1000))
    # Errors name the table as the client does, without the instance's prefix.
    assert "'t'" in str(info.value) and instance_prefix(PROJECT, b) not in str(info.value)

    # The same table id in b is another table.
    admin.instance(b).table("t").create(column_families={"other": None})
    data_client.get_table(a, "t").mutate_row(b"k", SetCell("cf", b"q", b"in-a", 1000))
    data_client.get_table(b, "t").mutate_row(b"k", SetCell("other", b"q", b"in-b", 1000))
    row_a = data_client.get_table(a, "t").read_row(b"k")
    row_b = data_client.get_table(b, "t").read_row(b"k")
    assert [c.value for c in row_a] == [b"in-a"]
    assert [(c.family, c.value) for c in row_b] == [("other", b"in-b")]
    assert list(admin.instance(b).table("t").list_column_families()) == ["other"]

    # Deleting an instance deletes its tables, and only its tables.
    admin.instance(b).delete()
    assert not admin.instance(b).exists()
    with pytest.raises(gexc.NotFound):
        data_client.get_table(b, "t").read_row(b"k")
    assert [c.value for c in data_client.get_table(a, "t").read_row(b"k")] == [b"in-a"]
    with pytest.raises(gexc.NotFound):
        admin.instance(b).delete()


def test_list_update_and_implicit_instances(admin: Client) -> None:
    a, implicit = new_instance_id(), new_instance_id()
    admin.instance(a, display_name="before").create().result(timeout=30)
    # Emulator-era code never creates its instance: its first table records it.
    admin.instance(implicit).table("t").create(column_families={"cf": None})
    instances, failed = admin.list_instances()
    ids = {i.instance_id for i in instances}
    assert {a, implicit, PLAIN} <= ids and failed == []

    instance = admin.instance(a)
    instance.reload()
    instance.display_name = "after"
    instance.labels = {"k": "v"}
    instance.update().result(timeout=30)
    again = admin.instance(a)
    again.reload()
    assert (again.display_name, again.labels) == ("after", {"k": "v"})

    with pytest.raises(gexc.NotFound):
        admin.instance(new_instance_id()).reload()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        other = Client(project="another-project", admin=True)
    try:
        ids_other = {i.instance_id for i in other.list_instances()[0]}
    finally:
        other.close()
    assert a not in ids_other and PLAIN in ids_other


def test_the_plain_instance_serves_the_databases_own_tables(
    server: BackgroundServer, admin: Client, data_client: Any
) -> None:
    admin.instance(PLAIN).table("shared").create(column_families={"cf": None})
    data_client.get_table(PLAIN, "shared").mutate_row(b"k", SetCell("cf", b"q", b"v", 1000))
    # A prefixed instance's tables and the registry do not show up in the plain instance.
    listed = [t.table_id for t in admin.instance(PLAIN).list_tables()]
    assert "shared" in listed
    assert not any(PREFIX_RE.match(t) for t in listed) and REGISTRY_TABLE not in listed
    assert admin.instance(PLAIN).exists()
    with pytest.raises(gexc.InvalidArgument):
        admin.instance(PLAIN).delete()
    with pytest.raises(gexc.InvalidArgument):
        admin.instance(PLAIN).table(REGISTRY_TABLE).create()
