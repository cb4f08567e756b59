"""Charts as inline SVG, drawn from the summary's small tables.

The report must open offline, from a file, years later: no script, no CDN, no font download.
SVG written here is plain markup the browser draws itself. Text carries its font size, so a
label's width can be worked out from its length (:func:`text_width`), which is how the time
axis picks labels that never overlap.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape
from typing import Final

__all__ = [
    "PALETTE",
    "TICK_FONT_PX",
    "bar_chart",
    "duration_text",
    "hbar_chart",
    "nice_step_ms",
    "text_width",
    "time_chart",
    "time_ticks",
]

PALETTE: Final = ("#2f6fdf", "#e07b22", "#2a9d5b", "#c0392b", "#8e44ad", "#16a085", "#7f8c8d")
_W: Final = 640
_H: Final = 240
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 56, 16, 16, 48
TICK_FONT_PX: Final = 10
# Width of a character, in font sizes: digits are the widest characters of the labels, and
# DejaVu Sans (the sans-serif font of many Linux desktops) draws them 0.636 em wide, wider
# than Arial or Helvetica (0.556 em): the estimate takes the wider.
_CHAR_EM: Final = 0.64
_LABEL_GAP_PX: Final = 8  # free space kept between two axis labels

_S, _MIN, _HOUR, _DAY = 1_000, 60_000, 3_600_000, 86_400_000
# Steps a reader counts in: clock-aligned (every multiple of a step up to a day divides the
# day), so buckets and ticks fall on round times.
NICE_STEPS_MS: Final = (
    *(n * _S for n in (1, 2, 5, 10, 15, 30)),
    *(n * _MIN for n in (1, 2, 5, 10, 15, 30)),
    *(n * _HOUR for n in (1, 2, 3, 6, 12)),
    *(n * _DAY for n in (1, 2, 7, 14, 30, 60, 91, 182, 365)),
)


def text_width(text: str, font_px: float = TICK_FONT_PX) -> float:
    """An upper estimate of ``text``'s drawn width, in pixels."""
    return len(text) * font_px * _CHAR_EM


def nice_step_ms(lo_ms: int, hi_ms: int, max_steps: int) -> int:
    """The smallest of :data:`NICE_STEPS_MS` (or a multiple of its last, a year) whose
    clock-aligned steps number at most ``max_steps`` from ``lo_ms`` to ``hi_ms``."""

    def fits(step: int) -> bool:
        return hi_ms // step - lo_ms // step + 1 <= max_steps

    step = next((step for step in NICE_STEPS_MS if fits(step)), NICE_STEPS_MS[-1])
    while not fits(step):
        step += NICE_STEPS_MS[-1]
    return step


def duration_text(ms: int) -> str:
    """``10 s``, ``5 min``, ``2 h``, ``7 d``: a step of :data:`NICE_STEPS_MS` in words."""
    for unit, name in ((_DAY, "d"), (_HOUR, "h"), (_MIN, "min"), (_S, "s")):
        if ms >= unit and ms % unit == 0:
            return f"{ms // unit} {name}"
    return f"{ms} ms"


def _time_format(step_ms: int, lo_ms: int, hi_ms: int) -> str:
    if step_ms >= _DAY:
        return "%Y-%m-%d"
    if lo_ms // _DAY != hi_ms // _DAY:  # more than one day shown: say which
        return "%m-%d %H:%M" if step_ms >= _MIN else "%m-%d %H:%M:%S"
    return "%H:%M" if step_ms >= _MIN else "%H:%M:%S"


def _utc(ms: int, fmt: str) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime(fmt)


