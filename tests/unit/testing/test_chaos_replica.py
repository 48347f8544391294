"""The chaos run's replica check on hand-made streams and scans: each finding it must make (a
change lost, applied twice, not from the source, a cell differing) and what it must accept
(each cluster's own ``seq``, a deletion's own timestamp, a retried write logged twice in a
row, a follower that delivered one record twice)."""

from __future__ import annotations

from tabletstore.client.change_plan import Change, Mod
from tabletstore.keys import TS_MAX, encode_ts_range
from tabletstore.testing.chaos.replica import check_replica

ROW = b"a-w00-r00"


def put(value: bytes, ts: int, *, seq: int, row: bytes = ROW) -> Change:
    return Change(row, 1.0, seq, (Mod("put", "f", b"c", ts, value),), "t")


def delete(end: int, stamp: int, *, seq: int, row: bytes = ROW) -> Change:
    value = encode_ts_range(0, end)
    return Change(row, 1.0, seq, (Mod("delete_column", "f", b"c", stamp, value),), "t")


SOURCE = [
    put(b"v1", 10, seq=5),
    put(b"v2", 20, seq=9),
    delete(20, 777, seq=12),
    put(b"v3", 30, seq=14),
    put(b"x1", 11, seq=3, row=b"b-txn"),
]
CELLS = [(ROW, "f", b"c", 30, b"v3"), (b"b-txn", "f", b"c", 11, b"x1")]


def replica_of(source: list[Change], *, first: int = 100) -> list[Change]:
    """The source's changes as the replica logs them: its own seqs, its own deletion stamps."""
    out = []
    for i, c in enumerate(source):
        m = c.mods[0]
        stamp = 999 if m.kind == "delete_column" else m.timestamp
        out.append(Change(c.row, 2.0, first + i, (Mod(m.kind, m.family, m.qualifier, stamp,
                                                       m.value),), "r"))  # fmt: skip
    return out


def test_a_faithful_replica_passes() -> None:
    v = check_replica(SOURCE, replica_of(SOURCE), CELLS, list(reversed(CELLS)))
    assert v.ok, v.lines()
    assert (v.source_changes, v.applied, v.retried) == (5, 5, 0)
    assert v.lines()[0].startswith("replication: 5 changes applied for 5 source changes; lost 0")
    assert v.lines()[1].startswith("replica equals source: yes (2 cells at the source")


def test_a_change_never_applied_is_lost() -> None:
    replica = replica_of(SOURCE)
    del replica[1]
    v = check_replica(SOURCE, replica, CELLS, CELLS)
    assert not v.ok and len(v.lost) == 1 and "v2" not in v.lost[0] and "put" in v.lost[0]


def test_a_change_applied_twice_is_repeated() -> None:
    replica = replica_of(SOURCE)
    # A replicator resumed from too old a token: the row's changes again, after later ones.
    replica += replica_of(SOURCE[:2], first=200)
    v = check_replica(SOURCE, replica, CELLS, CELLS)
    assert not v.ok and len(v.repeated) == 2, v.lines()


def test_a_retried_write_logged_twice_in_a_row_is_counted_apart() -> None:
    replica = replica_of(SOURCE)
    last = replica[3]  # the row's last change, logged again right after it
    replica.append(Change(last.row, 2.0, 150, last.mods, "r"))
    v = check_replica(SOURCE, replica, CELLS, CELLS)
    assert v.ok and v.retried == 1, v.lines()


def test_a_record_a_follower_delivered_twice_counts_once() -> None:
    replica = replica_of(SOURCE)
    v = check_replica([*SOURCE, SOURCE[0]], [*replica, replica[3]], CELLS, CELLS)
    assert v.ok and v.applied == 5, v.lines()


def test_a_change_the_source_never_made_is_reported() -> None:
    replica = [*replica_of(SOURCE), put(b"stray", 40, seq=300)]
    v = check_replica(SOURCE, replica, CELLS, CELLS)
    assert not v.ok and len(v.foreign) == 1 and "stray" not in v.foreign[0]


def test_a_deletion_of_another_range_does_not_match() -> None:
    replica = replica_of(SOURCE)
    replica[2] = delete(TS_MAX, 999, seq=102)
    v = check_replica(SOURCE, replica, CELLS, CELLS)
    assert len(v.lost) == 1 and len(v.foreign) == 1


def test_cells_differing_either_way_are_reported() -> None:
    missing = CELLS[:1]
    extra = [*CELLS, (ROW, "f", b"c", 20, b"v2")]
    changed = [CELLS[0], (b"b-txn", "f", b"c", 11, b"x2")]
    for replica_cells, n in ((missing, 1), (extra, 1), (changed, 2)):
        v = check_replica(SOURCE, replica_of(SOURCE), CELLS, replica_cells)
        assert not v.ok and len(v.differing) == n, v.lines()
        assert v.lines()[1].startswith("replica equals source: NO")
    v = check_replica(SOURCE, replica_of(SOURCE), CELLS, missing)
    assert "only at the source" in v.differing[0]


def test_an_unchecked_replica_is_not_ok() -> None:
    v = check_replica(SOURCE, replica_of(SOURCE), CELLS, CELLS)
    v.incomplete = "the replica's progress not past the final instant"
    assert not v.ok and any("REPLICA INCOMPLETE" in line for line in v.lines())
