"""The self-contained HTML report: one file, inline CSS and SVG, readable offline.

Everything on the page comes from the summary document, so the page, ``summary.json`` and the
terminal table cannot disagree.
"""

from __future__ import annotations

import datetime as dt
from html import escape
from pathlib import Path
from typing import Any, Final

from txbroker_reconcile.charts import bar_chart, duration_text, hbar_chart, time_chart
from txbroker_reconcile.checks import KINDS, REASONS
from txbroker_reconcile.latency import HISTOGRAM_EDGES_MS, LEGS, MIN_SAMPLES

__all__ = ["REPORT_FILE", "render", "write_report"]

REPORT_FILE: Final = "report.html"

_CSS: Final = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2433;
background:#f6f7f9}
header{background:#1d2433;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:20px}
header p{margin:4px 0 0;color:#c5cad3}
main{padding:16px 32px 48px;max-width:1200px}
section{background:#fff;border:1px solid #e4e7ec;border-radius:8px;padding:16px 20px;
margin:16px 0}
h2{font-size:16px;margin:0 0 12px}
h3{font-size:13px;margin:4px 0 6px;color:#3a4458;font-weight:600}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:6px 10px;border-bottom:1px solid #eef0f3;
font-variant-numeric:tabular-nums}
th{font-weight:600;color:#566074;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
td.n,th.n{text-align:right}
.verdict{font-size:18px;font-weight:600;padding:14px 20px;border-radius:8px;margin:16px 0}
.clean{background:#e3f4ea;color:#17663a;border:1px solid #b9e2c8}
.dirty{background:#fbe7e6;color:#8f1d14;border:1px solid #f2bdb8}
.cards{display:flex;gap:12px;flex-wrap:wrap}
.card{flex:1;min-width:140px;background:#fff;border:1px solid #e4e7ec;border-radius:8px;
padding:12px 16px}
.card b{display:block;font-size:24px}
.card.bad b{color:#c0392b}
.charts{display:grid;grid-template-columns:repeat(auto-fit,minmax(420px,1fr));gap:16px}
svg.chart{width:100%;height:auto;background:#fff}
svg .tick,svg .axis{fill:#566074}
svg .label{font-size:12px;fill:#1d2433}
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace;background:#f1f3f6;padding:1px 4px;
border-radius:3px}
.muted{color:#7a8496}
"""


_P: Final = ["samples", "p50 ms", "p95 ms", "p99 ms", "max ms"]
_TOPIC_HEADERS: Final = ["topic", "messages", "transactional", "outbox", *KINDS, *_P]
_LATENCY_HEADERS: Final = ["topic", "leg", "group", *_P]
_TOO_FEW: Final = (
    "— : too few samples for that percentile: p95 is given from "
    f"{MIN_SAMPLES['p95']} samples, p99 from {MIN_SAMPLES['p99']} (with fewer it is the "
    "largest sample, the max column under another name)."
)
_EXAMPLE_HEADERS: Final = ["kind", "reason", "topic", "service", "group", "id", "at", "copies"]
_INPUT_HEADERS: Final = ["service", "txb_local_tx rows", "txb_outbox rows", "txb_inbox rows"]
_GROUP_HEADERS: Final = ["broker group", "log", "segment files", "records", "messages", "corrupt"]


def _time(ms: int | None) -> str:
    if ms is None:
        return "-"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:,.0f}" if isinstance(v, int | float) else escape(str(v))


def _cell(c: Any, numeric: bool) -> str:
    if isinstance(c, str) and c.startswith("<"):
        return c  # markup made here
    return _num(c) if numeric else escape(str(c))


def _table(headers: list[str], rows: list[list[Any]], numeric: set[int] | None = None) -> str:
    numeric = numeric or set()
    head = "".join(
        f'<th class="{"n" if i in numeric else ""}">{escape(h)}</th>' for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"n" if i in numeric else ""}">{_cell(c, i in numeric)}</td>'
            for i, c in enumerate(r)
        )
        + "</tr>"
        for r in rows
    )
    if not rows:
        body = f'<tr><td colspan="{len(headers)}" class="muted">none</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _percentiles(lat: dict[str, Any]) -> list[Any]:
    """A latency row's sample count, p50, p95, p99 and max; a percentile with too few samples
    (null in the summary) as "—", saying why on hover."""
    n = lat.get("count")
    cells: list[Any] = [n]
    for p in ("p50", "p95", "p99"):
        v = lat.get(p)
        if v is None and n:
            why = f"{n:,} samples: {p} is given from {MIN_SAMPLES[p]:,}"
            v = f'<span class="muted" title="{escape(why)}">—</span>'
        cells.append(v)
    return [*cells, lat.get("max")]


def _clock_note(summary: dict[str, Any]) -> str:
    coarse = {n: c for n, c in summary["inputs"].get("whole_second_rows", {}).items() if c}
    if not coarse:
        return ""
    which = ", ".join(f"{escape(n)} {c:,}" for n, c in sorted(coarse.items()))
    return (
        f" Rows with times in whole seconds ({which}: SQLite rows written before "
        "<code>txbroker db upgrade</code> gave the tables milliseconds): legs that start or end "
        "there are good to about a second, and can read below zero."
    )


def _short(ms: int) -> str:
    return f"{ms / 1000:g}k" if ms >= 1000 else str(ms)


def _latency_charts(summary: dict[str, Any]) -> str:
    labels = [_short(e) for e in HISTOGRAM_EDGES_MS] + ["more"]
    charts = []
    for topic in sorted({h["topic"] for h in summary["histograms"]}):
        series = {}
        for leg in LEGS:
            counts = [0.0] * len(labels)
            for h in summary["histograms"]:
                if h["topic"] == topic and h["leg"] == leg:
                    counts[h["bucket"]] += h["count"]
            if any(counts):
                series[leg] = counts
        chart = bar_chart(labels, series, y_label="messages", title=f"latency · {topic}")
        charts.append(f"<h3>Latency, {escape(topic)} (messages below each bound, ms)</h3>{chart}")
    return "".join(f"<div>{c}</div>" for c in charts) or '<p class="muted">no latency measured</p>'


# Rate units, finest first: a chart reads in the first in which its busiest bucket is one or more.
_RATE_UNITS: Final = (("second", "s", 1_000), ("minute", "min", 60_000), ("hour", "h", 3_600_000))


def _throughput_chart(summary: dict[str, Any]) -> str:
    tp = summary["throughput"]
    rows = tp["rows"]
    if not rows:
        return '<p class="muted">no messages</p>'
    width = tp["slot_ms"]
    first = min(r["t_ms"] for r in rows)
    buckets = (max(r["t_ms"] for r in rows) - first) // width + 1
    busiest = max(r["count"] for r in rows) / width  # messages per ms
    unit, short, unit_ms = next((u for u in _RATE_UNITS if busiest * u[2] >= 1), _RATE_UNITS[-1])
    series = {}
    for topic in sorted({r["topic"] for r in rows}):
        rate = [0.0] * buckets
        for r in rows:
            if r["topic"] == topic:
                rate[(r["t_ms"] - first) // width] = r["count"] * unit_ms / width
        series[topic] = rate
    bucket = duration_text(width)
    chart = time_chart(
        first,
        width,
        series,
        y_label=f"msg/{short}",
        title="throughput",
        note=f"{bucket} buckets, UTC",
    )
    return (
        f"<h3>Messages stored per {unit}, by topic ({bucket} buckets)</h3>{chart}"
        f'<p class="muted">Each point is the average over one {bucket} bucket. A bucket in '
        "which a topic stored no message is drawn at zero: the log holds every record of the "
        "span it covers, so an empty bucket is time without traffic, not missing data.</p>"
    )


def render(summary: dict[str, Any]) -> str:
    totals = summary["anomalies"]
    clean = summary["clean"]
    log = summary["inputs"]["log"]
    verdict = (
        '<div class="verdict clean">Clean: every committed local transaction has exactly one '
        "visible message, none is a phantom, and every consumer group processed each message "
        "once.</div>"
        if clean
        else '<div class="verdict dirty">Anomalies found: '
        + ", ".join(f"{n:,} {k}" for k, n in totals.items() if n)
        + "</div>"
    )
    cards = "".join(
        f'<div class="card{" bad" if totals[k] else ""}"><span>{k}</span><b>{totals[k]:,}</b></div>'
        for k in KINDS
    )
    messages = sum(t["messages"] for t in summary["topics"])
    bad_log = " bad" if log["corrupt"] else ""
    cards += (
        f'<div class="card"><span>messages</span><b>{messages:,}</b></div>'
        f'<div class="card{bad_log}"><span>corrupt records</span><b>{log["corrupt"]:,}</b></div>'
    )
    topic_rows = []
    for t in summary["topics"]:
        lat = t["latency"].get("commit → processed") or t["latency"].get("commit → store") or {}
        topic_rows.append(
            [t["topic"], t["messages"], t["transactional"], t["outbox"]]
            + [t[k] for k in KINDS]
            + _percentiles(lat)
        )
    lat_rows = [
        [r["topic"], r["leg"], r["group"] or "-", *_percentiles(r)]
        for r in sorted(
            summary["latency"], key=lambda r: (r["topic"], LEGS.index(r["leg"]), r["group"] or "")
        )
    ]
    hidden = any(r[p] is None for r in summary["latency"] for p in MIN_SAMPLES)
    too_few = _TOO_FEW if hidden else ""
    counts = {r: sum(x["count"] for x in summary["by_reason"] if x["reason"] == r) for r in REASONS}
    found = [r for r in REASONS if counts[r]]
    anomaly_chart = ""
    if found:
        chart = hbar_chart([(f"{REASONS[r]}: {r}", counts[r]) for r in found], title="anomalies")
        anomaly_chart = f"<h3>Anomalies by reason</h3>{chart}"
    examples = [
        [
            e["kind"],
            e["reason"],
            e["topic"] or "-",
            e["service"] or "-",
            e["group"] or "-",
            f"<code>{escape(str(e['id']))}</code>",
            _time(e["at_ms"]),
            e["copies"] or "",
        ]
        for e in summary["examples"]
    ]
    corrupt = [
        [c.get("broker_group") or "-", c["segment"], c["position"], c["reason"]]
        for c in summary["corrupt"]
    ]
    # Several broker groups' logs read as one: what each contributed. One broker's log (group
    # "") is the header's line alone.
    groups = {g: v for g, v in log.get("groups", {}).items() if g}
    group_rows = [
        [g, v["path"] or "-", v["segments"], v["records"], v["messages"], v["corrupt"]]
        for g, v in groups.items()
    ]
    group_table = (
        '<h2 style="margin-top:16px">Broker groups</h2>'
        + _table(_GROUP_HEADERS, group_rows, {2, 3, 4, 5})
        if groups
        else ""
    )
    services = [
        [name, rows.get("local_tx", 0), rows.get("outbox", 0), rows.get("inbox", 0)]
        for name, rows in summary["inputs"]["services"].items()
    ]
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width,initial-scale=1">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; img-src data:">
<title>txbroker reconciliation · {escape(_time(summary["as_of_ms"]))}</title>
<style>{_CSS}</style></head>
<body>
<header><h1>txbroker reconciliation</h1>
<p>as of {escape(_time(summary["as_of_ms"]))} · grace {summary["grace_s"]:g}s ·
log {escape(str(log["path"]))} ({log["records"]:,} records, {log["segments"]} segment files) ·
run {summary["inputs"]["run"]}</p></header>
<main>
{verdict}
<div class="cards">{cards}</div>
<section><h2>Per topic</h2>
{_table(_TOPIC_HEADERS, topic_rows, set(range(1, 13)))}
<p class="muted">latency columns: local commit → consumer processed where a consumer's inbox
was read, else local commit → broker store; samples: the messages measured.
{too_few}{_clock_note(summary)}</p></section>
<section><h2>Charts</h2><div class="charts">
{_latency_charts(summary)}
<div>{_throughput_chart(summary)}</div>
{f"<div>{anomaly_chart}</div>" if anomaly_chart else ""}
</div></section>
<section><h2>Latency</h2>
{_table(_LATENCY_HEADERS, lat_rows, {3, 4, 5, 6, 7})}
<p class="muted">{too_few}</p>
</section>
<section><h2>Anomaly examples (the oldest {escape(str(len(examples)))} shown)</h2>
{_table(_EXAMPLE_HEADERS, examples)}
</section>
<section><h2>Inputs</h2>
{_table(_INPUT_HEADERS, services, {1, 2, 3})}
{group_table}
<h2 style="margin-top:16px">Corrupt records</h2>
{_table(["broker group", "segment", "position", "reason"], corrupt, {2})}
</section>
</main></body></html>
"""


def write_report(summary: dict[str, Any], out: Path) -> Path:
    path = out / REPORT_FILE
    tmp = out / (REPORT_FILE + ".tmp")
    tmp.write_text(render(summary))
    tmp.replace(path)
    return path
