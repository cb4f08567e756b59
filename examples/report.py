"""What the demo proves: read every database and the broker, and count what does not add up.

The guarantee, as counts: every order the client was told is placed is in the orders table
with a committed barrier row, exactly one payment and exactly one reservation; no declined
order left a trace; no payment or reservation exists for an order that is not there; the
broker has no transaction left open and the outbox nothing left unpublished.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from examples.billing import PAYMENTS
from examples.driver import Outcome
from examples.inventory import RESERVATIONS
from examples.orders import ORDERS
from txbroker_sdk.tables import INBOX, LOCAL_TX, OUTBOX

__all__ = ["Snapshot", "format_report", "read_metrics", "take_snapshot"]

_METRIC = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
# Labels every OpenTelemetry instrument carries (its scope): left out of the keys.
_SCOPE_LABEL = re.compile(r'otel_scope_\w+="[^"]*",?')
_ENDED = 'txbroker_tx_ended_total{{txbroker_tx_decision="{}"}}'


async def read_metrics(http_base: str) -> dict[str, float]:
    """The broker's /metrics as {"name" or "name{labels}": value}."""
    out: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(http_base + "/metrics")).text
    for line in text.splitlines():
        m = _METRIC.match(line)
        if m:
            labels = _SCOPE_LABEL.sub("", m.group(2) or "").rstrip(",")
            name = m.group(1) + (f"{{{labels}}}" if labels else "")
            out[name] = float(m.group(3))
    return out


@dataclass
class Snapshot:
    orders: set[str] = field(default_factory=set)
    # Order ids with a committed barrier row. (An order may also have rolled-back rows: an
    # attempt whose service died before its commit, which the client then retried.)
    committed: set[str] = field(default_factory=set)
    unpublished: int = 0
    outbox_rows: int = 0
    payments: Counter[str] = field(default_factory=Counter)
    reservations: Counter[str] = field(default_factory=Counter)
    billing_inbox: int = 0
    inventory_inbox: int = 0
    metrics: dict[str, float] = field(default_factory=dict)

    @property
    def pending_tx(self) -> int:
        return int(
            self.metrics.get("txbroker_tx_pending", 0) + self.metrics.get("txbroker_tx_parked", 0)
        )

    def settled(self) -> bool:
        return (
            self.pending_tx == 0
            and self.unpublished == 0
            and self.orders <= set(self.payments)
            and self.orders <= set(self.reservations)
        )


async def _inbox(engine: AsyncEngine, group: str) -> int:
    async with engine.connect() as c:
        q = sa.select(sa.func.count()).select_from(INBOX).where(INBOX.c.consumer_group == group)
        return int(await c.scalar(q) or 0)


async def take_snapshot(
    orders_db: AsyncEngine, billing_db: AsyncEngine, inventory_db: AsyncEngine, http_base: str
) -> Snapshot:
    s = Snapshot()
    async with orders_db.connect() as c:
        s.orders = set((await c.scalars(sa.select(ORDERS.c.id))).all())
        s.committed = set(
            (
                await c.scalars(
                    sa.select(LOCAL_TX.c.key).where(
                        LOCAL_TX.c.topic == "orders", LOCAL_TX.c.state == "committed"
                    )
                )
            ).all()
        )
        s.unpublished = int(
            await c.scalar(
                sa.select(sa.func.count())
                .select_from(OUTBOX)
                .where(OUTBOX.c.published_at.is_(None))
            )
            or 0
        )
        s.outbox_rows = int(await c.scalar(sa.select(sa.func.count()).select_from(OUTBOX)) or 0)
    async with billing_db.connect() as c:
        s.payments = Counter((await c.scalars(sa.select(PAYMENTS.c.order_id))).all())
    async with inventory_db.connect() as c:
        s.reservations = Counter((await c.scalars(sa.select(RESERVATIONS.c.order_id))).all())
    s.billing_inbox = await _inbox(billing_db, "billing")
    s.inventory_inbox = await _inbox(inventory_db, "inventory")
    s.metrics = await read_metrics(http_base)
    return s


