"""The summary document (``summary.json``) and its rendering on a terminal.

The document is the job's stable interface: the broker's metrics and console read it, so its
top-level keys change only with ``version``. It is written to a temporary name and renamed, so
a reader (``--every`` rewrites it) never sees half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Final

from rich.console import Console
from rich.table import Table

from txbroker_reconcile.latency import MIN_SAMPLES

__all__ = ["SUMMARY_FILE", "SUMMARY_VERSION", "print_summary", "write_summary"]

SUMMARY_VERSION: Final = 1
SUMMARY_FILE: Final = "summary.json"


def write_summary(summary: dict[str, Any], out: Path) -> Path:
    path = out / SUMMARY_FILE
    tmp = out / (SUMMARY_FILE + ".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True, default=str))
    os.replace(tmp, path)
    return path


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}"  # null: too few samples, or none


def print_summary(summary: dict[str, Any], report: Path, console: Console) -> None:
    table = Table(title="Reconciliation per topic", title_justify="left")
    for col in ("topic", "messages", "lost", "phantom", "duplicate", "stuck"):
        table.add_column(col, justify="left" if col == "topic" else "right")
    table.add_column("commit→processed samples: p50 / p99 ms", justify="right")
    dashes = False
    for t in summary["topics"]:
        e2e = t["latency"].get("commit → processed") or {}
        dashes |= e2e.get("p50") is None or e2e.get("p99") is None
        table.add_row(
            t["topic"],
            f"{t['messages']:,}",
            *(f"{t[k]:,}" for k in ("lost", "phantom", "duplicate", "stuck")),
            f"{e2e.get('count', 0):,}: {_ms(e2e.get('p50'))} / {_ms(e2e.get('p99'))}",
        )
    console.print(table)
    if dashes:
        console.print(
            f"— : too few samples (p99 is given from {MIN_SAMPLES['p99']}), or none",
            style="dim",
        )
    if summary["by_reason"]:
        reasons = Table(title="Anomalies", title_justify="left")
        for col in ("kind", "reason", "topic", "count", "examples"):
            reasons.add_column(col, justify="right" if col == "count" else "left")
        for r in summary["by_reason"]:
            ids = [
                e["id"]
                for e in summary["examples"]
                if (e["kind"], e["reason"], e["topic"]) == (r["kind"], r["reason"], r["topic"])
            ][:3]
            reasons.add_row(
                r["kind"], r["reason"], r["topic"] or "-", f"{r['count']:,}", " ".join(ids)
            )
        console.print(reasons)
    log = summary["inputs"]["log"]
    for group, g in log.get("groups", {}).items():
        if group:  # several broker groups' logs: what each held
            console.print(
                f"broker group {group}: {g['records']:,} records, {g['messages']:,} messages, "
                f"{g['corrupt']:,} corrupt ({g['path'] or 'kept from earlier runs'})"
            )
    if log["corrupt"]:
        console.print(
            f"[yellow]{log['corrupt']:,} corrupt record(s) in the log[/] (see the report)"
        )
    totals = summary["anomalies"]
    verdict = (
        "[green]clean: every committed transaction has exactly one message, none is a "
        "phantom, every group processed what it should[/]"
        if summary["clean"]
        else "[red]anomalies: " + ", ".join(f"{n:,} {k}" for k, n in totals.items() if n) + "[/]"
    )
    console.print(verdict)
    console.print(f"report: {report}")
