"""The report's figures a reader can trust: the rate chart's time axis labels never overlap
(worked out from the SVG, and measured in Chromium), an idle stretch is drawn as no traffic
rather than bridged, the chart says what a bucket is, and a percentile with too few samples is
"—" beside its sample count, in the page and on the terminal."""

from __future__ import annotations

import datetime as dt
import io
import itertools
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from txbroker_reconcile.charts import text_width
from txbroker_reconcile.latency import MIN_SAMPLES, RATE_BUCKETS_MAX
from txbroker_reconcile.report import render
from txbroker_reconcile.summary import print_summary

SVG = "{http://www.w3.org/2000/svg}"
T0 = int(dt.datetime(2026, 11, 27, 23, 17, 41, 250_000, tzinfo=dt.UTC).timestamp() * 1000)
S, MIN, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000
# A conservative width of a digit at a font size: DejaVu Sans draws digits 0.636 em wide.
DIGIT_EM = 0.64


def _buckets(store_ms: list[int]) -> tuple[list[dict[str, Any]], int]:
    """The throughput rows the job writes for messages stored at ``store_ms`` (as its Spark
    code buckets them, here in Python): (topic, t_ms, count) and the width."""
    from txbroker_reconcile.charts import nice_step_ms

    width = nice_step_ms(min(store_ms), max(store_ms), RATE_BUCKETS_MAX)
    counts: dict[int, int] = {}
    for t in store_ms:
        counts[t // width * width] = counts.get(t // width * width, 0) + 1
    return [{"topic": "orders", "t_ms": t, "count": n} for t, n in sorted(counts.items())], width


def summary(
    store_ms: list[int], latency: list[dict[str, Any]] | None = None, **inputs: Any
) -> dict[str, Any]:
    """A summary document as the job writes it, clean, with messages stored at ``store_ms``."""
    rows, width = _buckets(store_ms)
    latency = latency or []
    topic_latency = {r["leg"]: r for r in latency if r["topic"] == "orders"}
    return {
        "version": 1,
        "as_of_ms": T0,
        "grace_s": 60.0,
        "clean": True,
        "anomalies": {"lost": 0, "phantom": 0, "duplicate": 0, "stuck": 0},
        "by_reason": [],
        "examples": [],
        "corrupt": [],
        "histograms": [],
        "latency": latency,
        "throughput": {"slot_ms": width, "rows": rows},
        "topics": [
            {
                "topic": "orders",
                "messages": len(store_ms),
                "transactional": len(store_ms),
                "outbox": 0,
                "lost": 0,
                "phantom": 0,
                "duplicate": 0,
                "stuck": 0,
                "latency": topic_latency,
            }
        ],
        "inputs": {
            "log": {"path": "/x", "segments": 1, "records": len(store_ms), "corrupt": 0},
            "services": {"orders": {"local_tx": len(store_ms)}},
            "dialects": {"orders": "sqlite"},
            "run": 1,
            **inputs,
        },
    }


def _rate_chart(html: str) -> ET.Element:
    svg = re.search(r'<svg[^>]*aria-label="throughput".*?</svg>', html, re.S)
    assert svg, "no throughput chart"
    return ET.fromstring(svg.group(0))


def _label_boxes(svg: ET.Element) -> list[tuple[float, float, str]]:
    """(left, right, text) of each time-axis label, from its position, anchor, font size and
    characters."""
    boxes = []
    for t in svg.iter(f"{SVG}text"):
        if "xtick" not in t.get("class", "").split():
            continue
        text = t.text or ""
        w = len(text) * float(t.get("font-size", "16")) * DIGIT_EM
        x = float(t.get("x", "0"))
        anchor = t.get("text-anchor", "start")
        left = x - w / 2 if anchor == "middle" else x - w if anchor == "end" else x
        boxes.append((left, left + w, text))
    return sorted(boxes)


def _bursts(*spans: tuple[int, int, int]) -> list[int]:
    """Store times: for each (start offset, length, messages), messages spread over it."""
    return [
        T0 + start + k * length // max(1, n - 1) for start, length, n in spans for k in range(n)
    ]


SPANS = {
    "one second": _bursts((0, 900, 30)),
    "seven seconds": _bursts((0, 7 * S, 40)),
    "a minute and a bit": _bursts((0, 61 * S, 100)),
    "ten minutes": _bursts((0, 10 * MIN, 300)),
    "an idle hour between two bursts": _bursts((0, 40 * S, 200), (63 * MIN, 30 * S, 100)),
    "idle for five hours, across midnight": _bursts((0, 2 * MIN, 50), (5 * HOUR, MIN, 50)),
    "three days": _bursts((0, 3 * DAY, 500)),
    "forty days": _bursts((0, 40 * DAY, 500)),
}


@pytest.mark.parametrize("name", list(SPANS))
def test_time_axis_labels_never_overlap_and_stay_in_the_picture(name: str) -> None:
    svg = _rate_chart(render(summary(SPANS[name])))
    width = float(svg.get("viewBox", "").split()[2])
    boxes = _label_boxes(svg)
    assert len(boxes) >= 2, boxes  # the axis is labelled, not left bare
    for (_l1, r1, t1), (l2, _r2, t2) in itertools.pairwise(boxes):
        assert r1 <= l2, f"{t1!r} overlaps {t2!r}"
    assert boxes[0][0] >= 0 and boxes[-1][1] <= width
    assert len({t for _l, _r, t in boxes}) == len(boxes)  # no label said twice


def _line_ys(svg: ET.Element) -> list[float]:
    (line,) = list(svg.iter(f"{SVG}polyline"))
    return [float(p.split(",")[1]) for p in (line.get("points") or "").split()]


def test_an_idle_stretch_is_drawn_as_no_traffic_not_bridged() -> None:
    doc = summary(SPANS["an idle hour between two bursts"])
    svg = _rate_chart(render(doc))
    ys = _line_ys(svg)
    width = doc["throughput"]["slot_ms"]
    assert width == 2 * MIN and len(ys) <= RATE_BUCKETS_MAX
    zero = max(ys)  # the baseline: the lowest point drawn
    busy = {
        (r["t_ms"] - doc["throughput"]["rows"][0]["t_ms"]) // width
        for r in doc["throughput"]["rows"]
    }
    # One point per bucket from the first to the last; every bucket between the bursts is at
    # zero (a straight line from one burst to the other would put them above it).
    assert len(ys) == max(busy) + 1
    idle = [k for k in range(len(ys)) if k not in busy]
    assert len(idle) > 25 and all(ys[k] == zero for k in idle)
    assert all(ys[k] < zero for k in busy)


def test_the_rate_chart_states_its_bucket() -> None:
    html = render(summary(SPANS["ten minutes"]))
    svg = _rate_chart(html)
    notes = [t.text for t in svg.iter(f"{SVG}text") if t.text and "bucket" in t.text]
    assert notes == ["15 s buckets, UTC"]  # 10 s would need 61 buckets
    assert "Messages stored per minute, by topic (15 s buckets)" in html  # 0.5 a second
    assert "an empty bucket is time without traffic, not missing data" in html


def _y_ticks(svg: ET.Element) -> list[float]:
    return [
        float((t.text or "").replace(",", ""))
        for t in svg.iter(f"{SVG}text")
        if "ytick" in t.get("class", "").split()
    ]


def test_rates_are_messages_per_unit_of_time_over_the_bucket() -> None:
    # 40 messages in 7 s, in 1 s buckets: about 5.7 a second, so the axis tops at 8 msg/s.
    html = render(summary(SPANS["seven seconds"]))
    assert _y_ticks(_rate_chart(html)) == [0, 2, 4, 6, 8] and "msg/s" in html
    # 500 over forty days, in day buckets: 12.5 a day is about 0.5 an hour.
    html = render(summary(SPANS["forty days"]))
    assert _y_ticks(_rate_chart(html)) == [0, 0.2, 0.4, 0.6, 0.8]
    assert "Messages stored per hour, by topic (1 d buckets)" in html


def _lat(leg: str, count: int, p50: int, p95: int | None, p99: int | None) -> dict[str, Any]:
    return {
        "topic": "orders",
        "leg": leg,
        "group": "billing",
        "count": count,
        "p50": p50,
        "p95": p95,
        "p99": p99,
        "max": 4_321,
    }


def test_percentiles_with_too_few_samples_are_a_dash_beside_the_count() -> None:
    few = _lat("commit → processed", 3, 41, None, None)
    enough = _lat("commit → store", 150, 7, 19, 23)
    some = _lat("store → processed", 60, 30, 55, None)
    html = render(summary(SPANS["ten minutes"], [few, enough, some]))
    rows = re.findall(r"<tr>(.*?)</tr>", html, re.S)

    def cells(leg: str) -> list[str]:
        row = next(r for r in rows if f">{leg}<" in r)
        return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]

    assert cells("commit → processed")[3:] == ["3", "41", "—", "—", "4,321"]
    assert cells("store → processed")[3:] == ["60", "30", "55", "—", "4,321"]
    assert cells("commit → store")[3:] == ["150", "7", "19", "23", "4,321"]
    assert 'title="3 samples: p99 is given from 100"' in html
    assert f"p95 is given from {MIN_SAMPLES['p95']} samples, p99 from {MIN_SAMPLES['p99']}" in html
    # The terminal says the same: the count, and a dash for the missing p99.
    out = io.StringIO()
    print_summary(
        summary(SPANS["ten minutes"], [few]), Path("r.html"), Console(file=out, width=200)
    )
    assert re.search(r"3: 41 / —", out.getvalue()), out.getvalue()
    assert "too few samples" in out.getvalue()
    # Nothing hidden, nothing to explain.
    assert "too few samples" not in render(summary(SPANS["ten minutes"], [enough]))
    out = io.StringIO()
    print_summary(
        summary(SPANS["ten minutes"], [{**enough, "leg": "commit → processed"}]),
        Path("r.html"),
        Console(file=out, width=200),
    )
    assert "150: 7 / 23" in out.getvalue() and "too few" not in out.getvalue()


