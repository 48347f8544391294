"""The chaos harness's location poller (testing/chaos/runner.py ``_Poller``): when it counts
every chaos tablet served, which the heal wait and the final reads rely on."""

from __future__ import annotations

from dataclasses import dataclass

from tabletstore.coordination import paths
from tabletstore.coordination.memory import MemoryCoordinator
from tabletstore.metadata.catalog import Catalog
from tabletstore.metadata.record import TabletRecord
from tabletstore.testing.chaos.history import History
from tabletstore.testing.chaos.runner import _Poller
from tabletstore.testing.chaos.workload import SPLIT_KEYS

TABLE = "chaos-0123456789ab"


@dataclass
class _Locations:
    records: list[TabletRecord]

    async def tablets(self, table_id: str, *, refresh: bool = False) -> list[TabletRecord]:
        assert table_id == TABLE and refresh
        return self.records


@dataclass
class _Client:
    catalog: Catalog
    locations: _Locations


def _records(location: str) -> list[TabletRecord]:
    bounds = [b"", *SPLIT_KEYS, None]
    return [
        TabletRecord(TABLE, f"t{i:05d}", bounds[i] or b"", bounds[i + 1], location=location)
        for i in range(len(SPLIT_KEYS) + 1)
    ]


async def test_a_tablet_counts_served_only_with_its_claim_held_by_the_live_worker_there() -> None:
    """A load that took the tablet's epoch (its METADATA location now names the loader) but
    then failed and released its claim leaves the tablet served nowhere, though its location
    is a live worker's address: the stuck seed-34 run's poller counted such tablets served and
    let the final reads start against them."""
    coord = MemoryCoordinator()
    try:
        await coord.put(paths.server("w-new"), b"127.0.0.1:1000")
        records = _records("127.0.0.1:1000")
        poller = _Poller(
            _Client(Catalog(coord), _Locations(records)),  # type: ignore[arg-type]
            TABLE,
            History(),
        )
        await poller.poll()
        assert not poller.all_served()
        assert "t00000" not in poller.unserved() and "w-new" in poller.unserved()
        # Claimed by a worker that is gone (its lease lost; a new worker rejoined on its
        # address): still not served.
        for rec in records:
            await coord.put(paths.claim(TABLE, rec.tablet_id), b"w-old")
        await poller.poll()
        assert not poller.all_served()
        # Claimed by the live worker at that address: served.
        for rec in records:
            await coord.put(paths.claim(TABLE, rec.tablet_id), b"w-new")
        await poller.poll()
        assert poller.all_served()
    finally:
        await coord.close()
