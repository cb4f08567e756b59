"""``make demo`` (``python -m examples.demo``): the whole guarantee, holding while processes crash.

Starts a broker on embedded storage and the three example services (SQLite files by default,
one throwaway PostgreSQL database with ``--database-url``), places a few thousand orders while
real SIGKILLs hit each service at its worst moment (:func:`run_demo` lists them), waits for
everything to settle, and prints what every database and the broker hold. Then the Spark
reconciliation checks the same, independently: exit status 0 only if both find no anomaly.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import socket
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from examples.driver import drive
from examples.report import Snapshot, format_report, read_stats, take_snapshot
from examples.supervisor import DemoFailed, Process, Supervisor
from txbroker.runtime.brokerproc import READY_PREFIX, parse_ready
from txbroker_sdk import Client
from txbroker_sdk.database import create_engine
from txbroker_sdk.schema import upgrade
from txbroker_sdk.testing import scratch_database

__all__ = ["DemoOptions", "run_demo"]

SECRET = "demo-secret"
# Quick back-checks, so a transaction whose END_TX died with its service is settled in
# seconds rather than the production defaults' minute; fast retries for failed handlers.
BROKER_SETTINGS = """
tx_timeout_ms = 2000
check_backoff_base_ms = 300
check_backoff_cap_ms = 1500
max_checks = 100
retry_delays_ms = [200, 400, 800, 1600, 3200]
max_reconsume = 16
"""


@dataclass
class DemoOptions:
    orders: int = 2000
    database_url: str | None = None
    faults: bool = True
    kills: int = 2  # per killable service
    fail_rate: float = 0.05
    concurrency: int = 8
    settle_timeout_s: float = 180.0
    work_dir: Path | None = None
    keep: bool = False
    reconcile: bool = True
    report_dir: Path | None = None


def say(text: str) -> None:
    print(text, flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _nth(orders: int, point: str) -> Callable[[], str]:
    """A fault at a random pass of ``point`` between an eighth and a third of the orders,
    drawn anew for each start, so the crashes land while orders are still flowing."""
    lo, hi = max(orders // 8, 1), max(orders // 3, 2)
    return lambda: f"{point}=@{random.randint(lo, hi)}"


@asynccontextmanager
async def _databases(opts: DemoOptions, work: Path) -> AsyncIterator[dict[str, str]]:
    """A database URL per service: SQLite files in ``work``, or one fresh PostgreSQL database
    (dropped afterwards unless --keep) so earlier runs never count."""
    if opts.database_url is None:
        yield {
            name: f"sqlite:///{work / (name + '.db')}"
            for name in ("orders", "billing", "inventory")
        }
        return
    async with scratch_database(opts.database_url, "txb_demo", keep=opts.keep) as url:
        say(f"  PostgreSQL database {url.rpartition('/')[2]} created")
        yield {"orders": url, "billing": url, "inventory": url}


async def run_demo(opts: DemoOptions) -> int:
    """The faults, each a real SIGKILL at the worst moment (see ``txbroker_sdk/faults.py``), with
    the supervisor restarting the victim:

    * the orders service dies between its database commit and END_TX (the back-check commits);
    * billing and inventory die between their inbox commit and the ack (the redelivery is skipped);
    * the outbox relay dies between a send and marking the row (the resend is deduplicated);
    * billing's handler fails after its insert on a few percent of messages (rolled back, retried).
    """
    work = opts.work_dir or Path(tempfile.mkdtemp(prefix="txb-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "logs").mkdir(exist_ok=True)
    stats_dir = work / "stats"
    stats_dir.mkdir(exist_ok=True)
    sup = Supervisor(work / "logs")
    try:
        async with _databases(opts, work) as dbs:
            return await _run(opts, work, dbs, sup, stats_dir)
    except DemoFailed as e:
        say(f"\ndemo failed: {e}")
        return 2
    finally:
        await sup.stop_all()
        if opts.keep or opts.work_dir is not None:
            say(f"  logs and data kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


async def _run(
    opts: DemoOptions, work: Path, dbs: dict[str, str], sup: Supervisor, stats_dir: Path
) -> int:
    say("txbroker demo: orders -> (transactional message) -> billing, (outbox) -> inventory")
    say(f"[1/6] broker on embedded storage in {work / 'broker'}")
    (work / "broker.toml").write_text(BROKER_SETTINGS)
    broker = await sup.start(
        Process(
            "broker",
            [
                "txbroker.cli",
                "serve",
                "--data-dir",
                str(work / "broker"),
                "--port",
                "0",
                "--http-port",
                "0",
                "--segment-mib",
                "64",
                "--config",
                str(work / "broker.toml"),
                "--tx-secret",
                f"orders-svc={SECRET}",
            ],
            ready=READY_PREFIX,
        )
    )
    broker_url, http_base = parse_ready(broker.ready_line)
    async with Client(broker_url) as client:
        await client.create_topic("orders", queues=4)
        await client.create_topic("inventory", queues=4)

    where = "SQLite files" if opts.database_url is None else "PostgreSQL"
    say(f"[2/6] service databases ({where}), migrated with `txbroker db upgrade`")
    for url in dict.fromkeys(dbs.values()):
        await asyncio.to_thread(upgrade, url)

    kills = opts.kills if opts.faults else 0
    port = _free_port()
    say(f"[3/6] services: orders (HTTP :{port}), billing, inventory, outbox relay")
    stats = ["--stats", str(stats_dir)]
    orders = await sup.start(
        Process(
            "orders",
            [
                "examples.orders",
                "--db",
                dbs["orders"],
                "--broker",
                broker_url,
                "--port",
                str(port),
                "--secret",
                SECRET,
                *stats,
            ],
            faults=_nth(opts.orders, "after_db_commit"),
            kill_budget=kills,
        )
    )
    relay = await sup.start(
        Process(
            "relay",
            [
                "txbroker.cli",
                "outbox",
                "relay",
                "--url",
                dbs["orders"],
                "--server",
                broker_url,
                "--namespace",
                "orders",
            ],
            ready=None,
            faults=_nth(opts.orders, "relay_after_send"),
            kill_budget=kills,
        )
    )
    billing = await sup.start(
        Process(
            "billing",
            [
                "examples.billing",
                "--db",
                dbs["billing"],
                "--broker",
                broker_url,
                "--fail-rate",
                str(opts.fail_rate if opts.faults else 0.0),
                *stats,
            ],
            faults=_nth(opts.orders, "after_inbox_commit"),
            kill_budget=kills,
        )
    )
    inventory = await sup.start(
        Process(
            "inventory",
            ["examples.inventory", "--db", dbs["inventory"], "--broker", broker_url, *stats],
            faults=_nth(opts.orders, "after_inbox_commit"),
            kill_budget=kills,
        )
    )
    victims = [orders, relay, billing, inventory]

    def status() -> str:
        return "crashes: " + " ".join(f"{p.name} {p.kills}" for p in victims)

    say(
        f"[4/6] placing {opts.orders:,} orders, {opts.concurrency} at a time"
        + (", with crashes injected" if opts.faults else "")
    )
    drive_task = asyncio.create_task(
        drive(f"http://127.0.0.1:{port}", opts.orders, concurrency=opts.concurrency, status=status)
    )
    failed = asyncio.create_task(sup.failed.wait())
    await asyncio.wait([drive_task, failed], return_when=asyncio.FIRST_COMPLETED)
    if sup.failure is not None:
        drive_task.cancel()
        raise sup.failure
    failed.cancel()
    driven = drive_task.result()
    say(
        f"      {len(driven.placed):,} placed in {driven.elapsed_s:.1f} s "
        f"({len(driven.placed) / driven.elapsed_s:.0f} orders/s), {status()}"
    )

    say("[5/6] waiting for every message to be applied ...")
    engines = {name: create_engine(url) for name, url in dbs.items()}
    try:
        snap = await _settle(opts, engines, http_base, sup)
    finally:
        for e in engines.values():
            await e.dispose()
    await sup.stop_all()  # graceful: the services write their final counters
    table, anomalies = format_report(
        snap, driven, read_stats(stats_dir), {p.name: p.kills for p in victims}
    )
    say("\n" + table)
    say("\nall guarantees held" if anomalies == 0 else f"\n{anomalies} ANOMALIES: see above")
    if not opts.reconcile:
        return 0 if anomalies == 0 else 1
    spark_rc = await _reconcile(opts, work, dbs)
    if (spark_rc == 0) != (anomalies == 0) or spark_rc not in (0, 1):
        say(
            "\nthe Spark reconciliation and the demo's own checker disagree"
            if spark_rc in (0, 1)
            else "\nthe Spark reconciliation could not run (see above)"
        )
        return 1
    return 0 if anomalies == 0 else 1


async def _reconcile(opts: DemoOptions, work: Path, dbs: dict[str, str]) -> int:
    """The Spark job over the services' databases and the broker's log: the independent
    proof (``txbroker reconcile``). Its report outlives a temporary work directory."""
    out = opts.report_dir or (
        work / "reconcile"
        if opts.work_dir
        else Path(tempfile.gettempdir()) / "txbroker-demo-report"
    )
    if len(set(dbs.values())) == 1:  # one PostgreSQL database holds every service's tables
        services = ["--service", f"shop={dbs['orders']}", "--namespace", "shop=orders"]
    else:
        services = [arg for name, url in dbs.items() for arg in ("--service", f"{name}={url}")]
    say("\n[6/6] Spark reconciliation of the services' tables against the broker's log")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "txbroker.cli", "reconcile", *services,
        "--log", str(work / "broker"), "--out", str(out), "--grace", "0s",
        "--master", "local[2]",
    )  # fmt: skip
    return await proc.wait()


async def _settle(
    opts: DemoOptions, engines: dict[str, AsyncEngine], http_base: str, sup: Supervisor
) -> Snapshot:
    deadline = time.monotonic() + opts.settle_timeout_s
    start = next_line = time.monotonic()
    while True:
        snap = await take_snapshot(
            engines["orders"],
            engines["billing"],
            engines["inventory"],
            http_base,
        )
        if snap.settled():
            if sys.stderr.isatty():
                sys.stderr.write("\n")
            say(f"      settled in {time.monotonic() - start:.1f} s")
            return snap
        if sup.failure is not None:
            raise sup.failure
        if time.monotonic() > deadline:
            say(f"      not settled after {opts.settle_timeout_s:.0f} s: reporting as is")
            if snap.pending_tx:  # what the broker knows of them: the first thing to look at
                async with httpx.AsyncClient(timeout=10) as http:
                    open_txs = (await http.get(http_base + "/v1/transactions")).json()
                for tx in open_txs["transactions"][:10]:
                    say(f"      open: {tx}")
            return snap
        line = (
            f"      open transactions {snap.pending_tx}, unpublished outbox rows "
            f"{snap.unpublished}, payments {len(snap.payments):,}/{len(snap.orders):,}, "
            f"reservations {len(snap.reservations):,}/{len(snap.orders):,}"
        )
        if sys.stderr.isatty():
            sys.stderr.write(f"\r{line}\x1b[K")
        elif time.monotonic() >= next_line:  # a line every 5 s in logs
            sys.stderr.write(line + "\n")
            next_line = time.monotonic() + 5
        sys.stderr.flush()
        await asyncio.sleep(0.5)  # polling other processes' databases: there is no event


def positive(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive: {text}")
    return value


def non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be zero or more: {text}")
    return value


def main(argv: list[str] | None = None) -> int:
    demo = argparse.ArgumentParser(
        prog="python -m examples.demo", description=__doc__.split("\n\n")[0]
    )
    demo.add_argument("--orders", type=positive, default=2000, help="orders to place")
    demo.add_argument(
        "--database-url",
        help="run the services on this PostgreSQL server (a throwaway database is created "
        "on it and dropped afterwards); default: SQLite files",
    )
    demo.add_argument("--no-faults", action="store_true", help="no crashes, no handler failures")
    demo.add_argument(
        "--kills", type=non_negative, default=2, help="crashes injected per service (default 2)"
    )
    demo.add_argument("--concurrency", type=positive, default=8, help="orders in flight")
    demo.add_argument("--settle-timeout", type=float, default=180.0, help="seconds")
    demo.add_argument("--work-dir", help="keep the broker data, databases and logs here")
    demo.add_argument("--keep", action="store_true", help="keep the work directory/database")
    demo.add_argument(
        "--no-reconcile", action="store_true", help="skip the Spark reconciliation at the end"
    )
    demo.add_argument(
        "--report-dir",
        help="where the reconciliation report goes (default: <work dir>/reconcile, or "
        "$TMPDIR/txbroker-demo-report)",
    )
    args = demo.parse_args(argv)
    opts = DemoOptions(
        orders=args.orders,
        database_url=args.database_url,
        faults=not args.no_faults,
        kills=args.kills,
        concurrency=args.concurrency,
        settle_timeout_s=args.settle_timeout,
        work_dir=Path(args.work_dir) if args.work_dir else None,
        keep=args.keep,
        reconcile=not args.no_reconcile,
        report_dir=Path(args.report_dir) if args.report_dir else None,
    )
    return asyncio.run(run_demo(opts))


if __name__ == "__main__":
    sys.exit(main())
