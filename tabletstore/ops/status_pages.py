"""The status pages' HTML: the master's (:class:`ClusterView`) and a worker's
(:class:`WorkerView`), rendered on the server with Jinja2 from the package's ``web/`` templates.

The page is what an operator of Bigtable's master would look at (§5.2: which tablet servers
are alive, which tablets are assigned where; §5.4, §6: compactions and load), readable with no
build step and no internet: server-rendered tables, and a small hand-written script
(``web/status.js``) that draws the charts as inline SVG from ``/api/charts`` and refreshes the
sections in place. Templates are autoescaped: row keys, ids and event details are user data.
"""

from __future__ import annotations

import time
from functools import cache
from importlib import resources

import jinja2

from tabletstore.ops.status_api import Charts, ClusterView, WorkerView

__all__ = ["REFRESH_SECONDS", "STATIC_FILES", "render_master", "render_worker", "static_file"]

#: How often the page refreshes its sections.
REFRESH_SECONDS = 5.0
#: The static files the pages load: name -> content type.
STATIC_FILES = {
    "status.js": "text/javascript; charset=utf-8",
    "status.css": "text/css; charset=utf-8",
}
_KEY_SHOWN = 40


def _size(n: int | None) -> str:
    if n is None:
        return "—"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _rate(v: float | None) -> str:
    if v is None:
        return "—"
    return f"{v:.0f}/s" if v >= 10 else f"{v:.1f}/s"


def _seconds(v: float | None) -> str:
    return "—" if v is None else f"{v:.1f} s"


def _clock(at: float | None) -> str:
    if not at:
        return "—"
    return time.strftime("%H:%M:%S", time.localtime(at))


def _key(key: str) -> str:
    return key if len(key) <= _KEY_SHOWN else key[: _KEY_SHOWN - 1] + "…"


def _key_range(start: str, end: str | None) -> str:
    left = _key(start) if start else "(first row)"
    right = _key(end) if end is not None else "(end)"
    return f"[{left}, {right})"


def _kind_class(kind: str) -> str:
    """The CSS class of an event kind (tablet events: metadata/record.py's ``with_event``)."""
    if kind.endswith("_compaction"):
        return "compaction"
    if kind in ("split", "merged"):
        return "split"
    if kind.startswith("gc"):
        return "gc"
    if "recover" in kind or "replay" in kind or "sort" in kind:
        return "recovery"
    if kind in ("assigned", "loaded", "unloaded", "created", "moved"):
        return "assign"
    return ""


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("tabletstore.ops", "web"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(
        size=_size,
        rate=_rate,
        seconds=_seconds,
        clock=_clock,
        key_range=_key_range,
        kind_class=_kind_class,
    )
    return env


def render_master(view: ClusterView, charts: Charts) -> str:
    return (
        _environment()
        .get_template("master.html")
        .render(
            view=view,
            generated_at=view.generated_at,
            refresh_seconds=REFRESH_SECONDS,
            interval=charts.interval_seconds,
            window=charts.window_seconds,
        )
    )


def render_worker(view: WorkerView, charts: Charts) -> str:
    return (
        _environment()
        .get_template("worker.html")
        .render(
            view=view,
            generated_at=view.generated_at,
            refresh_seconds=REFRESH_SECONDS,
            interval=charts.interval_seconds,
            window=charts.window_seconds,
        )
    )


@cache
def static_file(name: str) -> bytes | None:
    """A static file's bytes from the package data, or None for a name not served."""
    if name not in STATIC_FILES:
        return None
    return resources.files("tabletstore.ops").joinpath("web", name).read_bytes()
