"""paths.py: every coordinator key builds and parses back; bad components are rejected."""

from __future__ import annotations

import pytest

from tabletstore.coordination import paths
from tabletstore.errors import InvalidArgument


def test_layout() -> None:
    assert paths.server("w1") == "servers/w1"
    assert paths.schema("users") == "schemas/users"
    assert paths.acl("users") == "acls/users"
    assert paths.claim("t1", "tab-9") == "claims/t1/tab-9"
    assert paths.claims_prefix("t1") == "claims/t1/"
    assert paths.assignment("t1", "tab-9") == "assignments/t1/tab-9"
    assert paths.setting("gc_grace") == "settings/gc_grace"
    assert paths.election_prefix(paths.MASTER_ELECTION) == "elections/master/"
    assert paths.ROOT_TABLET == "root"


def test_parsers_invert_builders() -> None:
    assert paths.parse_server(paths.server("w-1")) == "w-1"
    assert paths.parse_schema(paths.schema("t")) == "t"
    assert paths.parse_acl(paths.acl("t")) == "t"
    assert paths.parse_claim(paths.claim("t", "x")) == ("t", "x")
    assert paths.parse_assignment(paths.assignment("t", "x")) == ("t", "x")
    assert paths.parse_setting(paths.setting("s")) == "s"


@pytest.mark.parametrize("bad", ["", "a/b", "nul\x00"])
def test_bad_components(bad: str) -> None:
    with pytest.raises(InvalidArgument):
        paths.server(bad)
    with pytest.raises(InvalidArgument):
        paths.claim("t", bad)


@pytest.mark.parametrize("key", ["servers/", "servers/a/b", "schemas/x", "claims/t", "claims/t/"])
def test_malformed_keys(key: str) -> None:
    with pytest.raises(InvalidArgument):
        if key.startswith("claims/"):
            paths.parse_claim(key)
        else:
            paths.parse_server(key)


def test_a_restores_sort_tasks_are_named_apart_from_a_recoverys() -> None:
    assert paths.sort("w", 1, 5) == "sorts/w/1/5"
    assert paths.sort("w", 1, 5, "r1") == "sorts/w/1/5/r1"
    assert paths.sorter("w", 1, 5, "r1") == "sorters/w/1/5/r1"
    assert paths.parse_sort_task(paths.sort("w", 1, 5)) == ("w", 1, 5, None)
    assert paths.parse_sort_task(paths.sort("w", 1, 5, "r1")) == ("w", 1, 5, "r1")
    for bad in ("sorts/w/1/x/r1", "sorts/w/1/5/r1/more", "sorts/w/1/5/", "sorters/w/1/5"):
        with pytest.raises(InvalidArgument):
            paths.parse_sort_task(bad)
    with pytest.raises(InvalidArgument):
        paths.sort("w", 1, 5, "a/b")
