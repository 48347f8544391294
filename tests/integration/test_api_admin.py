"""Admin, through the public API on ``memory://`` and ``file://``: create, list,
describe and delete tables; add, modify and drop column families; per-family GC rules (max
versions, max age, union, intersection); locality groups with compression and an in-memory
flag; ACLs per family checked on every request; precise validation errors for bad schemas.
"""

from __future__ import annotations

import time

import pytest

import tabletstore
from tabletstore import (
    Acl,
    AlreadyExists,
    AppendValue,
    AsyncClient,
    ColumnFamily,
    DeleteRow,
    IncrementValue,
    IntersectionRule,
    InvalidArgument,
    LocalityGroup,
    MaxAgeRule,
    MaxVersionsRule,
    MutationsFailed,
    NotFound,
    PassAll,
    PermissionDenied,
    RowMutation,
    SetCell,
    UnionRule,
    ValueRegex,
)
from tests.integration.api_support import db, db_url, reopen, rows_of, values

__all__ = ["db", "db_url"]  # fixtures used by name

HOUR = 3600 * 1_000_000


def _now() -> int:
    return int(time.time() * 1_000_000)


# ---------------------------------------------------------------------------- tables


async def test_create_list_describe_delete_tables(db: AsyncClient) -> None:
    assert await db.list_tables() == []
    await db.create_table("beta", ["cf"])
    await db.create_table("alpha", [ColumnFamily(name="a"), "b"])
    assert await db.list_tables() == ["alpha", "beta"]

    schema = await db.describe_table("alpha")
    assert schema.name == "alpha"
    assert sorted(schema.families) == ["a", "b"]
    assert schema.families["a"].gc_rule is None
    assert "default" in schema.locality_groups

    await db.delete_table("beta")
    assert await db.list_tables() == ["alpha"]
    with pytest.raises(NotFound, match="beta"):
        await db.describe_table("beta")


async def test_duplicate_and_missing_tables_are_clear_errors(db: AsyncClient) -> None:
    await db.create_table("t", ["cf"])
    with pytest.raises(AlreadyExists, match="'t'"):
        await db.create_table("t", ["cf"])
    with pytest.raises(NotFound, match="nope"):
        await db.delete_table("nope")
    with pytest.raises(NotFound, match="nope"):
        await db.table("nope").mutate_row(b"r", [SetCell("cf", b"q", b"v")])
    with pytest.raises(NotFound, match="nope"):
        await rows_of(db.table("nope"))


async def test_deleted_table_is_gone_and_its_name_reusable_without_old_data(
    db: AsyncClient,
) -> None:
    t = await db.create_table("t", ["cf"])
    await t.mutate_row(b"r", [SetCell("cf", b"q", b"old", 1)])
    await db.flush("t")
    await t.mutate_row(b"s", [SetCell("cf", b"q", b"old", 1)])
    await db.delete_table("t")
    with pytest.raises(NotFound):
        await t.read_row(b"r")
    t2 = await db.create_table("t", ["cf"])
    assert await rows_of(t2) == []
    await t2.mutate_row(b"r", [SetCell("cf", b"q", b"new", 2)])
    assert values(await t2.read_row(b"r")) == [("cf", b"q", 2, b"new")]


async def test_tables_survive_a_clean_restart(db: AsyncClient, db_url: str) -> None:
    await db.create_table(
        "t",
        [ColumnFamily(name="cf", gc_rule=MaxVersionsRule(max_versions=2))],
        split_keys=[b"m"],
    )
    await db.table("t").mutate_row(b"z", [SetCell("cf", b"q", b"v", 5)])
    db2 = await reopen(db, db_url)
    try:
        assert await db2.list_tables() == ["t"]
        schema = await db2.describe_table("t")
        assert schema.families["cf"].gc_rule == MaxVersionsRule(max_versions=2)
        assert values(await db2.table("t").read_row(b"z")) == [("cf", b"q", 5, b"v")]
    finally:
        await db2.close()


