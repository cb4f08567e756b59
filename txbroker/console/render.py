"""Templates and the few formatting helpers the pages share.

Jinja2 with autoescaping on for every template (not only ``.html``): a topic name, key, header,
body, reason or id is user data and reaches the page only escaped. Undefined names fail loudly
(``StrictUndefined``), so a typo in a template is an error in tests, not an empty cell.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Final

import jinja2
from starlette.templating import Jinja2Templates

__all__ = ["ago", "duration_ms", "number", "rate", "templates", "when"]

# Ages past this many seconds are shown in minutes, hours, days.
_UNITS: Final = ((86_400, "d"), (3_600, "h"), (60, "min"))


def when(ms: int | None) -> str:
    """Local time to the second, as the CLI shows it."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


def _span(seconds: float) -> str:
    for size, unit in _UNITS:
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def ago(ms: int | None, now_ms: int | None = None) -> str:
    """``12 s ago``, ``in 3 min``, or ``now``."""
    if not ms:
        return "-"
    now = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    delta = (now - ms) / 1000
    if abs(delta) < 1:
        return "now"
    return f"{_span(delta)} ago" if delta > 0 else f"in {_span(-delta)}"


def duration_ms(ms: object) -> str:
    if not isinstance(ms, int | float):
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    return f"{ms / 1000:.1f} s"


def rate(per_s: float | None) -> str:
    return "-" if per_s is None else f"{per_s:,.1f}/s"


def number(n: object) -> str:
    """Thousands separated; anything else (a summary written by another version) as text."""
    if n is None:
        return "-"
    return f"{n:,}" if isinstance(n, int | float) else str(n)


def templates() -> Jinja2Templates:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("txbroker.console", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(when=when, ago=ago, duration_ms=duration_ms, rate=rate, number=number)
    return Jinja2Templates(env=env)
