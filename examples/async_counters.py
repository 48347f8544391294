"""Single-row transactions with the asyncio API (§2, §3): counters and check-and-mutate.

Bigtable "supports single-row transactions, which can be used to perform atomic
read-modify-write sequences on data stored under a single row key" (§2). This example runs
100 concurrent increments of one counter (none is lost), appends to a log cell, and uses
check-and-mutate as a lock that exactly one of several contenders acquires.

    python examples/async_counters.py [--url file:///some/dir]
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import tempfile

import tabletstore
from tabletstore import (
    AppendValue,
    Chain,
    ColumnQualifierRegex,
    DeleteRow,
    FamilyNameRegex,
    IncrementValue,
    NotFound,
    SetCell,
)


def counter(value: bytes | None) -> int:
    """Counters are 64-bit big-endian signed integers."""
    return struct.unpack(">q", value)[0] if value else 0


async def main(url: str) -> None:
    async with await tabletstore.connect_async(url) as db:
        try:
            await db.describe_table("pages")
        except NotFound:
            await db.create_table("pages", ["stats", "lock"])
            print("created table 'pages' (families stats, lock)")
        table = db.table("pages")
        row = b"com.cnn.www"
        await table.mutate_row(row, [DeleteRow()])  # start from a clean row on every run

        # 100 increments in flight at once; each is one atomic read-modify-write.
        await asyncio.gather(
            *(
                table.read_modify_write_row(row, [IncrementValue("stats", b"views", 1)])
                for _ in range(100)
            )
        )
        result = await table.read_row(row)
        print(
            f"100 concurrent increments -> stats:views = {counter(result.latest('stats', b'views'))}"
        )

        for visitor in (b"alice", b"bob", b"carol"):
            await table.read_modify_write_row(row, [AppendValue("stats", b"log", visitor + b";")])
        logged = await table.read_row(row)
        print(f"appends -> stats:log = {logged.latest('stats', b'log')!r}")

        # A lock: set lock:owner only if the row has no lock:owner cell yet.
        held = Chain([FamilyNameRegex("lock"), ColumnQualifierRegex(b"owner")])

        async def acquire(worker: str) -> bool:
            matched = await table.check_and_mutate_row(
                row, held, false_mutations=[SetCell("lock", b"owner", worker.encode())]
            )
            return not matched  # the predicate found no owner, so our SetCell was applied

        winners = await asyncio.gather(*(acquire(f"worker-{i}") for i in range(5)))
        owner = (await table.read_row(row, families=["lock"])).latest("lock", b"owner")
        print(f"5 contenders for the lock -> {sum(winners)} acquired it; owner = {owner.decode()}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="database URL (default: a new temporary directory)")
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url))
    else:
        with tempfile.TemporaryDirectory(prefix="tabletstore-example-") as tmp:
            asyncio.run(main(f"file://{tmp}"))
