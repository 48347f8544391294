"""The master's status page in a real browser, over a real cluster.

A leading master, a standby and two workers run as ``tabletstore`` processes with their status
pages on (etcd and moto's S3 server from the session fixtures); a client creates a table with
three tablets and keeps writing. Debian's ``chromium``, headless and driven by Playwright
(never ``playwright install``: no browser is downloaded), opens the master's page and checks
what a person sees: both masters, both workers serving with their lease time, the table's
three tablets with their row ranges and workers, events, a chart drawn, and a link to a
worker's page that loads and shows that worker's tablets. The JSON behind the page validates
as its pydantic models. A screenshot is saved under the test's tmp dir (and, with
``TABLETSTORE_SCREENSHOT=PATH``, copied there: that is how docs/status-page.png is made).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import BrowserContext, Page, expect, sync_playwright

import tabletstore
from tabletstore.data.model import SetCell
from tabletstore.ops.status_api import Charts, ClusterView, WorkerView
from tests.integration.cluster_harness import Cluster

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

CHROMIUM = "/usr/bin/chromium"
#: Flags for a quiet, offline, throw-away headless browser (Playwright adds --headless).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Seconds to wait for what the page shows (samples every 2 s, refresh every 5 s, a loaded CI).
SEEN = 60_000


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        body: bytes = response.read()
        return body


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[BrowserContext]:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: apt-get install chromium (scripts/test.sh does)")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            yield context
        finally:
            context.close()


@pytest.fixture
def cluster(etcd_url: str, s3_url: str, tmp_path: Path) -> Iterator[Cluster]:
    # Leases of 10 s, not the harness's 3 s: this test is about the page, and a worker that
    # misses its keep-alives on a loaded machine (a browser runs too) exits and fails it.
    c = Cluster(
        url=etcd_url,
        store_url=s3_url,
        directory=tmp_path / "cluster",
        metrics=True,
        lease_ttl=10.0,
    )
    try:
        yield c
    finally:
        c.close()


def write_until(url: str, stop: threading.Event, errors: list[BaseException]) -> None:
    """Writes and reads into ``webtable`` until ``stop`` is set (the charts' traffic)."""
    try:
        db = tabletstore.connect(url)
        try:
            table = db.table("webtable")
            i = 0
            while not stop.is_set():
                row = b"%s.site%04d" % ((b"com", b"net", b"org")[i % 3], i % 500)
                table.mutate_row(row, [SetCell("contents", b"html", b"<html>%d" % i)])
                if i % 4 == 0:
                    list(table.read_rows(prefix=b"net.", limit=10))
                i += 1
        finally:
            db.close()
    except BaseException as exc:  # reported by the test; the thread must not die silently
        errors.append(exc)


def test_the_master_page_shows_the_cluster(
    cluster: Cluster, browser: BrowserContext, tmp_path: Path
) -> None:
    master = cluster.start_master()
    standby = cluster.start_master()
    workers = [cluster.start_worker(), cluster.start_worker()]
    assert master.metrics_url and standby.metrics_url
    db = tabletstore.connect(cluster.url)
    try:
        db.create_table("webtable", ["contents"], split_keys=[b"net", b"org"])
    finally:
        db.close()
    stop, errors = threading.Event(), []
    writer = threading.Thread(target=write_until, args=(cluster.url, stop, errors))
    writer.start()
    try:
        page = browser.new_page()
        page.goto(f"{master.metrics_url}/")
        see_the_cluster(page, master.url, standby.url, len(workers))
        see_the_table(page)
        expect(page.locator("#events tbody tr").first).to_contain_text("webtable/", timeout=SEEN)
        # A chart is drawn once two samples of some worker exist.
        expect(page.locator("figure.chart svg polyline").first).to_be_attached(timeout=SEEN)
        shot = tmp_path / "status-page.png"
        docs_copy = os.environ.get("TABLETSTORE_SCREENSHOT")
        if (
            docs_copy
        ):  # docs/operations/monitoring.md's picture: wait for a minute of samples to draw
            expect(page.locator("figure.chart svg polyline").first).to_have_attribute(
                "points", re.compile(r"^(\S+ ){25,}"), timeout=120_000
            )
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        if docs_copy:
            shutil.copyfile(shot, docs_copy)
        check_the_json(master.metrics_url)
        follow_a_worker_link(page)
    finally:
        stop.set()
        writer.join(timeout=60)
    assert not errors, errors


def see_the_cluster(page: Page, leader: str, standby: str, workers: int) -> None:
    masters = page.locator("#masters tbody tr")
    expect(masters).to_have_count(2, timeout=SEEN)
    expect(masters.nth(0)).to_contain_text(leader)
    expect(masters.nth(0)).to_contain_text("leader")
    expect(masters.nth(1)).to_contain_text(standby)
    expect(masters.nth(1)).to_contain_text("standby")
    rows = page.locator("#workers tr.worker")
    expect(rows).to_have_count(workers, timeout=SEEN)
    for i in range(workers):  # each worker answered the master's scrape and has a lease
        expect(rows.nth(i)).to_contain_text("serving", timeout=SEEN)
        expect(rows.nth(i).locator("td").nth(2)).to_have_text(
            re.compile(r"^\d+\.\d s$"), timeout=SEEN
        )


def see_the_table(page: Page) -> None:
    tablets = page.locator('details[data-table="webtable"] tr.tablet')
    expect(tablets).to_have_count(3, timeout=SEEN)
    expect(tablets.nth(0).locator("td.rows")).to_have_text("[(first row), net)")
    expect(tablets.nth(1).locator("td.rows")).to_have_text("[net, org)")
    expect(tablets.nth(2).locator("td.rows")).to_have_text("[org, (end))")
    for i in range(3):  # assigned to a worker, linked to its page
        expect(tablets.nth(i).locator("a")).to_have_text(re.compile(r"^w-"), timeout=SEEN)


def check_the_json(base: str) -> None:
    view = ClusterView.model_validate_json(get(f"{base}/api/cluster"))
    assert view.master.leading and len(view.masters) == 2
    assert [t.name for t in view.tables] == ["webtable"]
    charts = Charts.model_validate_json(get(f"{base}/api/charts"))
    assert any(len(s.points) >= 1 for s in charts.series)


def follow_a_worker_link(page: Page) -> None:
    link = page.locator("#workers a.worker-link").first
    worker_id = link.inner_text()
    href = link.get_attribute("href")
    assert href is not None and href.startswith("http://127.0.0.1:")
    page.goto(href)
    expect(page.locator("h1")).to_contain_text(f"worker {worker_id}")
    expect(page.locator("#worker table.tablets tbody tr").first).to_be_visible()
    expect(page.locator("a.master-link").first).to_be_visible(timeout=SEEN)
    view = WorkerView.model_validate_json(get(f"{href.rstrip('/')}/api/worker"))
    assert view.status.id == worker_id
