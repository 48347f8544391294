"""The API asked for: "both an asyncio API and a synchronous one with the same names."

* introspection: every public method of the asyncio client and table is reachable under the
  same name on the synchronous objects (and listed by ``dir``), blocking where the asyncio one
  awaits and a plain iterator where the asyncio one is an async iterator;
* behaviour: one script of calls (admin, writes, batches with a partial failure, reads, filters,
  transactions, errors) run through ``tabletstore.connect_async`` and ``tabletstore.connect``
  on fresh databases gives the same results and raises the same errors;
* the synchronous API's own duties: a context manager that closes, scans longer than one pull
  batch, abandoning a scan midway, and use from several threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import inspect
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import tabletstore
from tabletstore import (
    AppendValue,
    AsyncTable,
    ColumnFamily,
    DeleteCells,
    FamilyNameRegex,
    IncrementValue,
    InvalidArgument,
    MaxVersionsRule,
    MutationsFailed,
    NotFound,
    Row,
    RowMutation,
    SetCell,
    TabletStoreError,
    ValueRegex,
)
from tabletstore.client.sync import SyncProxy
from tests.integration.api_support import URL_KINDS, make_url

# ---------------------------------------------------------------------------- introspection


def _public(cls: type) -> dict[str, Any]:
    return {
        name: member
        for name, member in inspect.getmembers(cls)
        if not name.startswith("_") and callable(member)
    }


@pytest.fixture
def sync_db(tmp_path: Path) -> Any:
    db = tabletstore.connect(make_url("memory", tmp_path))
    yield db
    db.close()


def test_sync_objects_answer_every_async_method_name(sync_db: Any) -> None:
    sync_db.create_table("t", ["cf"])
    pairs = [(tabletstore.Database, sync_db), (AsyncTable, sync_db.table("t"))]
    for cls, proxy in pairs:
        for name in _public(cls):
            sync_member = getattr(proxy, name)
            assert callable(sync_member), name
            assert not inspect.iscoroutinefunction(sync_member), name
            assert not inspect.isasyncgenfunction(sync_member), name
    # Coroutines block and return plain values; async iterators become plain iterators.
    assert sync_db.list_tables() == ["t"]
    assert isinstance(sync_db.describe_table("t"), tabletstore.TableSchema)
    assert iter(sync_db.table("t").read_rows()) is not None
    assert list(sync_db.table("t").read_rows()) == []


def test_sync_objects_list_the_async_method_names(sync_db: Any) -> None:
    """``dir()`` (help(), completion in a REPL or an IDE) shows the same names on both."""
    sync_db.create_table("t", ["cf"])
    for cls, proxy in [(tabletstore.Database, sync_db), (AsyncTable, sync_db.table("t"))]:
        missing = sorted(set(_public(cls)) - set(dir(proxy)))
        assert not missing, f"dir() of the sync {cls.__name__} lacks {missing}"


def test_both_entry_points_exist_with_the_same_parameters() -> None:
    sync_params = inspect.signature(tabletstore.connect).parameters
    async_params = inspect.signature(tabletstore.connect_async).parameters
    assert list(sync_params) == list(async_params) == ["url", "identity", "tls", "token"]
    assert inspect.iscoroutinefunction(tabletstore.connect_async)
    assert not inspect.iscoroutinefunction(tabletstore.connect)


# ---------------------------------------------------------------------------- behaviour

#: (target, method, args, kwargs): target "db" is the client, "t" the table "t".
Step = tuple[str, str, tuple[Any, ...], dict[str, Any]]
SCRIPT: list[Step] = [
    ("db", "create_table", ("t", ["cf", ColumnFamily(name="n")]), {"split_keys": [b"m"]}),
    ("db", "create_table", ("t", ["cf"]), {}),
    ("db", "create_family", ("t", "v"), {"gc_rule": MaxVersionsRule(max_versions=1)}),
    ("db", "list_tables", (), {}),
    ("db", "describe_table", ("t",), {}),
    ("t", "mutate_row", (b"a", [SetCell("cf", b"q", b"1", 10), SetCell("cf", b"q", b"0", 5)]), {}),
    (
        "t",
        "mutate_rows",
        (
            [
                RowMutation(b"b", (SetCell("cf", b"q", b"2", 10),)),
                RowMutation(b"x", (SetCell("nope", b"q", b"2", 10),)),
                RowMutation(b"z", (SetCell("v", b"q", b"3", 10), SetCell("v", b"q", b"4", 11))),
            ],
        ),
        {},
    ),
    ("t", "read_row", (b"a",), {}),
    ("t", "read_row", (b"missing",), {}),
    ("t", "read_rows", (), {}),
    ("t", "read_rows", (), {"prefix": b"a"}),
    ("t", "read_rows", (), {"keys": [b"z", b"a"], "filter": ValueRegex(b"[13]")}),
    ("t", "read_rows", (), {"start": b"b", "limit": 1}),
    ("t", "read_rows", (), {"families": ["v"]}),
    ("t", "mutate_row", (b"a", [DeleteCells("cf", b"q", 0, 6)]), {}),
    ("t", "read_row", (b"a",), {"filter": FamilyNameRegex("cf")}),
    (
        "t",
        "check_and_mutate_row",
        (b"a", ValueRegex(b"1")),
        {"true_mutations": [SetCell("n", b"ok", b"y", 1)]},
    ),
    (
        "t",
        "check_and_mutate_row",
        (b"q", None),
        {"false_mutations": [SetCell("n", b"new", b"y", 1)]},
    ),
    (
        "t",
        "read_modify_write_row",
        (b"c", [IncrementValue("n", b"k", 3), AppendValue("n", b"s", b"x")]),
        {},
    ),
    # Another row: two increments of one column within one millisecond share a timestamp
    # (whole milliseconds, as the service stamps them) and leave one version, else two.
    ("t", "read_modify_write_row", (b"d", [IncrementValue("n", b"k", -1)]), {}),
    ("db", "flush", ("t",), {}),
    ("db", "compact", ("t",), {}),
    ("t", "read_rows", (), {}),
    ("t", "sample_row_keys", (), {}),
    ("t", "read_row", (b"",), {}),
    ("t", "read_rows", (), {"limit": -1}),
    ("t", "mutate_row", (b"a", [SetCell("ghost", b"q", b"v")]), {}),
    ("db", "delete_family", ("t", "ghost"), {}),
    ("db", "delete_table", ("nope",), {}),
    ("db", "delete_table", ("t",), {}),
    ("db", "list_tables", (), {}),
]


def _normal(value: Any) -> Any:
    """A comparable form: rows and cells as tuples, server timestamps dropped from RMW."""
    if isinstance(value, Row):
        return ("row", value.key, [(c.family, c.qualifier, c.value, c.labels) for c in value.cells])
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_normal(v) for v in value)
    if isinstance(value, AsyncTable | SyncProxy):
        return ("table", value.name)
    if isinstance(value, tabletstore.TableSchema):
        return value.model_dump()
    return value


def _sizes_dropped(method: str, result: Any) -> Any:
    """sample_row_keys' byte offsets depend on server timestamps' encoding: keep the keys."""
    return [key for key, _ in result] if method == "sample_row_keys" else result


def _error(exc: TabletStoreError) -> Any:
    if isinstance(exc, MutationsFailed):
        return ("MutationsFailed", [(f.index, f.row, type(f.error).__name__) for f in exc.failures])
    return (type(exc).__name__, str(exc))


async def _run_async(url: str) -> list[Any]:
    db = await tabletstore.connect_async(url)
    out: list[Any] = []
    try:
        for target, method, args, kwargs in SCRIPT:
            obj: Any = db if target == "db" else db.table("t")
            fn = getattr(obj, method)
            try:
                if inspect.isasyncgenfunction(fn):
                    out.append(_normal([r async for r in fn(*args, **kwargs)]))
                else:
                    out.append(_normal(_sizes_dropped(method, await fn(*args, **kwargs))))
            except TabletStoreError as exc:
                out.append(_error(exc))
    finally:
        await db.close()
    return out


def _run_sync(url: str) -> list[Any]:
    out: list[Any] = []
    with tabletstore.connect(url) as db:
        for target, method, args, kwargs in SCRIPT:
            obj: Any = db if target == "db" else db.table("t")
            try:
                result = getattr(obj, method)(*args, **kwargs)
                if method == "read_rows":
                    result = list(result)
                out.append(_normal(_sizes_dropped(method, result)))
            except TabletStoreError as exc:
                out.append(_error(exc))
    return out


@pytest.mark.parametrize("kind", URL_KINDS)
def test_sync_and_async_behave_the_same(kind: str, tmp_path: Path) -> None:
    got_async = asyncio.run(_run_async(make_url(kind, tmp_path / "async")))
    got_sync = _run_sync(make_url(kind, tmp_path / "sync"))
    for step, a, s in zip(SCRIPT, got_async, got_sync, strict=True):
        assert a == s, f"{step[0]}.{step[1]}{step[2]!r}: async {a!r} != sync {s!r}"
    # The script's errors really were errors (so both sides agreeing means something).
    names = [r[0] for r in got_sync if isinstance(r, tuple) and isinstance(r[0], str)]
    for expected in ("AlreadyExists", "MutationsFailed", "InvalidArgument", "NotFound"):
        assert expected in names, (expected, names)


# ---------------------------------------------------------------------------- sync duties


def test_sync_context_manager_closes_and_errors_keep_their_class(tmp_path: Path) -> None:
    url = make_url("file", tmp_path)
    with tabletstore.connect(url) as db:
        t = db.create_table("t", ["cf"])
        t.mutate_row(b"r", [SetCell("cf", b"q", b"v", 1)])
        with pytest.raises(InvalidArgument, match="empty"):
            t.mutate_row(b"", [SetCell("cf", b"q", b"v")])
        with pytest.raises(NotFound):
            db.describe_table("nope")
        with pytest.raises(MutationsFailed) as info:
            t.mutate_rows([RowMutation(b"x", (SetCell("nope", b"q", b"v"),))])
        assert info.value.failures[0].row == b"x"
    with tabletstore.connect(url) as db:  # closed cleanly: the directory opens again
        assert db.table("t").read_row(b"r").latest("cf", b"q") == b"v"


def test_sync_scans_span_pull_batches_and_can_stop_midway(sync_db: Any) -> None:
    t = sync_db.create_table("t", ["cf"], split_keys=[b"0300"])
    t.mutate_rows([RowMutation(b"%04d" % i, (SetCell("cf", b"q", b"v", 1),)) for i in range(700)])
    assert [r.key for r in t.read_rows()] == [b"%04d" % i for i in range(700)]
    rows = t.read_rows(start=b"0100")
    first = [next(rows).key for _ in range(3)]
    rows.close()
    assert first == [b"0100", b"0101", b"0102"]
    for r in t.read_rows(limit=600):
        if r.key == b"0005":
            break
    assert len(list(t.read_rows(prefix=b"06"))) == 100  # still usable afterwards


def test_sync_api_from_several_threads(sync_db: Any) -> None:
    t = sync_db.create_table("t", ["cf"])
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(20):
                t.mutate_row(b"%d-%02d" % (n, i), [SetCell("cf", b"q", b"v", 1)])
                t.read_modify_write_row(b"counter", [IncrementValue("cf", b"n", 1)])
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=60)
    assert not errors and not any(th.is_alive() for th in threads)
    assert len(list(t.read_rows())) == 81
    assert t.read_row(b"counter").latest("cf", b"n") == (80).to_bytes(8, "big")


def test_the_sync_api_refuses_its_own_event_loop(sync_db: Any) -> None:
    """Calling the blocking API from code running on its loop would deadlock: it is refused,
    and the call's coroutine is closed, not left unstarted ("never awaited")."""
    portal = sync_db._portal
    sync_db.create_table("t", ["cf"])

    async def inside() -> None:
        sync_db.list_tables()

    with _unawaited_coroutines() as unawaited:
        with pytest.raises(RuntimeError, match="its own event loop"):
            portal.call(inside())
    assert unawaited == []


def test_a_call_after_close_is_refused_without_an_unawaited_coroutine(tmp_path: Path) -> None:
    db = tabletstore.connect(make_url("memory", tmp_path))
    db.close()
    with _unawaited_coroutines() as unawaited:
        with pytest.raises(RuntimeError, match="closed"):
            db.list_tables()
    assert unawaited == []


@contextlib.contextmanager
def _unawaited_coroutines() -> Iterator[list[str]]:
    """The "coroutine ... was never awaited" warnings raised inside the block (any thread),
    collected once the block's garbage is."""
    found: list[str] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield found
        gc.collect()
    found.extend(str(w.message) for w in caught if "never awaited" in str(w.message))