# ---------------------------------------------------------------------------- families


async def test_add_modify_and_drop_families(db: AsyncClient) -> None:
    t = await db.create_table("t", ["cf"])
    await db.create_family("t", "extra", gc_rule=MaxVersionsRule(max_versions=1))
    await db.create_family("t", ColumnFamily(name="more"))
    schema = await db.describe_table("t")
    assert sorted(schema.families) == ["cf", "extra", "more"]
    assert schema.families["extra"].gc_rule == MaxVersionsRule(max_versions=1)

    await t.mutate_row(b"r", [SetCell("extra", b"q", b"1", 1), SetCell("extra", b"q", b"2", 2)])
    assert values(await t.read_row(b"r")) == [("extra", b"q", 2, b"2")]

    await db.update_family("t", ColumnFamily(name="extra", gc_rule=MaxVersionsRule(max_versions=5)))
    assert (await db.describe_table("t")).families["extra"].gc_rule == MaxVersionsRule(
        max_versions=5
    )

    await db.delete_family("t", "more")
    assert sorted((await db.describe_table("t")).families) == ["cf", "extra"]
    with pytest.raises(NotFound, match="more"):
        await t.mutate_row(b"r", [SetCell("more", b"q", b"v")])


async def test_family_errors_name_the_family(db: AsyncClient) -> None:
    await db.create_table("t", ["cf"])
    with pytest.raises((AlreadyExists, InvalidArgument), match="cf"):
        await db.create_family("t", "cf")
    with pytest.raises(NotFound, match="ghost"):
        await db.delete_family("t", "ghost")
    with pytest.raises(NotFound, match="ghost"):
        await db.update_family("t", ColumnFamily(name="ghost"))
    with pytest.raises((NotFound, InvalidArgument), match="ghost"):
        await db.set_gc_rule("t", "ghost", MaxVersionsRule(max_versions=1))
    with pytest.raises(NotFound, match="nope"):
        await db.create_family("nope", "cf")


async def test_dropped_family_data_is_invisible_at_once(db: AsyncClient) -> None:
    t = await db.create_table("t", ["cf", "gone"])
    await t.mutate_row(b"r", [SetCell("cf", b"q", b"keep", 1), SetCell("gone", b"q", b"x", 1)])
    await db.flush("t")
    await t.mutate_row(b"r", [SetCell("gone", b"q2", b"y", 1)])
    await db.delete_family("t", "gone")
    assert values(await t.read_row(b"r")) == [("cf", b"q", 1, b"keep")]
    await db.compact("t")
    assert values(await t.read_row(b"r")) == [("cf", b"q", 1, b"keep")]


async def test_recreated_family_does_not_resurrect_dropped_cells(db: AsyncClient) -> None:
    """Dropping a family deletes its data (§2); creating a family of the same name later must
    start empty, whether the old cells were still in the memtable or in an SSTable."""
    t = await db.create_table("t", ["cf"])
    await t.mutate_row(b"flushed", [SetCell("cf", b"q", b"old", 1)])
    await db.flush("t")
    await t.mutate_row(b"memtable", [SetCell("cf", b"q", b"old", 1)])
    await db.delete_family("t", "cf")
    await db.create_family("t", "cf")
    assert await rows_of(t) == []


async def test_moving_a_family_to_another_locality_group_keeps_its_data(
    db: AsyncClient,
) -> None:
    """A family's cells already in SSTables of its old group stay readable, including when
    the read names the family (which restricts the read to that family's group)."""
    t = await db.create_table("t", ["cf"])
    await t.mutate_row(b"r", [SetCell("cf", b"q", b"v", 1)])
    await db.flush("t")
    await db.add_locality_group("t", LocalityGroup(name="hot", in_memory=True))
    await db.update_family("t", ColumnFamily(name="cf", locality_group="hot"))
    assert values(await t.read_row(b"r")) == [("cf", b"q", 1, b"v")]
    assert values(await t.read_row(b"r", families=["cf"])) == [("cf", b"q", 1, b"v")]


