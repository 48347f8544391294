"""Differential test: the same seeded random mutations and filtered reads, sent through the
official data client to Google's ``cbtemulator`` and to the tabletstore front door, must
return the same results.

What is kept out of the random space, and why (each a documented departure of the emulator,
see ``tabletstore/data/filters.py``): ``Sink`` (the emulator passes a Sink's input on to its
parent), ``RowSample`` (random), row-level cell limits and offsets over more than one family
(the emulator orders a row's families arbitrarily), two labels in one chain (the emulator
accepts them, the service does not), a strip after a label in a chain (the emulator's
``strip_value_transformer`` drops the cell's labels; data.proto says it replaces the value) and
server-assigned timestamps (clocks differ).
Read-modify-write writes go to family ``c`` at server time, so reads and predicates look only
at families ``a`` and ``b``, and read-modify-write results are compared by value.
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.bigtable")

from google.api_core import exceptions as gexc
from google.cloud.bigtable import Client
from google.cloud.bigtable.data import (
    BigtableDataClient,
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

EMULATOR = Path("/usr/lib/google-cloud-sdk/platform/bigtable-emulator/cbtemulator")
PROJECT, INSTANCE = "diff-project", "diff-instance"
SEEDS = [1, 2, 3, 4]
OPS_PER_SEED = 30

pytestmark = [
    pytest.mark.skipif(
        not EMULATOR.exists() and shutil.which("cbtemulator") is None,
        reason="cbtemulator is not installed",
    ),
    pytest.mark.filterwarnings("ignore::RuntimeWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def cbtemulator() -> Iterator[str]:
    binary = str(EMULATOR) if EMULATOR.exists() else (shutil.which("cbtemulator") or "")
    port = _free_port()
    proc = subprocess.Popen(
        [binary, "-host", "127.0.0.1", "-port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("cbtemulator did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@pytest.fixture(scope="module")
def tabletstore_host() -> Iterator[str]:
    with BackgroundServer(
        f"memory://diff-{uuid.uuid4().hex}", max_value_chunk=7, max_response_bytes=200
    ) as server:
        yield server.address


class Backend:
    """One side of the comparison: a table reached through the official clients."""

    def __init__(self, host: str, monkeypatch: pytest.MonkeyPatch, table_id: str) -> None:
        monkeypatch.setenv("BIGTABLE_EMULATOR_HOST", host)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.admin = Client(project=PROJECT, admin=True)
            self.data = BigtableDataClient(project=PROJECT)
        self.admin.instance(INSTANCE).table(table_id).create(
            column_families={"a": None, "b": None, "c": None}
        )
        self.table = self.data.get_table(INSTANCE, table_id)

    def close(self) -> None:
        self.data.close()
        self.admin.close()


# -- random generation -------------------------------------------------------------------------
KEYS = [b"r%d" % i for i in range(6)]
QUALS = [b"q0", b"q1", b"q2", b"q3"]
TIMES = [1000 * i for i in range(1, 9)]
VALUE_PATTERNS = [b"x.*", b".*1", b"[xy]+", b"", b"z?", b"\\C*0\\C*"]


def rand_value(rng: random.Random) -> bytes:
    return bytes(rng.choice(b"xyz01") for _ in range(rng.randint(0, 12)))


def rand_mutation(rng: random.Random) -> Any:
    kind = rng.choices(["set", "del_col", "del_fam", "del_row"], [8, 3, 1, 1])[0]
    fam = rng.choice("ab")
    if kind == "set":
        return SetCell(fam, rng.choice(QUALS), rand_value(rng), rng.choice(TIMES))
    if kind == "del_col":
        start = rng.choice([None, *TIMES])
        end = rng.choice([None, *[t for t in TIMES if start is None or t > start]])
        return DeleteRangeFromColumn(fam, rng.choice(QUALS), start, end)
    if kind == "del_fam":
        return DeleteAllFromFamily(fam)
    return DeleteAllFromRow()


def bounds(rng: random.Random, points: list[bytes], what: str) -> dict[str, Any]:
    """Random range bounds; the client accepts an inclusiveness flag only with its bound."""
    start, end = rng.choice([None, *points]), rng.choice([None, *points])
    return {
        f"start_{what}": start,
        f"end_{what}": end,
        "inclusive_start": None if start is None else rng.random() < 0.5,
        "inclusive_end": None if end is None else rng.random() < 0.5,
    }


def rand_leaf(rng: random.Random, *, labels: bool, strip: bool) -> rf.RowFilter:
    choices: list[Any] = [
        lambda: rf.PassAllFilter(True),
        lambda: rf.BlockAllFilter(True),
        lambda: rf.RowKeyRegexFilter(rng.choice([b"r[0-2]", b"r.", b"r4|r5", b"x"])),
        lambda: rf.FamilyNameRegexFilter(rng.choice(["a", "b", "[ab]", "c", "a|b"])),
        lambda: rf.ColumnQualifierRegexFilter(rng.choice([b"q[01]", b"q.", b"q3", b".*2"])),
        lambda: rf.ColumnRangeFilter(rng.choice("ab"), **bounds(rng, QUALS, "qualifier")),
        lambda: rf.TimestampRangeFilter(*sorted([_dt(rng.choice(TIMES)), _dt(rng.choice(TIMES))])),
        lambda: rf.ValueRegexFilter(rng.choice(VALUE_PATTERNS)),
        lambda: rf.ValueRangeFilter(**bounds(rng, [b"x", b"y", b"0", b"z", b"1"], "value")),
        lambda: rf.CellsColumnLimitFilter(rng.randint(1, 3)),
        # Row-level counting only within one family (see the module docstring).
        lambda: rf.RowFilterChain(
            [
                rf.FamilyNameRegexFilter(rng.choice("ab")),
                rng.choice(
                    [
                        rf.CellsRowLimitFilter(rng.randint(1, 4)),
                        rf.CellsRowOffsetFilter(rng.randint(0, 3)),
                    ]
                ),
            ]
        ),
    ]
    if labels:
        choices.append(lambda: rf.ApplyLabelFilter(rng.choice(["one", "two"])))
    if strip:
        choices.append(lambda: rf.StripValueTransformerFilter(True))
    return rng.choice(choices)()


def _dt(micros: int) -> Any:
    import datetime

    return datetime.datetime.fromtimestamp(micros / 1e6, tz=datetime.UTC)


def rand_filter(
    rng: random.Random, depth: int = 0, *, labels: bool = True, strip: bool = True
) -> rf.RowFilter:
    """A filter in which no chain can apply two labels (the service's rule) and no strip
    follows a label in a chain (the emulator's strip drops labels)."""
    if depth >= 2 or rng.random() < 0.45:
        return rand_leaf(rng, labels=labels, strip=strip)
    kind = rng.choice(["chain", "interleave", "condition"])
    if kind == "chain":
        n = rng.randint(2, 3)
        labelled = rng.randrange(n) if labels else n
        return rf.RowFilterChain(
            [
                rand_filter(rng, depth + 1, labels=i == labelled, strip=strip and i <= labelled)
                for i in range(n)
            ]
        )
    if kind == "interleave":
        return rf.RowFilterUnion(
            [
                rand_filter(rng, depth + 1, labels=labels, strip=strip)
                for _ in range(rng.randint(2, 3))
            ]
        )
    return rf.ConditionalRowFilter(
        rand_filter(rng, depth + 1, labels=False, strip=strip),
        true_filter=rand_filter(rng, depth + 1, labels=labels, strip=strip)
        if rng.random() < 0.8
        else None,
        false_filter=rand_filter(rng, depth + 1, labels=labels, strip=strip)
        if rng.random() < 0.8
        else None,
    )


def only_ab(f: rf.RowFilter | None) -> rf.RowFilter:
    head = rf.FamilyNameRegexFilter("[ab]")
    return head if f is None else rf.RowFilterChain([head, f])


def rand_query(rng: random.Random) -> ReadRowsQuery:
    kind = rng.choice(["all", "keys", "ranges", "mixed"])
    keys: list[bytes] = []
    ranges: list[RowRange] = []
    if kind in ("keys", "mixed"):
        keys = rng.sample([*KEYS, b"zz"], rng.randint(1, 3))
    if kind in ("ranges", "mixed"):
        for _ in range(rng.randint(1, 2)):
            lo, hi = sorted(rng.sample(KEYS, 2))
            ranges.append(
                RowRange(
                    rng.choice([lo, None]),
                    rng.choice([hi, None]),
                    start_is_inclusive=rng.random() < 0.5,
                    end_is_inclusive=rng.random() < 0.5,
                )
            )
    return ReadRowsQuery(
        row_keys=keys or None,
        row_ranges=ranges or None,
        limit=rng.choice([None, None, 1, 2, 4]),
        row_filter=only_ab(rand_filter(rng) if rng.random() < 0.85 else None),
    )


# -- running an op on a backend ----------------------------------------------------------------
def normal_rows(
    rows: Any,
) -> list[tuple[bytes, list[tuple[str, bytes, int, bytes, tuple[str, ...]]]]]:
    """Rows with cells sorted (the emulator orders a row's families arbitrarily)."""
    return [
        (
            r.row_key,
            sorted(
                ((c.family, c.qualifier, c.timestamp_micros, c.value, tuple(c.labels)) for c in r),
                key=lambda c: (c[0], c[1], -c[2], c[3], c[4]),
            ),
        )
        for r in rows
    ]


def run(op: tuple[str, Any], table: Any) -> Any:
    """The op's observable result, or the class of error it raised."""
    kind, arg = op
    try:
        if kind == "mutate":
            table.mutate_row(*arg)
            return None
        if kind == "bulk":
            try:
                table.bulk_mutate_rows(arg)
            except MutationsExceptionGroup as group:
                return sorted(e.index for e in group.exceptions)
            return []
        if kind == "check":
            row, predicate, true_muts, false_muts = arg
            return table.check_and_mutate_row(
                row, predicate, true_case_mutations=true_muts, false_case_mutations=false_muts
            )
        if kind == "rmw":
            row, rule = arg
            out = table.read_modify_write_row(row, rule)
            return [(c.family, c.qualifier, c.value) for c in out]
        return normal_rows(table.read_rows(arg))
    except gexc.GoogleAPICallError as exc:
        return (
            "error",
            type(exc).__name__ if not isinstance(exc, gexc.InvalidArgument) else "invalid",
        )


def rand_op(rng: random.Random) -> tuple[str, Any]:
    kind = rng.choices(["mutate", "bulk", "check", "rmw", "read"], [6, 2, 2, 1, 6])[0]
    if kind == "mutate":
        return kind, (rng.choice(KEYS), [rand_mutation(rng) for _ in range(rng.randint(1, 3))])
    if kind == "bulk":
        return kind, [
            RowMutationEntry(k, [rand_mutation(rng) for _ in range(rng.randint(1, 2))])
            for k in rng.sample(KEYS, rng.randint(2, 3))
        ]
    if kind == "check":
        pred = only_ab(rand_filter(rng, labels=False)) if rng.random() < 0.85 else None
        true_muts = [rand_mutation(rng)] if rng.random() < 0.8 else None
        false_muts = [rand_mutation(rng)] if rng.random() < 0.8 or true_muts is None else None
        if pred is None:
            pred = only_ab(None)  # the whole row would include family c
        return kind, (rng.choice(KEYS), pred, true_muts, false_muts)
    if kind == "rmw":
        if rng.random() < 0.5:
            return kind, (rng.choice(KEYS), IncrementRule("c", b"n", rng.randint(-5, 5)))
        return kind, (rng.choice(KEYS), AppendValueRule("c", b"s", rand_value(rng)))
    return kind, rand_query(rng)


@pytest.mark.parametrize("seed", SEEDS)
def test_same_results_as_cbtemulator(
    seed: int, cbtemulator: str, tabletstore_host: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    table_id = f"diff-{seed}-{uuid.uuid4().hex[:8]}"
    emulator = Backend(cbtemulator, monkeypatch, table_id)
    ours = Backend(tabletstore_host, monkeypatch, table_id)
    rng = random.Random(seed)
    try:
        for step in range(OPS_PER_SEED):
            op = rand_op(rng)
            expected = run(op, emulator.table)
            got = run(op, ours.table)
            assert got == expected, f"seed {seed} step {step}: {op!r}"
        # And the final state, all of it (a and b), is the same.
        final = ReadRowsQuery(row_filter=only_ab(None))
        assert run(("read", final), ours.table) == run(("read", final), emulator.table)
    finally:
        emulator.close()
        ours.close()
