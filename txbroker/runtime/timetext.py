"""Times as a person reads them, the same in the CLI, the console and the broker's logs: how long
ago an instant was ("3 min ago", "in 5 s") and how long something lasted ("4 min 12 s")."""

from __future__ import annotations

import time

__all__ = ["ago", "duration_text"]


def ago(ms: int | None, now_ms: int | None = None) -> str:
    """How long before (or after) now an epoch-milliseconds instant is: '3 min ago', 'in 5 s',
    'now'; '-' for none (0 or None: never)."""
    if not ms:
        return "-"
    now_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
    delta_s = (now_ms - ms) / 1000
    s = abs(delta_s)
    if s < 1:
        return "now"
    if s < 60:
        text = f"{s:.0f} s"
    elif s < 3600:
        text = f"{s / 60:.0f} min"
    elif s < 86400:
        text = f"{s / 3600:.1f} h"
    else:
        text = f"{s / 86400:.1f} days"
    return f"in {text}" if delta_s < 0 else f"{text} ago"


def duration_text(seconds: float) -> str:
    """``seconds`` as a person says it: "42 s", "4 min 12 s", "3 h 5 min"."""
    s = max(int(seconds), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60} min"
