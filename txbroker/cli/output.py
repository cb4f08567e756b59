"""How commands print: aligned tables and fields (rich) for people, JSON for programs.

With ``--json`` a listing or a stream (topics, groups, transactions, dead letters, sent and
consumed messages) prints one JSON object per line, and a show/describe command one object.
Without it, tables go to stdout; notes, spinners and progress go to stderr, so a pipe gets
only the data. Off a terminal (a pipe, a file) tables have no borders and no width limit, so
``grep`` and ``awk`` see one row per line.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from txbroker.runtime.timetext import ago

# rich is imported where something is drawn: a command printing JSON or plain lines (send,
# consume, any --json) starts without it.
if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

__all__ = [
    "Column",
    "RunProgress",
    "err_console",
    "human_time",
    "note",
    "out_console",
    "print_fields",
    "print_json",
    "print_table",
    "rate_text",
    "status",
]

# Off a terminal, rows are never cut or wrapped (rich would fit them to 80 columns).
PIPE_WIDTH = 4096


def _console(*, stderr: bool) -> Console:
    from rich.console import Console

    c = Console(stderr=stderr, highlight=False)
    if not c.is_terminal:
        c = Console(stderr=stderr, highlight=False, width=PIPE_WIDTH)
    return c


def out_console() -> Console:
    return _console(stderr=False)


def err_console() -> Console:
    return _console(stderr=True)


def print_json(obj: object) -> None:
    print(json.dumps(obj), flush=True)


def note(text: str) -> None:
    """A remark for the person at the terminal (counts, what was done): on stderr."""
    err_console().print(text, style="dim", markup=False)


@dataclass(frozen=True)
class Column:
    header: str
    numeric: bool = False  # right-aligned
    max_width: int | None = None  # longer values are cut with an ellipsis (on a terminal)


def print_table(
    columns: Sequence[Column | str],
    rows: Iterable[Sequence[object]],
    *,
    title: str | None = None,
    empty: str = "nothing to show",
) -> None:
    """An aligned table on stdout; ``empty`` goes to stderr when there are no rows."""
    from rich import box
    from rich.table import Table

    console = out_console()
    cols = [c if isinstance(c, Column) else Column(c) for c in columns]
    framed = console.is_terminal
    table = Table(
        title=title if framed else None,
        box=box.SIMPLE_HEAD if framed else None,
        show_edge=False,
        pad_edge=False,
        header_style="bold",
    )
    for c in cols:
        table.add_column(
            c.header,
            justify="right" if c.numeric else "left",
            max_width=c.max_width if framed else None,
            overflow="ellipsis",
            no_wrap=True,
        )
    n = 0
    for row in rows:
        table.add_row(*(_cell(v) for v in row))
        n += 1
    if n == 0:
        note(empty)
        return
    if title and not framed:
        console.print(title, markup=False)
    _emit(console, table)


def print_fields(fields: Mapping[str, object], *, title: str | None = None) -> None:
    """Name: value pairs, names right-aligned, for one thing shown in full."""
    from rich.table import Table

    console = out_console()
    grid = Table.grid(padding=(0, 2))
    grid.add_column(justify="right", style="bold", no_wrap=True)
    grid.add_column()
    for name, value in fields.items():
        grid.add_row(name, _cell(value))
    if title:
        console.print(title, style="bold", markup=False)
    _emit(console, grid)


def _emit(console: Console, renderable: Table) -> None:
    if console.is_terminal:
        console.print(renderable)
        return
    # Off a terminal, without the padding rich gives the last column: lines end at their text.
    with console.capture() as captured:
        console.print(renderable)
    text = "\n".join(line.rstrip() for line in captured.get().splitlines())
    print(text, flush=True)


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


# --- times ---


def human_time(ms: int, now_ms: int | None = None) -> str:
    """Local ISO time with the offset, and how long ago: '2025-06-01 14:03:22+02:00 (3 min
    ago)'. Zero (never) is '-'."""
    if ms <= 0:
        return "-"
    local = datetime.fromtimestamp(ms / 1000).astimezone()
    return f"{local.isoformat(sep=' ', timespec='seconds')} ({ago(ms, now_ms)})"


def rate_text(rate: float | None) -> str:
    """A rate the broker measured over the last minute, or why there is none yet."""
    if rate is None:
        return "- (measured once the broker has watched it for a few seconds)"
    return f"{rate:,.1f} msgs/s over the last minute"


# --- long commands ---


@contextmanager
def status(text: str, *, enabled: bool = True) -> Iterator[None]:
    """A spinner on stderr while a step runs (a terminal only: a log gets nothing)."""
    console = err_console()
    if not enabled or not console.is_terminal:
        yield
        return
    with console.status(text):
        yield


class RunProgress:
    """Progress over a command's runs, on stderr: a rich bar on a terminal, a line per
    finished run in a log, nothing with ``enabled=False`` (``--json``).

    Call it as ``progress(done, total)``: before the first run (done=0) and after each."""

    def __init__(self, description: str, *, enabled: bool = True) -> None:
        self.description = description
        self.enabled = enabled
        self._console = err_console()
        self._bar: Progress | None = None
        self._task: Any = None
        self._t0 = time.monotonic()

    def __enter__(self) -> RunProgress:
        if self.enabled and self._console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                SpinnerColumn,
                TextColumn,
                TimeElapsedColumn,
            )

            self._bar = Progress(
                SpinnerColumn(),
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self._console,
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=None)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.update(self._task, completed=done, total=total)
        elif done > 0:
            elapsed = time.monotonic() - self._t0
            print(
                f"{self.description}: run {done}/{total} done ({elapsed:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