# ---------------------------------------------------------------------------- GC rules


async def _versions(db: AsyncClient, rule: object, stamps: list[int]) -> list[int]:
    """Timestamps of q's visible versions after writing one per stamp under ``rule``."""
    t = await db.create_table("gc", [ColumnFamily(name="cf", gc_rule=rule)])
    await t.mutate_rows(
        [RowMutation(b"r", (SetCell("cf", b"q", str(ts).encode(), ts),)) for ts in stamps]
    )
    before = [c[2] for c in values(await t.read_row(b"r"))]
    await db.compact("gc")
    after = [c[2] for c in values(await t.read_row(b"r"))]
    assert before == after, "compaction must not change what reads already hide"
    return after


async def test_gc_max_versions(db: AsyncClient) -> None:
    now = _now()
    stamps = [now - i for i in range(5)]
    assert await _versions(db, MaxVersionsRule(max_versions=2), stamps) == stamps[:2]


async def test_gc_max_age(db: AsyncClient) -> None:
    now = _now()
    stamps = [now, now - 1, now - 2 * HOUR, now - 3 * HOUR]
    assert await _versions(db, MaxAgeRule(max_age_seconds=3600), stamps) == stamps[:2]


async def test_gc_union_collects_when_any_rule_would(db: AsyncClient) -> None:
    now = _now()
    # newest 2 versions, of which the second is old: max_versions keeps it, max_age drops it.
    stamps = [now, now - 2 * HOUR, now - 3 * HOUR]
    rule = UnionRule(rules=[MaxVersionsRule(max_versions=2), MaxAgeRule(max_age_seconds=3600)])
    assert await _versions(db, rule, stamps) == [now]


async def test_gc_intersection_collects_only_when_every_rule_would(db: AsyncClient) -> None:
    now = _now()
    # Beyond the newest 1 version AND older than an hour: only the last one qualifies.
    stamps = [now, now - 1, now - 2 * HOUR]
    rule = IntersectionRule(
        rules=[MaxVersionsRule(max_versions=1), MaxAgeRule(max_age_seconds=3600)]
    )
    assert await _versions(db, rule, stamps) == [now, now - 1]


async def test_nested_gc_rules_and_changing_a_rule(db: AsyncClient) -> None:
    now = _now()
    rule = UnionRule(
        rules=[
            MaxVersionsRule(max_versions=3),
            IntersectionRule(
                rules=[MaxVersionsRule(max_versions=1), MaxAgeRule(max_age_seconds=3600)]
            ),
        ]
    )
    stamps = [now, now - 2 * HOUR, now - 3 * HOUR, now - 4 * HOUR]
    assert await _versions(db, rule, stamps) == [now]
    t = db.table("gc")
    await t.mutate_row(b"s", [SetCell("cf", b"q", b"a", now), SetCell("cf", b"q", b"b", now - 1)])
    await db.set_gc_rule("gc", "cf", MaxVersionsRule(max_versions=1))
    assert (await db.describe_table("gc")).families["cf"].gc_rule == MaxVersionsRule(max_versions=1)
    assert values(await t.read_row(b"s")) == [("cf", b"q", now, b"a")]
    await db.set_gc_rule("gc", "cf", None)
    assert (await db.describe_table("gc")).families["cf"].gc_rule is None


async def test_gc_rules_apply_per_family(db: AsyncClient) -> None:
    t = await db.create_table(
        "t", [ColumnFamily(name="one", gc_rule=MaxVersionsRule(max_versions=1)), "all"]
    )
    muts = [SetCell(f, b"q", b"v%d" % i, i) for f in ("one", "all") for i in (1, 2, 3)]
    await t.mutate_row(b"r", muts)
    assert [(c[0], c[2]) for c in values(await t.read_row(b"r"))] == [
        ("all", 3),
        ("all", 2),
        ("all", 1),
        ("one", 3),
    ]


