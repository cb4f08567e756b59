"""Charts as inline SVG, drawn from the summary's small tables.

The report must open offline, from a file, years later: no script, no CDN, no font download.
SVG written here is plain markup the browser draws itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Final

__all__ = ["PALETTE", "bar_chart", "hbar_chart", "line_chart"]

PALETTE: Final = ("#2f6fdf", "#e07b22", "#2a9d5b", "#c0392b", "#8e44ad", "#16a085", "#7f8c8d")
_W: Final = 640
_H: Final = 240
_PAD_L, _PAD_R, _PAD_T, _PAD_B = 56, 16, 16, 48


def _nice_max(v: float) -> float:
    if v <= 4:
        return 4.0  # small counts: ticks at whole numbers
    step = 10 ** (len(str(int(v))) - 1)
    return float(-(-v // step) * step) if v >= 1 else 1.0


def _axes(ymax: float, label: str) -> list[str]:
    out = []
    for n in range(5):
        y = _PAD_T + (_H - _PAD_T - _PAD_B) * (1 - n / 4)
        value = ymax * n / 4
        out.append(
            f'<line x1="{_PAD_L}" x2="{_W - _PAD_R}" y1="{y:.1f}" y2="{y:.1f}" '
            'stroke="#e4e7ec"/>'
            f'<text x="{_PAD_L - 6}" y="{y + 4:.1f}" text-anchor="end" class="tick">'
            f"{value:,.0f}</text>"
        )
    out.append(
        f'<text x="12" y="{_PAD_T + 4}" class="axis" transform="rotate(-90 12 {_PAD_T + 4})" '
        f'text-anchor="end">{escape(label)}</text>'
    )
    return out


def _legend(names: Sequence[str]) -> str:
    items = []
    x = _PAD_L
    for n, name in enumerate(names):
        color = PALETTE[n % len(PALETTE)]
        items.append(
            f'<rect x="{x}" y="{_H - 14}" width="10" height="10" fill="{color}"/>'
            f'<text x="{x + 14}" y="{_H - 5}" class="tick">{escape(name)}</text>'
        )
        x += 24 + 7 * len(name)
    return "".join(items)


def bar_chart(
    categories: Sequence[str], series: Mapping[str, Sequence[float]], *, y_label: str, title: str
) -> str:
    """Grouped bars: one group per category, one bar per series."""
    ymax = _nice_max(max((v for vals in series.values() for v in vals), default=0))
    plot_w = _W - _PAD_L - _PAD_R
    plot_h = _H - _PAD_T - _PAD_B
    group_w = plot_w / max(1, len(categories))
    bar_w = max(2.0, group_w * 0.8 / max(1, len(series)))
    parts = _axes(ymax, y_label)
    for s, (name, values) in enumerate(series.items()):
        color = PALETTE[s % len(PALETTE)]
        for c, v in enumerate(values):
            h = plot_h * v / ymax
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
                f'<text x="{x:.1f}" y="{_H - _PAD_B + 14}" text-anchor="middle" class="tick">'
                f"{escape(cat)}</text>"
            )
    parts.append(_legend(list(series)))
    return _svg(title, parts)


def line_chart(
    xs: Sequence[float],
    series: Mapping[str, Sequence[float]],
    *,
    x_labels: Sequence[str],
    y_label: str,
    title: str,
) -> str:
    """One line per series over shared x positions; ``x_labels`` are shown at a few ticks."""
    ymax = _nice_max(max((v for vals in series.values() for v in vals), default=0))
    lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
    span = (hi - lo) or 1.0
    plot_w = _W - _PAD_L - _PAD_R
    plot_h = _H - _PAD_T - _PAD_B

    def px(x: float) -> float:
        return _PAD_L + plot_w * (x - lo) / span

    def py(y: float) -> float:
        return _PAD_T + plot_h * (1 - y / ymax)

    parts = _axes(ymax, y_label)
    for s, (name, values) in enumerate(series.items()):
        pts = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in zip(xs, values, strict=True))
        color = PALETTE[s % len(PALETTE)]
        parts.append(
            f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="2">'
            f"<title>{escape(name)}</title></polyline>"
        )
    ticks = min(6, len(xs))
    for n in range(ticks):
        idx = round(n * (len(xs) - 1) / max(1, ticks - 1))
        anchor = "start" if n == 0 else "end" if n == ticks - 1 else "middle"
        parts.append(
            f'<text x="{px(xs[idx]):.1f}" y="{_H - _PAD_B + 14}" text-anchor="{anchor}" '
            f'class="tick">{escape(x_labels[idx])}</text>'
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
