"""What a status page's viewer may see of each table: row keys only of tables it may read
(§5.3: row keys are data; the status pages are §5.2's view of the master and its servers).

A status endpoint with TLS knows its viewer: the principal of its client certificate, or the
read-only status token (a scraper, with no name of its own). The cluster's own identities see
every table's keys -- a master builds its page from its workers' ``/status`` with its own
certificate, and the operators' view is a cluster certificate (``certs issue ops --role
master``) --, as does any viewer of an endpoint without TLS (no authentication anywhere). For
every other viewer (a client certificate, the status token) a table whose keys it may not see
(``security.table_visibility.may_see_keys``; the status token is a principal named
``status-token`` in the ACLs) keeps its name, id, tablet count, sizes and rates, while each of
its tablets' boundaries is blanked (``keys_hidden``) and its events' details, which name split
keys, are emptied.

:func:`hide_keys` is pure: it takes a document and the tables whose keys stay.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TypeVar

from pydantic import BaseModel

from tabletstore.ops.status_api import (
    ClusterView,
    EventInfo,
    MasterStatus,
    TabletInfo,
    TabletView,
    WorkerStatus,
    WorkerView,
)
from tabletstore.security.principal import Principal
from tabletstore.security.table_visibility import TableLike, may_see_keys

__all__ = ["STATUS_TOKEN_VIEWER", "Shown", "hide_keys", "shown_to"]

#: Who the status token's bearer is, for the tables' ACLs.
STATUS_TOKEN_VIEWER = Principal("status-token", "client", via="status token")

D = TypeVar("D", bound=BaseModel)


@dataclass(frozen=True, slots=True)
class Shown:
    """The tables whose row keys a viewer may see, by id and by name."""

    table_ids: frozenset[str]
    names: frozenset[str]


def shown_to(viewer: Principal, tables: Iterable[tuple[str, str, TableLike]]) -> Shown | None:
    """What ``viewer`` may see of ``tables`` (id, name, schema); None: everything."""
    if viewer.is_cluster:
        return None
    seen = [(table_id, name) for table_id, name, schema in tables if may_see_keys(viewer, schema)]
    return Shown(frozenset(i for i, _ in seen), frozenset(n for _, n in seen))


def hide_keys(doc: D, shown: Shown | None) -> D:
    """``doc`` with the row keys of every table not ``shown`` blanked (module docstring)."""
    if shown is None:
        return doc
    out: BaseModel = doc
    if isinstance(doc, WorkerStatus):
        out = _worker(doc, shown)
    elif isinstance(doc, WorkerView):
        out = doc.model_copy(update={"status": _worker(doc.status, shown)})
    elif isinstance(doc, MasterStatus):
        out = _master(doc, shown)
    elif isinstance(doc, ClusterView):
        tables = [
            t
            if t.table_id in shown.table_ids
            else t.model_copy(update={"tablets": [_blank_view(v) for v in t.tablets]})
            for t in doc.tables
        ]
        out = doc.model_copy(
            update={
                "master": _master(doc.master, shown),
                "tables": tables,
                "events": _events(doc.events, shown),
            }
        )
    assert isinstance(out, type(doc))
    return out


def _worker(status: WorkerStatus, shown: Shown) -> WorkerStatus:
    tablets = [t if t.table_id in shown.table_ids else _blank_info(t) for t in status.tablets]
    return status.model_copy(update={"tablets": tablets})


def _master(status: MasterStatus, shown: Shown) -> MasterStatus:
    return status.model_copy(update={"recent_events": _events(status.recent_events, shown)})


def _events(events: list[EventInfo], shown: Shown) -> list[EventInfo]:
    """Events of hidden tables (``tablet`` is ``name/tablet id``) lose their details; the
    process's own events (a GC round: ``(garbage collector)``) keep theirs."""
    out = []
    for e in events:
        name, sep, _ = e.tablet.rpartition("/")
        if sep and name not in shown.names and e.detail:
            e = e.model_copy(update={"detail": ""})
        out.append(e)
    return out


def _blank_info(t: TabletInfo) -> TabletInfo:
    return t.model_copy(update={"start_row": "", "end_row": None, "keys_hidden": True})


def _blank_view(t: TabletView) -> TabletView:
    return t.model_copy(update={"start_row": "", "end_row": None, "keys_hidden": True})