# ---------------------------------------------------------------------------- locality groups


@pytest.mark.parametrize("compression", ["zstd", "lz4", "snappy", "none"])
async def test_locality_group_compression_round_trips(db: AsyncClient, compression: str) -> None:
    group = LocalityGroup(name="lg", compression=compression, block_size=1024)  # type: ignore[arg-type]
    t = await db.create_table(
        "t", [ColumnFamily(name="cf", locality_group="lg"), "plain"], locality_groups=[group]
    )
    payload = {b"r%03d" % i: (b"value-%d-" % i) * 40 for i in range(60)}
    await t.mutate_rows(
        [
            RowMutation(k, (SetCell("cf", b"q", v, 7), SetCell("plain", b"p", k, 7)))
            for k, v in payload.items()
        ]
    )
    await db.flush("t")
    schema = await db.describe_table("t")
    assert schema.locality_groups["lg"] == group
    assert schema.families["cf"].locality_group == "lg"
    got = {r.key: r.latest("cf", b"q") for r in await rows_of(t, families=["cf"])}
    assert got == payload
    got_plain = {r.key: r.latest("plain", b"p") for r in await rows_of(t, families=["plain"])}
    assert got_plain == {k: k for k in payload}


async def test_in_memory_locality_group_survives_flush_compact_and_reopen(
    db: AsyncClient, db_url: str
) -> None:
    hot = LocalityGroup(name="hot", in_memory=True, compression="none")
    t = await db.create_table(
        "t", [ColumnFamily(name="h", locality_group="hot"), "cold"], locality_groups=[hot]
    )
    await t.mutate_row(b"r", [SetCell("h", b"q", b"hot", 1), SetCell("cold", b"q", b"cold", 1)])
    await db.flush("t")
    await t.mutate_row(b"r", [SetCell("h", b"q", b"hot2", 2)])
    await db.compact("t")
    expected = [("cold", b"q", 1, b"cold"), ("h", b"q", 2, b"hot2"), ("h", b"q", 1, b"hot")]
    assert values(await t.read_row(b"r")) == expected
    assert (await db.describe_table("t")).locality_groups["hot"].in_memory is True
    if db_url.startswith("file://"):
        db2 = await reopen(db, db_url)
        try:
            assert values(await db2.table("t").read_row(b"r")) == expected
        finally:
            await db2.close()


async def test_added_locality_group_can_hold_a_new_family(db: AsyncClient) -> None:
    t = await db.create_table("t", ["cf"])
    await db.add_locality_group("t", LocalityGroup(name="lz", compression="lz4"))
    await db.create_family("t", ColumnFamily(name="new", locality_group="lz"))
    await t.mutate_row(b"r", [SetCell("new", b"q", b"v", 3)])
    await db.flush("t")
    assert values(await t.read_row(b"r", families=["new"])) == [("new", b"q", 3, b"v")]
    assert (await db.describe_table("t")).locality_groups["lz"].compression == "lz4"


# ---------------------------------------------------------------------------- ACLs

_SECRET = ColumnFamily(name="secret", acl=Acl(readers=["alice"], writers=["alice"]))
_PUBLIC_READ = ColumnFamily(name="board", acl=Acl(readers=None, writers=["alice"]))


async def _acl_table(db: AsyncClient) -> AsyncClient:
    """As alice: a table with an open family, a secret one and a read-only board, one row."""
    db.identity = "alice"
    t = await db.create_table("t", ["open", _SECRET, _PUBLIC_READ])
    await t.mutate_row(
        b"r",
        [
            SetCell("open", b"q", b"o", 1),
            SetCell("secret", b"q", b"s3cret", 1),
            SetCell("board", b"q", b"b", 1),
        ],
    )
    return db


