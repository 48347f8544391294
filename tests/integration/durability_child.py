"""The writer process of the SIGKILL durability test (test_durability.py).

``python -m tests.integration.durability_child DIR ROUND SEED FLUSH_BYTES`` opens the embedded
database in DIR through the synchronous API (``tabletstore.connect``'s own construction, plus
tiny memtables so minor and merging compactions run all the time), then forever picks a random
operation and, once it returned, prints one acknowledgement line, flushed:

* ``row KEY``       -- ``mutate_row`` of KEY: cf:a = value_for(KEY) and n:b = its first 8 bytes
* ``row KEY`` x N   -- the same for every row of one ``mutate_rows`` batch
* ``deleting KEY``  -- printed *before* deleting KEY (the delete may apply before its ack)
* ``del KEY``       -- ``mutate_row(KEY, [DeleteRow()])`` of a row acknowledged earlier
* ``inc``           -- ``read_modify_write_row(b"counter", +1)`` on n:count
* ``cas V``         -- ``check_and_mutate_row`` moved n:v of b"cas" from V-1 to V
* ``compacting`` / ``compacted`` -- around ``flush`` + ``compact`` of the whole table

The parent SIGKILLs it at a random point and checks that every acknowledged write is there.
"""

from __future__ import annotations

import random
import sys

from tabletstore.client.sync import Portal
from tabletstore.data.filters import Chain, ColumnQualifierRegex, ValueRegex
from tabletstore.data.model import DeleteRow, IncrementValue, RowMutation, SetCell
from tabletstore.embedded import Database, SyncDatabase
from tabletstore.options import TabletOptions

TABLE = "t"
FAMILIES = ("cf", "n")
SIZES = (10, 300, 3000)


def value_for(key: bytes) -> bytes:
    """The value written under a key: the key repeated to the size its last part names."""
    size = int(key.rsplit(b"-", 1)[1])
    return (key * (size // len(key) + 1))[:size]


def row_mutations(key: bytes) -> tuple[SetCell, SetCell]:
    value = value_for(key)
    return SetCell("cf", b"a", value), SetCell("n", b"b", value[:8])


def say(*words: object) -> None:
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def main(directory: str, round_no: int, seed: int, flush_bytes: int) -> None:
    rng = random.Random(seed)
    portal = Portal()
    options = TabletOptions(memtable_flush_bytes=flush_bytes, max_sstables_per_group=2)
    db = SyncDatabase(
        portal.call(Database.open(f"file://{directory}", tablet_options=options)), portal
    )
    t = db.table(TABLE)
    row = t.read_row(b"cas")
    cas = int(row.latest("n", b"v")) if row is not None else 0
    acked: list[bytes] = []
    say("ready")
    ops = ["row"] * 5 + ["batch"] * 3 + ["inc"] * 3 + ["cas"] * 2 + ["del", "compact"]
    for i in range(1_000_000):
        op = rng.choice(ops)
        if op == "row":
            key = b"%d-%06d-%d" % (round_no, i, rng.choice(SIZES))
            t.mutate_row(key, row_mutations(key))
            acked.append(key)
            say("row", key.decode())
        elif op == "batch":
            keys = [
                b"%d-%06d-%02d-%d" % (round_no, i, j, rng.choice(SIZES))
                for j in range(rng.randint(2, 12))
            ]
            t.mutate_rows([RowMutation(k, row_mutations(k)) for k in keys])
            acked.extend(keys)
            for k in keys:
                say("row", k.decode())
        elif op == "del" and acked:
            key = acked.pop(rng.randrange(len(acked)))
            say("deleting", key.decode())  # from here the delete may happen
            t.mutate_row(key, [DeleteRow()])
            say("del", key.decode())
        elif op == "inc":
            t.read_modify_write_row(b"counter", [IncrementValue("n", b"count", 1)])
            say("inc")
        elif op == "cas":
            predicate = Chain([ColumnQualifierRegex(b"v"), ValueRegex(b"%d" % cas)])
            new = [SetCell("n", b"v", b"%d" % (cas + 1))]
            if not t.check_and_mutate_row(b"cas", predicate, true_mutations=new):
                raise SystemExit(f"cas {cas} -> {cas + 1} did not match: the row lost a write")
            cas += 1
            say("cas", cas)
        elif op == "compact":
            say("compacting")
            db.flush(TABLE)
            db.compact(TABLE)
            say("compacted")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