def read_stats(folder: Path) -> dict[str, Counter[str]]:
    """Counters per service, summed over its incarnations (a killed one left its last write)."""
    out: dict[str, Counter[str]] = {}
    for f in sorted(folder.glob("*.json")):
        name = f.stem.rsplit("-", 1)[0]
        out.setdefault(name, Counter()).update(json.loads(f.read_text()))
    return out


def anomalies(s: Snapshot, driven: Outcome) -> list[tuple[str, int]]:
    committed = s.committed
    return [
        ("placed orders missing from the database", len(driven.placed - s.orders)),
        ("declined orders found in the database", len(driven.declined & s.orders)),
        ("orders without a committed barrier row", len(s.orders - committed)),
        ("committed barrier rows without an order", len(committed - s.orders)),
        ("orders without a payment", len(s.orders - set(s.payments))),
        ("orders paid more than once", sum(1 for n in s.payments.values() if n > 1)),
        ("payments for unknown orders", len(set(s.payments) - s.orders)),
        ("orders without a reservation", len(s.orders - set(s.reservations))),
        ("orders reserved more than once", sum(1 for n in s.reservations.values() if n > 1)),
        ("reservations for unknown orders", len(set(s.reservations) - s.orders)),
        ("transactions still open at the broker", s.pending_tx),
        ("outbox rows never published", s.unpublished),
    ]


def format_report(
    s: Snapshot,
    driven: Outcome,
    stats: dict[str, Counter[str]],
    kills: dict[str, int],
) -> tuple[str, int]:
    """The summary table, and the number of anomalies."""
    checks = {
        k.split('"')[1]: int(v)
        for k, v in s.metrics.items()
        if k.startswith("txbroker_tx_checks_total{")
    }
    dlq = sum(int(v) for k, v in s.metrics.items() if "%DLQ%" in k and "sent_messages" in k)
    bad = anomalies(s, driven)
    skipped = sum(stats.get(name, Counter())["skipped"] for name in ("billing", "inventory"))
    rows: list[tuple[str, str]] = [
        ("orders placed (client got 201/409)", f"{len(driven.placed):,}"),
        ("orders declined by a business rule (422)", f"{len(driven.declined):,}"),
        ("orders committed in the orders database", f"{len(s.orders):,}"),
        ("client retries (service down, 503)", f"{driven.retries:,}"),
        ("orders messages applied by billing", f"{s.billing_inbox:,}"),
        ("payments applied", f"{sum(s.payments.values()):,}"),
        ("outbox rows published by the relay", f"{s.outbox_rows - s.unpublished:,}"),
        ("inventory messages applied", f"{s.inventory_inbox:,}"),
        ("reservations applied", f"{sum(s.reservations.values()):,}"),
        (
            "duplicate deliveries skipped by the inbox",
            f"{skipped:,}",
        ),
        (
            "billing handler failures (rolled back, retried)",
            f"{stats.get('billing', Counter())['failed']:,}",
        ),
        (
            "business transactions fenced by a back-check",
            f"{stats.get('orders', Counter())['fenced']:,}",
        ),
        ("back-checks made", f"{sum(checks.values()):,}"),
    ]
    rows += [(f"  answered {outcome}", f"{n:,}") for outcome, n in sorted(checks.items())]
    rows += [
        (
            "transactions committed / rolled back at the broker",
            f"{int(s.metrics.get(_ENDED.format('commit'), 0)):,} / "
            f"{int(s.metrics.get(_ENDED.format('rollback'), 0)):,}",
        ),
        ("messages dead-lettered", f"{dlq:,}"),
    ]
    rows += [(f"{name} killed by an injected crash", f"{n}") for name, n in kills.items()]
    rows += [(f"ANOMALY: {label}", f"{n:,}") for label, n in bad if n]
    total = sum(n for _, n in bad)
    rows.append(("anomalies", f"{total}"))
    width = max(len(label) for label, _ in rows)
    vwidth = max(len(v) for _, v in rows)
    line = "  +" + "-" * (width + 2) + "+" + "-" * (vwidth + 2) + "+"
    body = [f"  | {label:<{width}} | {v:>{vwidth}} |" for label, v in rows]
    return "\n".join([line, *body[:-1], line, body[-1], line]), total
