"""MemTable: ordering, sizes, sequence bounds, freezing, scans interleaved with writes."""

from __future__ import annotations

import gc
import random

import pytest

from tabletstore.engine.memtable import CELL_OVERHEAD, FrozenMemTable, MemTable
from tabletstore.errors import InvalidArgument
from tabletstore.keys import TS_MAX, Cell, CellKind, cell_sort_key
from tabletstore.sstable.writer import write_sstable


def put(row: bytes, fam: str, q: bytes, ts: int, seq: int, value: bytes = b"v") -> Cell:
    return Cell(row, fam, q, ts, seq, CellKind.PUT, value)


def random_cells(n: int, seed: int = 1) -> list[Cell]:
    rnd = random.Random(seed)
    return [
        put(
            b"r%03d" % rnd.randrange(50),
            rnd.choice("ab"),
            b"q%d" % rnd.randrange(3),
            rnd.randrange(100),
            seq,
            b"x" * rnd.randrange(10),
        )
        for seq in range(1, n + 1)
    ]


def test_scan_is_in_sort_order_and_get_row_returns_the_row() -> None:
    cells = random_cells(2000)
    mt = MemTable()
    for i in range(0, len(cells), 7):
        mt.add(cells[i : i + 7])
    assert list(mt.scan()) == sorted(cells, key=cell_sort_key)
    assert mt.get_row(b"r007") == sorted((c for c in cells if c.row == b"r007"), key=cell_sort_key)
    assert mt.get_row(b"missing") == []
    assert len(mt) == mt.cell_count == 2000
    assert mt.row_count == len({c.row for c in cells})


def test_scan_bounds_are_start_inclusive_end_exclusive() -> None:
    cells = random_cells(500)
    mt = MemTable()
    mt.add(cells)
    got = list(mt.scan(b"r010", b"r020"))
    assert got == sorted((c for c in cells if b"r010" <= c.row < b"r020"), key=cell_sort_key)
    assert list(mt.scan(b"r020", b"r010")) == []
    assert [c.row for c in mt.scan(b"r045")] == sorted(c.row for c in cells if c.row >= b"r045")
    rows = list(mt.rows(b"r000", b"r005"))
    assert [r for r, _ in rows] == sorted({c.row for c in cells if c.row < b"r005"})
    assert all(all(c.row == r for c in cs) for r, cs in rows)


def test_deletion_entries_sort_first_in_their_scope() -> None:
    mt = MemTable()
    mt.add([put(b"r", "f", b"q", 5, 1), put(b"r", "f", b"", 5, 2)])
    mt.add([Cell(b"r", "", b"", TS_MAX, 3, CellKind.DELETE_ROW, b"")])
    mt.add([Cell(b"r", "f", b"", TS_MAX, 4, CellKind.DELETE_FAMILY, b"")])
    kinds = [c.kind for c in mt.get_row(b"r")]
    assert kinds == [CellKind.DELETE_ROW, CellKind.DELETE_FAMILY, CellKind.PUT, CellKind.PUT]


def test_size_and_seq_bounds_and_idempotent_replay() -> None:
    mt = MemTable()
    assert mt.is_empty() and mt.min_seq is None and mt.max_seq is None
    a = put(b"row", "fam", b"qual", 1, 10, b"value")
    b = put(b"row", "fam", b"qual", 1, 4, b"older")
    mt.add([a, b])
    expected = 2 * (3 + 3 + 4 + 5 + CELL_OVERHEAD)
    assert mt.approximate_size == expected
    assert (mt.min_seq, mt.max_seq) == (4, 10)
    mt.add([a])  # a replayed duplicate changes nothing
    assert mt.approximate_size == expected and len(mt) == 2
    assert mt.get_row(b"row") == [a, b]


def test_freeze_stops_writes_and_keeps_contents() -> None:
    cells = random_cells(300)
    mt = MemTable()
    mt.add(cells)
    frozen = mt.freeze()
    assert isinstance(frozen, FrozenMemTable) and mt.frozen
    with pytest.raises(InvalidArgument, match="frozen"):
        mt.add([put(b"x", "a", b"", 1, 999)])
    assert list(frozen.scan()) == sorted(cells, key=cell_sort_key)
    assert (frozen.min_seq, frozen.max_seq, len(frozen)) == (1, 300, 300)
    assert frozen.approximate_size == mt.approximate_size
    with pytest.raises(InvalidArgument):
        FrozenMemTable(MemTable())


