"""The ``tabletstore`` command with aggregate families: ``createfamily T F:TYPE``,
``addtocell``, and reads printing the aggregated numbers."""

from __future__ import annotations

import pytest

from tests.integration.test_cli import fails, ok


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"file://{tmp_path_factory.mktemp('cli-agg-db')}"


def test_createfamily_with_a_value_type_and_addtocell(url: str) -> None:
    ok("createtable", "views", "families=plain", url=url)
    for spec in ("total:sum", "low:min", "high:intmax", "visitors:hll"):
        ok("createfamily", "views", spec, url=url)
    assert ok("ls", "views", url=url).splitlines() == [
        "Family Name  GC Policy  Value Type",
        "-----------  ---------  ----------",
        "high                    max",
        "low                     min",
        "plain                   bytes",
        "total                   sum",
        "visitors                hll",
    ]
    for v in (5, -3, 40):
        ok("addtocell", "views", "page", f"total:n={v}@1000", f"low:n={v}@1000",
           f"high:n={v}@1000", url=url)  # fmt: skip
    ok("addtocell", "views", "page", "visitors:n=alice@1000", "visitors:n=bob@1000", url=url)
    ok("addtocell", "views", "page", "visitors:n=alice@1000", url=url)
    ok("flush", "views", url=url)
    ok("addtocell", "views", "page", "total:n=100@1000", url=url)
    out = ok("lookup", "views", "page", url=url).splitlines()
    values = {out[i].split()[0]: out[i + 1].strip() for i in range(2, len(out) - 1, 2)}
    assert values == {
        "high:n": "40",
        "low:n": "-3",
        "total:n": "142",
        "visitors:n": "2 (hll estimate)",
    }
    fails("addtocell", "views", "page", "plain:n=1", url=url, expect="not an aggregate family")
    fails("addtocell", "views", "page", "total:n=abc", url=url, expect="adds integers")
    fails("set", "views", "page", "total:n=1", url=url, expect="views:total")
    fails("createfamily", "views", "avg:mean", url=url, expect="sum, min, max, hll")