async def test_acl_owner_reads_and_writes_everything(db: AsyncClient) -> None:
    alice = await _acl_table(db)
    t = alice.table("t")
    assert [c[0] for c in values(await t.read_row(b"r"))] == ["board", "open", "secret"]
    await t.mutate_row(b"r", [DeleteRow()])
    assert await t.read_row(b"r") is None


async def test_identity_given_to_connect_is_checked(db: AsyncClient, db_url: str) -> None:
    """``connect(url, identity=...)``: the identity of a new connection is the one checked."""
    await _acl_table(db)
    bob = await reopen(db, db_url, identity="bob")
    try:
        assert bob.identity == "bob"
        with pytest.raises(PermissionDenied, match="bob may not write"):
            await bob.table("t").mutate_row(b"r", [SetCell("secret", b"q", b"x")])
        assert "secret" not in [c[0] for c in values(await bob.table("t").read_row(b"r"))]
    finally:
        await bob.close()


async def test_acl_reads_hide_unreadable_families_everywhere(db: AsyncClient) -> None:
    bob = await _acl_table(db)
    bob.identity = "bob"
    t = bob.table("t")
    visible = [("board", b"q", 1, b"b"), ("open", b"q", 1, b"o")]
    assert values(await t.read_row(b"r")) == visible
    assert [values(r) for r in await rows_of(t)] == [visible]
    assert [values(r) for r in await rows_of(t, filter=PassAll())] == [visible]
    secret_only = await t.read_row(b"r", families=["secret"])
    assert secret_only is None
    # A predicate cannot probe a family the caller may not read.
    probe = await t.check_and_mutate_row(
        b"r",
        ValueRegex(b"s3cret"),
        true_mutations=[SetCell("open", b"leak", b"1")],
        false_mutations=[SetCell("open", b"noleak", b"1")],
    )
    assert probe is False
    with pytest.raises(PermissionDenied, match="secret"):
        await t.read_modify_write_row(b"r", [AppendValue("secret", b"q", b"x")])


async def test_acl_writes_are_denied_on_every_write_path(db: AsyncClient) -> None:
    bob = await _acl_table(db)
    bob.identity = "bob"
    t = bob.table("t")
    for family in ("secret", "board"):
        with pytest.raises(PermissionDenied, match=f"bob.*{family}"):
            await t.mutate_row(b"r", [SetCell(family, b"q", b"x")])
    with pytest.raises(PermissionDenied):
        await t.mutate_row(b"r", [DeleteRow()])  # a row delete writes every family
    with pytest.raises(PermissionDenied):
        await t.check_and_mutate_row(b"r", None, true_mutations=[SetCell("board", b"q", b"x")])
    with pytest.raises(PermissionDenied):
        await t.read_modify_write_row(b"r", [IncrementValue("board", b"n", 1)])
    with pytest.raises(MutationsFailed) as info:
        await t.mutate_rows(
            [
                RowMutation(b"a", (SetCell("open", b"q", b"ok"),)),
                RowMutation(b"b", (SetCell("secret", b"q", b"no"),)),
            ]
        )
    [failure] = info.value.failures
    assert (failure.index, failure.row) == (1, b"b")
    assert isinstance(failure.error, PermissionDenied)
    assert (await t.read_row(b"a")) is not None
    await t.mutate_row(b"r", [SetCell("open", b"q2", b"fine", 2)])
    bob.identity = "alice"
    row = await bob.table("t").read_row(b"r")
    assert values(row)[:1] == [("board", b"q", 1, b"b")]
    assert ("secret", b"q", 1, b"s3cret") in values(row)