def time_ticks(lo_ms: int, hi_ms: int, width_px: float) -> list[tuple[int, str]]:
    """Labelled ticks (UTC) for a time axis from ``lo_ms`` to ``hi_ms`` drawn ``width_px``
    wide: at every multiple of the smallest step whose labels, centred on their ticks, are
    at least a gap apart."""
    span = max(1, hi_ms - lo_ms)
    steps = [*NICE_STEPS_MS, nice_step_ms(lo_ms, hi_ms, 2)]
    for step in steps:
        fmt = _time_format(step, lo_ms, hi_ms)
        label_px = text_width(_utc(lo_ms, fmt)) + _LABEL_GAP_PX
        if width_px * step / span >= label_px or step == steps[-1]:
            first = -(-lo_ms // step) * step
            return [(t, _utc(t, fmt)) for t in range(first, hi_ms + 1, step)]
    raise AssertionError("unreachable: the last step is always taken")


@dataclass(frozen=True, slots=True)
class _Scale:
    """A y axis of four equal steps from zero: ``step`` is 1, 2, 2.5 or 5 times a power of
    ten, so every tick is a number a reader can say."""

    step: float
    decimals: int

    @property
    def top(self) -> float:
        return 4 * self.step

    @classmethod
    def reaching(cls, v: float, *, whole: bool) -> _Scale:
        """The smallest scale whose top is at least ``v``; ``whole``: counts, steps of 1 or
        more."""
        if v <= 0 or (whole and v <= 4):
            return cls(1.0, 0)
        power = math.floor(math.log10(v / 4))
        for mantissa in (1, 2, 2.5, 5, 10):
            step = mantissa * 10.0**power
            if whole and step != round(step):
                continue  # counts: whole ticks
            if 4 * step >= v * (1 - 1e-9):  # a rounding error never adds a step
                break
        decimals = max(0, -math.floor(math.log10(step) + 1e-9) + (mantissa == 2.5))
        return cls(step, decimals)


def _axes(scale: _Scale, label: str) -> list[str]:
    out = []
    for n in range(5):
        y = _PAD_T + (_H - _PAD_T - _PAD_B) * (1 - n / 4)
        value = scale.step * n
        out.append(
            f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#e4e7ec"/>'
            f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick ytick" '
            f'font-size="{TICK_FONT_PX}">{value:,.{scale.decimals}f}</text>'
        )
    out.append(
        f'<text x="12" y="{_PAD_T + 4}" class="axis" transform="rotate(-90 12 {_PAD_T + 4})" '
        f'text-anchor="end" font-size="{TICK_FONT_PX}">{escape(label)}</text>'
    )
    return out


def _legend(names: Sequence[str]) -> str:
    items = []
    x = float(_PAD_L)
    for n, name in enumerate(names):
        color = PALETTE[n % len(PALETTE)]
        items.append(
            f'<rect x="{x:.1f}" y="{_H - 14}" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14:.1f}" y="{_H - 5}" class="tick" font-size="{TICK_FONT_PX}">'
            f"{escape(name)}</text>"
        )
        x += 14 + text_width(name) + 2 * _LABEL_GAP_PX
    return "".join(items)


def bar_chart(
    categories: Sequence[str], series: Mapping[str, Sequence[float]], *, y_label: str, title: str
) -> str:
    """Grouped bars: one group per category, one bar per series."""
    scale = _Scale.reaching(
        max((v for vals in series.values() for v in vals), default=0), whole=True
    )
    plot_w = _W - _PAD_L - _PAD_R
    plot_h = _H - _PAD_T - _PAD_B
    group_w = plot_w / max(1, len(categories))
    bar_w = max(2.0, group_w * 0.8 / max(1, len(series)))
    parts = _axes(scale, y_label)
    for s, (name, values) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        for c, v in enumerate(values):
            h = plot_h * v / scale.top
            x = _PAD_L + group_w * c + group_w * 0.1 + bar_w * s
            y = _PAD_T + plot_h - h
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{bar_w:.1f}" height="{h:.1f}" '
                f'fill="{color}"><title>{escape(name)} {escape(categories[c])}: {v:,.0f}'
                "</title></rect>"
            )
    step = max(1, len(categories) // 12)
    for c, cat in enumerate(categories):
        if c % step == 0:
            x = _PAD_L + group_w * (c + 0.5)
            parts.append(
                f'<text x="{x:.1f}" y="{_H - _PAD_B + 14}" text-anchor="middle" '
                f'class="tick xtick" font-size="{TICK_FONT_PX}">{escape(cat)}</text>'
            )
    parts.append(_legend(list(series)))
    return _svg(title, parts)


def time_chart(
    start_ms: int,
    step_ms: int,
    series: Mapping[str, Sequence[float]],
    *,
    y_label: str,
    title: str,
    note: str = "",
) -> str:
    """One line per series over consecutive buckets of ``step_ms`` from ``start_ms``, each value
    drawn at its bucket's middle; the time axis in UTC, labelled by :func:`time_ticks`.
    ``note`` is written in the top right corner (what a bucket is)."""
    n = max((len(v) for v in series.values()), default=0)
    scale = _Scale.reaching(
        max((v for vals in series.values() for v in vals), default=0), whole=False
    )
    lo, hi = start_ms, start_ms + max(1, n) * step_ms
    plot_w = _W - _PAD_L - _PAD_R
    plot_h = _H - _PAD_T - _PAD_B

    def px(t: float) -> float:
        return _PAD_L + plot_w * (t - lo) / (hi - lo)

    def py(y: float) -> float:
        return _PAD_T + plot_h * (1 - y / scale.top)

    parts = _axes(scale, y_label)
    for s, (name, values) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        points = [(px(start_ms + (k + 0.5) * step_ms), py(v)) for k, v in enumerate(values)]
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
        parts.append(
            f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2">'
            f"<title>{escape(name)}</title></polyline>"
        )
        if len(points) <= 30:  # few buckets: mark each (one bucket alone is no line at all)
            parts.extend(
                f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="{color}"/>' for x, y in points
            )
    baseline = _H - _PAD_B
    for t, label in time_ticks(lo, hi, plot_w):
        x = px(t)
        half = text_width(label) / 2
        if x - half < 0 or x + half > _W:
            continue  # would stick out of the picture
        parts.append(
            f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{baseline}" y2="{baseline + 4}" '
            'stroke="#9aa3b2"/>'
            f'<text x="{x:.1f}" y="{baseline + 14}" text-anchor="middle" class="tick xtick" '
            f'font-size="{TICK_FONT_PX}">{escape(label)}</text>'
        )
    if note:
        parts.append(
            f'<text x="{_W - _PAD_R}" y="{_PAD_T - 4}" text-anchor="end" class="axis" '
            f'font-size="{TICK_FONT_PX}">{escape(note)}</text>'
        )
    parts.append(_legend(list(series)))
    return _svg(title, parts)


def hbar_chart(rows: Sequence[tuple[str, float]], *, title: str) -> str:
    """Horizontal bars, one per labelled row: for long labels (anomaly reasons)."""
    label_w, bar_w, row_h = 250, _W - 250 - 70, 22
    height = row_h * len(rows) + 8
    vmax = max((v for _, v in rows), default=0) or 1
    parts = []
    for n, (label, value) in enumerate(rows):
        y = 4 + n * row_h
        w = max(1.0, bar_w * value / vmax)
        parts.append(
            f'<text x="{label_w - 8}" y="{y + 15}" text-anchor="end" class="label">'
            f"{escape(label)}</text>"
            f'<rect x="{label_w}" y="{y + 3}" width="{w:.1f}" height="{row_h - 6}" '
            f'fill="{PALETTE[3]}"><title>{escape(label)}: {value:,.0f}</title></rect>'
            f'<text x="{label_w + w + 6:.1f}" y="{y + 15}" class="label">{value:,.0f}</text>'
        )
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {height}" role="img" '
        f'class="chart" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        + "".join(parts)
        + "</svg>"
    )


def _svg(title: str, parts: list[str]) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {_W} {_H}" role="img" '
        f'class="chart" aria-label="{escape(title)}"><title>{escape(title)}</title>'
        + "".join(parts)
        + "</svg>"
    )
