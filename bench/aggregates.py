"""Aggregate families benchmark: what combining costs on the write and read
paths of the embedded database.

    python -m bench.aggregates [--writes 5000]

On one ``memory://`` database, one row mutation at a time to one hot cell (the counter case):
writes/s of ``SetCell`` (a new version each time; the baseline), ``AddToCell`` to a ``sum``
family and to an ``hll`` family (distinct inputs: the sketch turns dense), then the time of a
point read of that cell, before and after a flush. Prints a table; asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import time
import uuid

import tabletstore
from tabletstore import AddToCell, ColumnFamily, SetCell
from tabletstore.data import hll


async def run(writes: int) -> list[tuple[str, float, float, float]]:
    db = await tabletstore.connect_async(f"memory://bench-aggregates-{uuid.uuid4().hex}")
    table = await db.create_table(
        "t",
        [
            ColumnFamily(name="plain"),
            ColumnFamily(name="n", value_type="sum"),
            ColumnFamily(name="u", value_type="hll"),
        ],
    )
    cases = {
        "SetCell (baseline)": lambda i: SetCell("plain", b"c", b"%d" % i, 1000 + i),
        "AddToCell sum": lambda i: AddToCell("n", b"c", 1, 1000),
        "AddToCell hll": lambda i: AddToCell("u", b"c", b"user-%d" % i, 1000),
    }
    out = []
    for name, make in cases.items():
        row = name.encode()
        start = time.perf_counter()
        for i in range(writes):
            await table.mutate_row(row, [make(i)])
        rate = writes / (time.perf_counter() - start)
        start = time.perf_counter()
        for _ in range(50):
            await table.read_row(row)
        before = (time.perf_counter() - start) / 50
        await db.flush("t")
        start = time.perf_counter()
        for _ in range(50):
            got = await table.read_row(row)
        after = (time.perf_counter() - start) / 50
        if name == "AddToCell hll" and got is not None:
            print(f"hll estimate of {writes} distinct inputs: {hll.estimate(got.cells[0].value)}")
        out.append((name, rate, before * 1000, after * 1000))
    await db.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=5000)
    args = parser.parse_args()
    rows = asyncio.run(run(args.writes))
    print(f"{'case':<22}{'writes/s':>10}{'read ms (memtable)':>20}{'read ms (flushed)':>19}")
    for name, rate, before, after in rows:
        print(f"{name:<22}{rate:>10.0f}{before:>20.3f}{after:>19.3f}")


if __name__ == "__main__":
    main()
