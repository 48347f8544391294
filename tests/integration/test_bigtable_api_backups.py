"""Backups through the front door, driven by the official ``google-cloud-bigtable`` client's
backup code (Google's emulator implements none of these calls: its CreateBackup crashes it).

Create (a done long-running operation), get, list per cluster and across clusters (``-``),
update the expiry, restore into a new table that reads as the table did at the backup, copy,
delete; bad input is refused with the service's status codes.
"""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

from google.api_core import exceptions as gexc
from google.cloud.bigtable import Client
from google.cloud.bigtable.data import ReadRowsQuery, SetCell

from tabletstore.bigtable_api.front_door import BackgroundServer
from tests.integration.test_bigtable_api_instances import admin, data_client

__all__ = ["admin", "data_client"]  # fixtures, used by name; they connect to ``server``


pytestmark = [
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
]


@pytest.fixture(scope="module")
def server() -> Iterator[BackgroundServer]:
    with BackgroundServer(f"memory://bk-{uuid.uuid4().hex}") as srv:
        yield srv


def _values(data_client: Any, instance: str, table: str) -> dict[bytes, bytes]:
    rows = data_client.get_table(instance, table).read_rows(ReadRowsQuery())
    return {r.row_key: r.cells[0].value for r in rows}


def _later(days: float) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days)


def test_backup_lifecycle_with_the_official_client(admin: Client, data_client: Any) -> None:
    iid = f"i-{uuid.uuid4().hex[:10]}"
    instance = admin.instance(iid)
    table = instance.table("events")
    table.create(column_families={"cf": None})
    data = data_client.get_table(iid, "events")
    data.mutate_row(b"a", SetCell("cf", b"q", b"1", 1000))
    data.mutate_row(b"b", SetCell("cf", b"q", b"2", 1000))

    backup = table.backup("nightly", cluster_id="c-one1", expire_time=_later(7))
    created = backup.create().result(timeout=60)
    assert created.name.endswith("/clusters/c-one1/backups/nightly")
    assert created.source_table.endswith(f"/instances/{iid}/tables/events")
    assert created.size_bytes > 0
    assert backup.exists()
    data.mutate_row(b"a", SetCell("cf", b"q", b"changed", 2000))

    backup.reload()
    assert backup.state == 2  # READY
    listed = [b.backup_id for b in table.list_backups()]
    assert listed == ["nightly"]
    assert [b.backup_id for b in table.list_backups(cluster_id="c-other")] == []

    new_expiry = _later(30)
    backup.update_expire_time(new_expiry)
    backup.reload()
    assert abs(backup.expire_time.seconds - new_expiry.timestamp()) < 1

    restored = backup.restore("events_restored").result(timeout=60)
    assert restored.name.endswith(f"/instances/{iid}/tables/events_restored")
    assert _values(data_client, iid, "events_restored") == {b"a": b"1", b"b": b"2"}
    with pytest.raises(gexc.AlreadyExists):
        backup.restore("events_restored").result(timeout=60)

    # The handwritten Backup class has no copy(): the generated admin client does.
    copied = admin.table_admin_client.copy_backup(
        parent=f"{instance.name}/clusters/c-two2",
        backup_id="nightly-copy",
        source_backup=backup.name,
        expire_time=_later(3),
    )
    copy = copied.result(timeout=60)
    assert copy.source_backup == backup.name
    assert sorted(b.backup_id for b in table.list_backups()) == ["nightly", "nightly-copy"]

    backup.delete()
    assert not backup.exists()
    with pytest.raises(gexc.NotFound):
        backup.restore("again").result(timeout=60)
    # The copy names the same SSTables: it still restores.
    table.backup("nightly-copy", cluster_id="c-two2").restore("from_copy").result(timeout=60)
    assert _values(data_client, iid, "from_copy") == {b"a": b"1", b"b": b"2"}


def test_bad_backup_requests(admin: Client) -> None:
    iid = f"i-{uuid.uuid4().hex[:10]}"
    table = admin.instance(iid).table("t")
    table.create(column_families={"cf": None})
    past = datetime.datetime.now(datetime.UTC) - datetime.timedelta(days=1)
    with pytest.raises(gexc.InvalidArgument):
        table.backup("old", cluster_id="c-one1", expire_time=past).create().result(timeout=60)
    missing = admin.instance(iid).table("nope")
    with pytest.raises(gexc.NotFound):
        missing.backup("b", cluster_id="c-one1", expire_time=_later(1)).create().result(60)
    ghost = table.backup("ghost", cluster_id="c-one1")
    assert not ghost.exists()
    with pytest.raises(gexc.NotFound):
        admin.table_admin_client.get_backup(name=ghost.name)
    with pytest.raises(gexc.InvalidArgument, match="filter term"):
        list(table.list_backups(filter_="size_bytes > 5"))
