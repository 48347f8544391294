"""The Grafana dashboard (tabletstore/ops/grafana/tabletstore.json) queries only metrics that
exist: every ``tabletstore_*`` name in its PromQL is a sample name a worker's or a master's
registry exports (tabletstore.ops.metrics), and every metric they export is on some panel."""

from __future__ import annotations

import json
import re
from importlib import resources
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tabletstore.data.model import SetCell
from tabletstore.embedded import Database
from tabletstore.ops.metrics import MasterMetrics
from tests.tablet_harness import until

pytestmark = pytest.mark.timeout(60)

_NAME = re.compile(r"\btabletstore_[a-z0-9_]+\b")
#: Sample names per metric type: what PromQL can select (prometheus_client's text format).
_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
}


def dashboard() -> dict[str, Any]:
    text = resources.files("tabletstore.ops").joinpath("grafana", "tabletstore.json").read_text()
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def targets(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [t for p in dash["panels"] for t in p.get("targets", [])]


def exported(text: str) -> set[str]:
    names = set()
    for family in text_string_to_metric_families(text):
        for suffix in _SUFFIXES[family.type]:
            names.add(family.name + suffix)
    return names


async def exported_names() -> set[str]:
    """The sample names of a worker (an embedded database after some traffic, so its object
    store and compactions are counted too) and of a master."""
    db = await Database.open("memory://test-grafana", instrument=True)
    try:
        await db.create_table("t", ["f"])
        await db.table("t").mutate_row(b"k", [SetCell("f", b"q", b"v")])
        await db.flush("t")
        # The heap's gauges appear with the heap trimmer's first reading, taken on a thread
        # when the worker starts: on a loaded machine it may come after the traffic above.
        trimmer = db.worker.heap_trimmer
        if trimmer is not None and trimmer.available:
            await until(lambda: trimmer.last is not None)
        worker = await db.metrics_text()
    finally:
        await db.close()
    master = MasterMetrics("m")
    master.gc_round(deleted_objects=1, deleted_bytes=1)
    return exported(worker) | exported(master.exposition().decode())


async def test_every_metric_the_dashboard_queries_is_exported() -> None:
    names = await exported_names()
    queried = {n for t in targets(dashboard()) for n in _NAME.findall(t["expr"])}
    assert queried, "the dashboard queries nothing"
    assert queried <= names, f"not exported: {sorted(queried - names)}"
    # ...and nothing exported is left off the dashboard (the _created twins aside).
    families = {
        re.sub(r"_(total|bucket|sum|count)$", "", n) for n in names if not n.endswith("_created")
    }
    shown = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in queried}
    assert families <= shown, f"not on the dashboard: {sorted(families - shown)}"


def test_the_dashboard_is_well_formed() -> None:
    dash = dashboard()
    assert dash["title"] == "tabletstore" and dash["uid"] == "tabletstore"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"] for v in dash["templating"]["list"]}
    assert variables == {"datasource", "instance"}
    for panel in dash["panels"]:
        assert {"h", "w", "x", "y"} <= panel["gridPos"].keys()
        assert panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}"
        refs = [t["refId"] for t in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            assert 'instance=~"$instance"' in target["expr"], target["expr"]
