"""The chaos workload: writers and readers that record every operation in the history.

Rows and ownership. Writer ``w`` owns ``rows_per_writer`` rows and is their only writer, one
operation at a time, so a row's writes are ordered by its writer (the checker's model). Row
keys start with a letter; all of one writer's rows lie in one tablet (tablet ``w`` modulo the
number of tablets of :data:`SPLIT_KEYS`), so a writer blocked on a tablet being recovered
holds back no write to another tablet: a write gap is the gap of the tablet it is measured on.

Writes. A PUT sets ``f:c`` to a value unique in the run (``w<writer>-<counter>``) with a
client timestamp that grows with every write of the writer; a DELETE removes the versions of
``f:c`` older than its own timestamp. Client timestamps make the order of a row's versions the
writer's order even for an indeterminate write that takes effect late (a server timestamp
would be taken when it lands). The outcome is recorded as ``ok``, ``fail`` (an error with
``may_have_applied`` false) or ``info`` (``Indeterminate``, or any unexpected exception).

Reads. Readers make point reads of any row and scans of one letter range, with
``CellsPerColumnLimit(1)`` (the newest version); a scan observes every row of its range,
absent ones included.

Single-row transactions. ``transactors`` clients share :data:`TXN_ROWS` (one row in each
tablet, every client on every row, so operations on one cell overlap), each row with three
cells and server timestamps: ``f:r`` a register (PUT of a unique value, check-and-mutate
from the value the client last saw to a new unique one, point read), ``f:n`` a counter
(read-modify-write increment, point read) and ``f:a`` a list (read-modify-write append of a
unique token, now and then a DELETE so it stays short, point read). Every result is recorded
(the new value of an increment or append, whether a check-and-mutate swapped) for the
linearizability checker (:mod:`.linearizability`).
"""

from __future__ import annotations

import asyncio
import functools
import random
import string
import time
from collections.abc import Sequence

from tabletstore.client.table import AsyncTable
from tabletstore.data.filters import CellsPerColumnLimit, Chain, ColumnRange, ValueRange
from tabletstore.data.model import AppendValue, Cell, DeleteCells, IncrementValue, SetCell
from tabletstore.errors import TabletStoreError
from tabletstore.testing.chaos.history import History, Kind, Op, Outcome

__all__ = ["SPLIT_KEYS", "TXN_CELLS", "TXN_ROWS", "Workload", "tablet_of"]

FAMILY = "f"
QUALIFIER = b"c"
#: Six tablets: [, d) [d, h) [h, l) [l, p) [p, t) [t, ).
SPLIT_KEYS: tuple[bytes, ...] = (b"d", b"h", b"l", b"p", b"t")
#: The rows every transactor shares, one per tablet.
TXN_ROWS: tuple[bytes, ...] = (b"b-txn", b"f-txn", b"j-txn", b"n-txn", b"r-txn", b"v-txn")
REGISTER, COUNTER, LIST = b"r", b"n", b"a"
TXN_CELLS = (REGISTER, COUNTER, LIST)
#: Appends to one list between two of its deletes, on average.
LIST_LENGTH = 40


def tablet_of(row: bytes, split_keys: Sequence[bytes] = SPLIT_KEYS) -> int:
    """The index of the tablet holding ``row`` (tablets never split during a run)."""
    return sum(1 for key in split_keys if row >= key)