def test_whole_second_rows_are_named_in_the_report() -> None:
    html = render(summary(SPANS["ten minutes"], whole_second_rows={"orders": 1_234, "b": 0}))
    assert "Rows with times in whole seconds (orders 1,234" in html
    assert "Rows with times in whole seconds" not in render(
        summary(SPANS["ten minutes"], whole_second_rows={"orders": 0})
    )


def test_the_rate_chart_in_chromium_has_no_overlapping_labels(browser: Any, tmp_path: Path) -> None:
    """The same charts drawn by the browser with its own fonts: the labels' measured boxes."""
    for name in (
        "an idle hour between two bursts",
        "idle for five hours, across midnight",
        "three days",
    ):
        page = tmp_path / f"{name.replace(' ', '-').replace(',', '')}.html"
        page.write_text(
            render(summary(SPANS[name], [_lat("commit → processed", 3, 41, None, None)]))
        )
        browser.get(page.as_uri())
        boxes = browser.execute_script(
            "const svg = document.querySelector('svg[aria-label=throughput]');"
            "return [...svg.querySelectorAll('text.xtick')].map(t => {"
            "  const b = t.getBBox(); return [b.x, b.x + b.width, t.textContent]; });"
        )
        boxes.sort()
        assert len(boxes) >= 2
        for (_l1, r1, t1), (l2, _r2, t2) in itertools.pairwise(boxes):
            assert r1 <= l2, f"{name}: {t1!r} overlaps {t2!r}"
        # Each label's estimate is not narrower than what the browser drew.
        for left, right, text in boxes:
            assert right - left <= text_width(text), (text, right - left)
        browser.find_element("css selector", "svg[aria-label=throughput]").screenshot(
            str(tmp_path / f"{page.stem}.png")
        )