def test_scan_interleaved_with_writes_sees_every_cell_present_at_start() -> None:
    cells = random_cells(1000)
    mt = MemTable()
    mt.add(cells[:500])
    before = sorted(cells[:500], key=cell_sort_key)
    seen: list[Cell] = []
    later = iter(cells[500:])
    for cell in mt.scan():
        seen.append(cell)
        nxt = next(later, None)
        if nxt is not None:
            mt.add(
                [
                    nxt,
                    put(b"r%03d" % random.randrange(50) + b"new", "a", b"", 1, 10_000 + len(seen)),
                ]
            )
    keys = [cell_sort_key(c) for c in seen]
    assert keys == sorted(keys), "a scan interleaved with writes stays in order"
    assert set(before) <= set(seen), "every cell present when the scan started is seen"
    assert len(keys) == len(set(keys))


def test_rows_are_copied_so_a_reader_never_sees_a_later_add() -> None:
    mt = MemTable()
    mt.add([put(b"r", "a", b"q", 1, 1)])
    row = mt.get_row(b"r")
    it = mt.scan()
    first = next(it)
    mt.add([put(b"r", "a", b"q", 2, 2)])
    assert row == [first]
    assert list(it) == []  # the row was copied whole when the scan reached it


def _untracked_entries(mt: MemTable) -> list[bool]:
    gc.collect()
    slots = list(mt._rows.values())
    return [not gc.is_tracked(s) for s in slots if type(s) is not list]


def test_single_cell_rows_leave_nothing_for_the_cyclic_gc() -> None:
    """A row of one cell is held as a plain tuple of atoms, a CellKind kind included, so the
    cyclic GC untracks it (the memtable module docstring): a full memtable adds no objects to
    every full collection."""
    mt = MemTable()
    for i in range(100):
        mt.add([put(b"row%03d" % i, "f", b"q", 10, i + 1)])  # CellKind.PUT: a tracked enum
    mt.add([Cell(b"plain", "f", b"q", 10, 500, int(CellKind.PUT), b"v")])
    assert len(_untracked_entries(mt)) == 101
    assert all(_untracked_entries(mt))


def test_reads_hand_out_cells_of_every_field_whatever_the_row_holds() -> None:
    """Rows of one cell and rows of many (versions, deletion entries, several families) read
    back as keys.Cell values equal to what was added, from every read path, live and frozen;
    adding a cell again is a no-op."""
    cells = [
        put(b"one", "a", b"q", 5, 1, b"only"),
        put(b"many", "a", b"q", 5, 2, b"old"),
        put(b"many", "a", b"q", 9, 3, b"new"),
        put(b"many", "b", b"x", 1, 4, b"other family"),
        Cell(b"many", "a", b"q", TS_MAX, 5, CellKind.DELETE_COLUMN, b"\x00" * 16),
        Cell(b"gone", "", b"", TS_MAX, 6, CellKind.DELETE_ROW, b""),
        Cell(b"fam", "a", b"", TS_MAX, 7, CellKind.DELETE_FAMILY, b""),
    ]
    mt = MemTable()
    for c in cells:
        mt.add([c])
    before = (mt.approximate_size, mt.cell_count, mt.min_seq, mt.max_seq)
    mt.add(cells)  # log replay: every entry already held
    assert (mt.approximate_size, mt.cell_count, mt.min_seq, mt.max_seq) == before
    want = sorted(cells, key=cell_sort_key)
    frozen = mt.freeze()
    for table in (mt, frozen):
        got = list(table.scan())
        assert got == want
        assert all(type(c) is Cell for c in got)
        assert [tuple(c) for c in got] == [tuple(c) for c in want]
        assert table.get_row(b"one") == [cells[0]]
        assert type(table.get_row(b"one")[0]) is Cell
        assert table.get_row(b"many") == [c for c in want if c.row == b"many"]
        assert [(r, cs) for r, cs in table.rows()] == [
            (r, [c for c in want if c.row == r]) for r in sorted({c.row for c in cells})
        ]
        assert table.get_row(b"one")[0].kind == CellKind.PUT


def test_a_single_cell_row_grows_into_a_sorted_row() -> None:
    mt = MemTable()
    mt.add([put(b"r", "f", b"q", 1, 1, b"first")])
    got = mt.get_row(b"r")
    got.append(put(b"x", "f", b"q", 1, 9))  # a copy: the memtable is not changed
    mt.add([put(b"r", "f", b"q", 3, 2, b"newer"), put(b"r", "e", b"q", 1, 3, b"e")])
    assert [c.value for c in mt.get_row(b"r")] == [b"e", b"newer", b"first"]
    assert mt.cell_count == 3


def test_entries_are_the_cells_as_plain_tuples_and_write_the_same_sstable() -> None:
    """The minor compaction writes ``entries()`` (plain tuples, no Cell objects made): the
    SSTable bytes are those of the cells themselves."""
    cells = random_cells(500)
    mt = MemTable()
    for c in cells:
        mt.add([c])
    entries = list(mt.entries())
    assert all(type(e) is tuple for e in entries)
    assert entries == [tuple(c) for c in mt.scan()]
    assert write_sstable(entries) == write_sstable(list(mt.scan()))
