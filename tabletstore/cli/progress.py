"""Progress bars for the verbs that take a while: ``import``, ``export``, ``flush`` and
``compact`` (the paper's minor and major compactions of every tablet, §5.4).

A bar (rich) shows what is done of the total in rows, bytes or tablets, the rate and the time
spent, on stderr, and only when stderr is a terminal: piped or redirected output stays exactly
what the verb prints, so scripts see no control characters. The bar is transient: when the
work ends it is erased and the verb's own summary line is what remains.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    ProgressColumn,
    Task,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.text import Text

__all__ = ["Bar", "Unit", "progress_bar"]

#: What a bar counts.
Unit = Literal["bytes", "rows", "tablets"]


class _CountColumn(ProgressColumn):
    """``1,234/5,000 rows`` (or ``1,234 rows`` while the total is unknown)."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self._unit = unit

    def render(self, task: Task) -> Text:
        done = f"{int(task.completed):,}"
        if task.total is None:
            return Text(f"{done} {self._unit}", style="progress.download")
        return Text(f"{done}/{int(task.total):,} {self._unit}", style="progress.download")


class _RateColumn(ProgressColumn):
    """``1,234 rows/s``: rich's speed estimate over the last updates."""

    def __init__(self, unit: str) -> None:
        super().__init__()
        self._unit = unit

    def render(self, task: Task) -> Text:
        speed = task.finished_speed or task.speed
        if speed is None:
            return Text(f"? {self._unit}/s", style="progress.data.speed")
        shown = f"{speed:,.0f}" if speed >= 10 else f"{speed:.1f}"
        return Text(f"{shown} {self._unit}/s", style="progress.data.speed")


class Bar:
    """One task's bar: advance it, or set how much is done (and the total, once known)."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task

    @property
    def enabled(self) -> bool:
        """False when nothing is shown (stderr is not a terminal)."""
        return not self._progress.disable

    def advance(self, amount: float = 1) -> None:
        self._progress.advance(self._task, amount)

    def update(
        self, *, completed: float | None = None, total: float | None = None, note: str | None = None
    ) -> None:
        """Set what is done, the total, and the note shown after the rate."""
        self._progress.update(self._task, completed=completed, total=total)
        if note is not None:
            self._progress.update(self._task, note=note)


@contextmanager
def progress_bar(
    description: str, *, unit: Unit, total: float | None = None, console: Console | None = None
) -> Iterator[Bar]:
    """A bar for ``description`` counting ``unit`` (``total`` None: not known yet), on
    ``console`` (default: stderr); disabled when that console is not a terminal. Thread-safe:
    the verbs advance it from the database's event-loop thread."""
    console = console if console is not None else Console(stderr=True)
    count: ProgressColumn
    rate: ProgressColumn
    if unit == "bytes":
        count, rate = DownloadColumn(), TransferSpeedColumn()
    else:
        count, rate = _CountColumn(unit), _RateColumn(unit)
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        count,
        rate,
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}"),
        console=console,
        disable=not console.is_terminal,
        transient=True,
    )
    with progress:
        yield Bar(progress, progress.add_task(description, total=total, note=""))