def _letter(writer: int, j: int) -> str:
    """The first letter of writer ``writer``'s ``j``-th row: one of its tablet's letters."""
    tablet = writer % (len(SPLIT_KEYS) + 1)
    letters = [c for c in string.ascii_lowercase if tablet_of(c.encode()) == tablet]
    return letters[(writer // (len(SPLIT_KEYS) + 1) + j) % len(letters)]


def _outcome(exc: BaseException) -> Outcome:
    if isinstance(exc, TabletStoreError) and not exc.may_have_applied:
        return Outcome.FAIL
    return Outcome.INFO


class Workload:
    """Writer and reader tasks over one table; :meth:`stop` ends them after their current op."""

    def __init__(
        self,
        table: AsyncTable,
        history: History,
        *,
        seed: int,
        writers: int = 8,
        rows_per_writer: int = 6,
        readers: int = 3,
        transactors: int = 4,
        delete_ratio: float = 0.15,
        scan_ratio: float = 0.25,
        pause: float = 0.02,
    ) -> None:
        self.table = table
        self.history = history
        self.seed = seed
        self.delete_ratio = delete_ratio
        self.scan_ratio = scan_ratio
        self.pause = pause
        self.writers = writers
        self.readers = readers
        self.transactors = transactors
        self.rows: dict[int, list[bytes]] = {
            w: [f"{_letter(w, j)}-w{w:02d}-r{j:02d}".encode() for j in range(rows_per_writer)]
            for w in range(writers)
        }
        self.all_rows = sorted(r for rows in self.rows.values() for r in rows)
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        for w in range(self.writers):
            self._tasks.append(asyncio.create_task(self._writer(w), name=f"writer-{w}"))
        for r in range(self.readers):
            self._tasks.append(asyncio.create_task(self._reader(r), name=f"reader-{r}"))
        for t in range(self.transactors):
            self._tasks.append(asyncio.create_task(self._transactor(t), name=f"txn-{t}"))

    async def stop(self, *, grace: float = 60.0) -> None:
        """Let every task finish its current operation (each is bounded by the client's retry
        deadline); cancel what is still running after ``grace`` (recorded as open -> info)."""
        self._stop.set()
        _, pending = await asyncio.wait(self._tasks, timeout=grace)
        for task in pending:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _writer(self, w: int) -> None:
        rng = random.Random(self.seed * 1000 + w)
        name = f"writer-{w}"
        counter = 0
        last_ts = 0
        while not self._stop.is_set():
            row = rng.choice(self.rows[w])
            last_ts = max(last_ts + 1, int(time.time() * 1_000_000))
            if rng.random() < self.delete_ratio:
                op = self.history.invoke(name, Kind.DELETE, row=row)
                mutation: SetCell | DeleteCells = DeleteCells(FAMILY, QUALIFIER, end=last_ts)
            else:
                counter += 1
                value = f"w{w}-{counter}".encode()
                op = self.history.invoke(name, Kind.PUT, row=row, value=value)
                mutation = SetCell(FAMILY, QUALIFIER, value, timestamp=last_ts)
            await self._write(op, row, mutation)
            await asyncio.sleep(self.pause * (0.5 + rng.random()))

    async def _write(self, op: Op, row: bytes, mutation: SetCell | DeleteCells) -> None:
        try:
            await self.table.mutate_row(row, [mutation])
        except asyncio.CancelledError:
            raise  # left open: closing the history marks it indeterminate
        except Exception as exc:  # every failure is an outcome to record
            self.history.complete(op, _outcome(exc), error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.1)
        else:
            self.history.complete(op, Outcome.OK)

    async def _transactor(self, t: int) -> None:
        rng = random.Random(self.seed * 1000 + 900 + t)
        name = f"txn-{t}"
        counter = 0
        #: The register's value this client saw last, per row: what its next CAS expects.
        last: dict[bytes, bytes | None] = {}
        while not self._stop.is_set():
            row = rng.choice(TXN_ROWS)
            cell = rng.choice(TXN_CELLS)
            counter += 1
            token = f"t{t}-{counter}".encode()
            draw = rng.random()
            if draw < 0.3:
                op = await self.read_cell(name, row, cell)
                if cell == REGISTER and op.outcome is Outcome.OK:
                    last[row] = op.seen
            else:
                invoke = functools.partial(self.history.invoke, name, row=row, qualifier=cell)
                if cell == REGISTER and draw < 0.6:
                    op = invoke(Kind.PUT, value=token)
                elif cell == REGISTER:
                    op = invoke(Kind.CAS, value=token, expected=last.get(row))
                elif cell == COUNTER:
                    op = invoke(Kind.INCREMENT, amount=rng.choice((1, 1, 2, -1)))
                elif rng.random() < 1 / LIST_LENGTH:
                    op = invoke(Kind.DELETE)
                else:
                    op = invoke(Kind.APPEND, value=token + b";")
                await self._txn(op, row)
                if op.outcome is Outcome.OK and (op.kind is Kind.PUT or op.matched):
                    last[row] = op.value  # what the cell held when it was acknowledged
            await asyncio.sleep(self.pause * (0.5 + rng.random()))

    async def _txn(self, op: Op, row: bytes) -> None:
        """Run one transactor operation (``op`` says which) and record its result."""
        q = op.qualifier
        matched: bool | None = None
        seen: bytes | None = None
        try:
            if op.kind is Kind.PUT:
                assert op.value is not None
                await self.table.mutate_row(row, [SetCell(FAMILY, q, op.value)])
            elif op.kind is Kind.DELETE:
                await self.table.mutate_row(row, [DeleteCells(FAMILY, q)])
            elif op.kind is Kind.CAS:
                assert op.value is not None
                put = [SetCell(FAMILY, q, op.value)]
                if op.expected is None:
                    # The predicate "the cell exists" did not match: it was absent.
                    present = await self.table.check_and_mutate_row(
                        row, _newest(q), false_mutations=put
                    )
                    matched = not present
                else:
                    same = ValueRange(op.expected, op.expected, end_inclusive=True)
                    equal = Chain((_newest(q), same))
                    matched = await self.table.check_and_mutate_row(row, equal, true_mutations=put)
            else:
                rule: IncrementValue | AppendValue
                if op.kind is Kind.INCREMENT:
                    assert op.amount is not None
                    rule = IncrementValue(FAMILY, q, op.amount)
                else:
                    assert op.value is not None
                    rule = AppendValue(FAMILY, q, op.value)
                got = await self.table.read_modify_write_row(row, [rule])
                seen = _value(got.cells, q)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # every failure is an outcome to record
            self.history.complete(op, _outcome(exc), error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.1)
        else:
            self.history.complete(op, Outcome.OK, seen=seen, matched=matched)

    async def read_cell(self, process: str, row: bytes, qualifier: bytes) -> Op:
        """A point read of one cell of a transactor row (the newest version)."""
        op = self.history.invoke(process, Kind.READ, row=row, qualifier=qualifier)
        try:
            got = await self.table.read_row(row, filter=_newest(qualifier))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed read observes nothing
            self.history.complete(op, Outcome.FAIL, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.1)
            return op
        self.history.complete(op, Outcome.OK, seen=_value(got.cells if got else (), qualifier))
        return op

    async def _reader(self, r: int) -> None:
        rng = random.Random(self.seed * 1000 + 500 + r)
        letters = string.ascii_lowercase
        while not self._stop.is_set():
            if rng.random() < self.scan_ratio:
                i = rng.randrange(len(letters))
                # Two letters' rows; b"{" sorts just past b"z".
                lo, hi = letters[i].encode(), (letters[i + 2 :] or "{")[0].encode()
                await self.scan(f"reader-{r}", lo, hi)
            else:
                await self.read(f"reader-{r}", rng.choice(self.all_rows))
            await asyncio.sleep(self.pause * (0.5 + rng.random()))

    async def read(self, process: str, row: bytes) -> Op:
        """A point read of ``row``'s ``f:c`` (the newest version)."""
        return await self.read_cell(process, row, QUALIFIER)

    async def scan(self, process: str, lo: bytes, hi: bytes) -> Op:
        op = self.history.invoke(process, Kind.SCAN, rows=(lo, hi))
        seen: dict[bytes, bytes] = {}
        try:
            async for row in self.table.read_rows(start=lo, end=hi, filter=CellsPerColumnLimit(1)):
                value = _value(row.cells)
                if value is not None:
                    seen[row.key] = value
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed scan observes nothing
            self.history.complete(op, Outcome.FAIL, error=f"{type(exc).__name__}: {exc}")
            await asyncio.sleep(0.1)
            return op
        self.history.complete(op, Outcome.OK, seen_rows=seen)
        return op


def _value(cells: Sequence[Cell], qualifier: bytes = QUALIFIER) -> bytes | None:
    for cell in cells:
        if cell.family == FAMILY and cell.qualifier == qualifier:
            return cell.value
    return None


def _newest(qualifier: bytes) -> Chain:
    """The newest version of ``f:<qualifier>``."""
    return Chain(
        (ColumnRange(FAMILY, qualifier, qualifier, end_inclusive=True), CellsPerColumnLimit(1))
    )
