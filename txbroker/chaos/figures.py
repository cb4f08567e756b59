"""What one scenario of the campaign found, and the table of all of them.

A scenario is **clean** when it lost no acknowledged message, applied no effect twice and found
no anomaly; the campaign exits 0 only when every scenario it ran is clean.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

__all__ = ["Figures", "print_table", "table"]


@dataclass
class Figures:
    """One scenario's row. ``acknowledged``: plain sends the broker acknowledged, transactions
    the orders service committed and outbox rows it committed with them (each one must be
    applied once by the billing service). ``lost``: of those, never applied. ``duplicated``:
    effects applied more than once (extra rows in ``chaos_effects``). ``anomalies``: the
    campaign's own checks (a transaction applied against its local decision, a returned order
    not committed, a transaction or outbox row never settled) plus, when Spark ran, the
    reconciliation's anomaly count. ``reconciled``: "clean", "N anomalies", or why not run."""

    scenario: str
    rounds: int = 0
    faults: int = 0
    acknowledged: int = 0
    lost: int = 0
    duplicated: int = 0
    anomalies: int = 0
    seconds: float = 0.0
    reconciled: str = "not run"
    notes: list[str] = field(default_factory=list)
    # The failover scenarios: seconds from each kill -9 of a master until a new one served.
    failover_s: list[float] = field(default_factory=list)
    # Async replication: acknowledged writes lost with a killed master are the loss window
    # the scenario measures, not a failure.
    loss_allowed: bool = False
    # A cluster's scenario: each group's commit log as settled (its master's data directory).
    logs: dict[str, str] = field(default_factory=dict)
    # When each fault struck (wall clock, ms): a message's store time tells its round.
    fault_ms: list[int] = field(default_factory=list)
    # A line per lost or twice-applied effect: where its message is and where its consumer
    # group's offsets stand (txbroker/chaos/diagnosis.py).
    findings: list[str] = field(default_factory=list)

    def struck(self, n: int = 1) -> None:
        """``n`` faults struck now."""
        self.faults += n
        if n:
            self.fault_ms.append(int(time.time() * 1000))

    @property
    def clean(self) -> bool:
        lost_ok = self.lost == 0 or self.loss_allowed
        return lost_ok and self.duplicated == 0 and self.anomalies == 0

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "clean": self.clean}

    def explain(self) -> str:
        """The row, its notes and findings, a line each (what a failed test prints)."""
        head = (
            f"{self.scenario}: {self.rounds} rounds, {self.faults} faults, {self.acknowledged} "
            f"acknowledged, {self.lost} lost, {self.duplicated} duplicated, {self.anomalies} "
            f"anomalies, Spark {self.reconciled}"
        )
        return "\n".join([head, *self.notes, *self.findings])


def table(rows: list[Figures], title: str = "fault campaign") -> Table:
    t = Table(title=title)
    for name in ("scenario", "rounds", "faults", "acknowledged", "lost", "duplicated"):
        t.add_column(name, justify="left" if name == "scenario" else "right")
    t.add_column("anomalies", justify="right")
    t.add_column("Spark", justify="left")
    t.add_column("s", justify="right")
    for r in rows:
        style = None if r.clean else "red"
        t.add_row(
            r.scenario,
            str(r.rounds),
            str(r.faults),
            f"{r.acknowledged:,}",
            str(r.lost),
            str(r.duplicated),
            str(r.anomalies),
            r.reconciled,
            f"{r.seconds:.0f}",
            style=style,
        )
    return t


def print_table(rows: list[Figures], console: Console | None = None) -> None:
    console = console or Console()
    console.print(table(rows))
    for r in rows:
        for note in r.notes:
            console.print(f"[dim]{r.scenario}:[/] {note}")
        for finding in r.findings:
            console.print(f"[red]{r.scenario}:[/] {finding}", highlight=False)
