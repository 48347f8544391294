"""``tabletstore status``: the cluster's master, workers and their tablets (size, load) and
recent tablet events; on a cluster whose master serves one, the status page's URL."""

from __future__ import annotations

import asyncio
import time

import click
from rich.console import Console
from rich.table import Table as RichTable

from tabletstore.cli import cbtsyntax as cbt
from tabletstore.cli.context import cli_context, failing, with_database
from tabletstore.coordination import open_coordinator
from tabletstore.embedded import SyncDatabase

__all__ = ["status_cmd"]


@click.command("status")
@click.option("--events", type=int, default=15, show_default=True, help="Recent events shown.")
def status_cmd(events: int) -> None:
    """The cluster: master, workers and their tablets (size, load), recent tablet events."""

    def body(db: SyncDatabase) -> str | None:
        st = db.status(events=events)
        console = Console()
        console.print(f"master: {st.master or '(embedded)'}")
        table = RichTable(
            "worker", "address", "tablet", "rows", "SSTables", "bytes", "memtable", "requests"
        )
        for worker_id, ws in st.workers.items():
            if isinstance(ws, str):
                table.add_row(worker_id, ws, "", "", "", "", "", "")
                continue
            if not ws.tablets:
                table.add_row(worker_id, ws.address, "(none)", "", "", "", "", "")
            for t in ws.tablets:
                rows = f"[{cbt.printable_key(t.start_row)}, {cbt.printable_key(t.end_row) if t.end_row is not None else '∞'})"
                table.add_row(
                    worker_id,
                    ws.address,
                    f"{t.table_id}/{t.tablet_id}",
                    rows,
                    str(t.sstables),
                    str(t.sstable_bytes),
                    str(t.memtable_bytes),
                    str(t.requests),
                )
        console.print(table)
        for at, where, kind, detail in st.events:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
            console.print(f"{stamp}  {where:<30} {kind:<20} {detail}")
        master: str | None = st.master
        return master

    master = with_database(body)
    obj = cli_context()
    if master and obj.url.startswith("etcd://"):
        page = failing(lambda: asyncio.run(_master_page(obj.url, master)))
        if page is not None:
            click.echo(f"status page: {page}/")


async def _master_page(url: str, master: str) -> str | None:
    """The leading master's status page, if it serves one (``--metrics-port``)."""
    # Imported here: ops.views brings aiohttp, which no other verb needs at start-up.
    from tabletstore.ops.views import page_urls

    coordinator = open_coordinator(url)
    try:
        return (await page_urls(coordinator, "master")).get(master)
    finally:
        await coordinator.close()
