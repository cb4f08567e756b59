"""Templates and the few formatting helpers the pages share.

Jinja2 with autoescaping on for every template (not only ``.html``): a topic name, key, header,
body, reason or id is user data and reaches the page only escaped. Undefined names fail loudly
(``StrictUndefined``), so a typo in a template is an error in tests, not an empty cell.
"""

from __future__ import annotations

from datetime import datetime

import jinja2
from starlette.templating import Jinja2Templates

from txbroker.runtime.timetext import ago

__all__ = ["duration_ms", "number", "rate", "templates", "when"]


# Ages past this many seconds are shown in minutes, hours, days.
def when(ms: int | None) -> str:
    """Local time to the second, as the CLI shows it."""
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000).strftime("%Y-%m-%d %H:%M:%S")


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