async def test_acl_change_applies_to_the_next_request(db: AsyncClient) -> None:
    """Granting and revoking take effect on the next request, not at reconnection."""
    alice = await _acl_table(db)
    t = alice.table("t")
    await alice.update_family("t", _SECRET.model_copy(update={"acl": Acl(readers=["carol"])}))
    assert [c[0] for c in values(await t.read_row(b"r"))] == ["board", "open"]
    await alice.update_family(
        "t", _SECRET.model_copy(update={"acl": Acl(readers=["alice"], writers=["carol"])})
    )
    with pytest.raises(PermissionDenied):
        await t.mutate_row(b"r", [SetCell("secret", b"q", b"x")])
    assert "secret" in [c[0] for c in values(await t.read_row(b"r"))]


async def test_wildcard_acl_and_anonymous_identity(db: AsyncClient) -> None:
    fam = ColumnFamily(name="any", acl=Acl(readers=["*"], writers=["*"]))
    named = ColumnFamily(name="named", acl=Acl(readers=["alice"], writers=["alice"]))
    t = await db.create_table("t", [fam, named])
    await t.mutate_row(b"r", [SetCell("any", b"q", b"v", 1)])
    assert values(await t.read_row(b"r")) == [("any", b"q", 1, b"v")]
    with pytest.raises(PermissionDenied, match="anonymous"):
        await t.mutate_row(b"r", [SetCell("named", b"q", b"v")])


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("family", "why"),
    [
        ("", "1-64"),
        ("has space", "printable"),
        ("a:b", "':'"),
        ("x" * 65, "1-64"),
        ("tab\t", "printable"),
        ("caf\u00e9", "printable"),
    ],
)
async def test_invalid_family_names_are_precise_errors(
    db: AsyncClient, family: str, why: str
) -> None:
    with pytest.raises(InvalidArgument, match=why) as info:
        await db.create_table("t", [family])
    assert repr(family) in str(info.value)
    assert "\n" not in str(info.value)
    await db.create_table("ok", ["cf"])
    with pytest.raises(InvalidArgument, match=why):
        await db.create_family("ok", family)
    assert await db.list_tables() == ["ok"]


@pytest.mark.parametrize("name", ["", "has space", "slash/name", "x" * 65, "t\u00e9"])
async def test_invalid_table_names_are_precise_errors(db: AsyncClient, name: str) -> None:
    with pytest.raises(InvalidArgument, match="table name") as info:
        await db.create_table(name, ["cf"])
    assert repr(name) in str(info.value)
    assert await db.list_tables() == []


async def test_schema_consistency_errors(db: AsyncClient) -> None:
    with pytest.raises(InvalidArgument, match="unknown locality group 'nowhere'"):
        await db.create_table("t", [ColumnFamily(name="cf", locality_group="nowhere")])
    await db.create_table("t", ["cf"])
    with pytest.raises(InvalidArgument, match="nowhere"):
        await db.create_family("t", ColumnFamily(name="x", locality_group="nowhere"))
    with pytest.raises(InvalidArgument, match="nowhere"):
        await db.update_family("t", ColumnFamily(name="cf", locality_group="nowhere"))
    assert sorted((await db.describe_table("t")).families) == ["cf"]


def test_invalid_rule_and_group_values_fail_at_construction() -> None:
    """Schema values are validated when built, with the field named."""
    with pytest.raises(ValueError, match="max_versions"):
        MaxVersionsRule(max_versions=0)
    with pytest.raises(ValueError, match="max_age_seconds"):
        MaxAgeRule(max_age_seconds=-1)
    with pytest.raises(ValueError, match="rules"):
        UnionRule(rules=[])
    with pytest.raises(ValueError, match="compression"):
        LocalityGroup(name="g", compression="gzip")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="block_size"):
        LocalityGroup(name="g", block_size=10)
    with pytest.raises(ValueError, match="printable"):
        ColumnFamily(name="bad name")
    with pytest.raises(ValueError, match="extra"):
        ColumnFamily(name="cf", extra=1)  # type: ignore[call-arg]


def test_public_names_are_exported() -> None:
    for name in ("connect", "connect_async", "ColumnFamily", "Acl", "LocalityGroup", "UnionRule"):
        assert hasattr(tabletstore, name)
