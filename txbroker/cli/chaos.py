"""`txbroker chaos`: the fault campaign, a table of figures at the end.

Exit code: 0 when every scenario lost nothing acknowledged, applied nothing twice and found no
anomaly; 1 otherwise (its files are kept and named); 2 when it could not run.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from txbroker.chaos import SCENARIO_HELP
from txbroker.cli.common import Subparsers, positive, run
from txbroker.errors import InvalidArgument

if TYPE_CHECKING:
    from collections.abc import Callable

    from txbroker.chaos import Figures, Sizes

__all__ = ["add_campaign_flags", "register", "run_from_flags"]


def register(sub: Subparsers) -> None:
    listing = "; ".join(f"{name}: {text}" for name, text in SCENARIO_HELP.items())
    p = sub.add_parser(
        "chaos",
        help="the fault campaign: kill, stop, cut and fill under load; lost and duplicated",
        description=(
            "Start a broker and two services (SQLite databases unless the scenario brings its "
            "own), put them under load, inject faults round after round, then check that no "
            "acknowledged message was lost, no effect applied twice and every transaction is as "
            "its local decision says, with the Spark reconciliation when PySpark is installed. "
            f"Loopback only. Scenarios: {listing}."
        ),
    )
    p.add_argument(
        "--scenario",
        action="append",
        choices=list(SCENARIO_HELP),
        help="run this scenario (repeat for several; default: all, in order)",
    )
    # No defaults for the sizes: a flag left out leaves Sizes' own, read when the campaign runs.
    p.add_argument("--rounds", type=positive, help="faults per scenario")
    p.add_argument("--load", type=positive, help="plain sends per round")
    p.add_argument(
        "--round-timeout",
        type=float,
        help="seconds a round may take to make progress before the scenario ends",
    )
    p.add_argument("--max-seconds", type=float, help="seconds per scenario at most")
    p.add_argument(
        "--settle",
        type=float,
        help="seconds for everything to settle after the rounds, before the checks",
    )
    p.add_argument(
        "--disk",
        choices=["auto", "tmpfs", "rlimit"],
        help="disk-full: a small tmpfs (root), RLIMIT_FSIZE on the broker, or auto (tmpfs when "
        "it can be mounted)",
    )
    add_campaign_flags(p)
    p.set_defaults(func=_chaos)


def run_from_flags(
    args: argparse.Namespace,
    scenarios: tuple[str, ...],
    sizes: Sizes,
    detail: Callable[[Figures], str],
) -> list[Figures] | None:
    """Run ``scenarios`` as the campaign flags (:func:`add_campaign_flags`) say, a progress
    line per scenario on stderr (with ``detail``); None, said why, if it cannot run."""
    from rich.console import Console

    from txbroker.chaos import CampaignOptions, run_campaign

    # The clients' reconnect warnings are what the faults are for: only errors are news.
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    err = Console(stderr=True)

    def done(f: Figures) -> None:
        if not args.json:
            verdict = "clean" if f.clean else "[red]NOT CLEAN[/]"
            err.log(f"{f.scenario}: {f.rounds} rounds, {detail(f)}, {verdict}")

    opts = CampaignOptions(
        scenarios=scenarios,
        sizes=sizes,
        root=Path(args.data_dir) if args.data_dir else None,
        keep=args.keep,
        reconcile={"auto": None, "on": True, "off": False}[args.reconcile],
        seed=args.seed,
        on_done=done,
    )
    try:
        return run(run_campaign(opts))
    except RuntimeError as e:
        err.print(f"[red]cannot run:[/] {e}")
        return None


def add_campaign_flags(p: argparse.ArgumentParser) -> None:
    """What every campaign command takes (`chaos`, `bench failover`)."""
    p.add_argument(
        "--reconcile",
        choices=["auto", "on", "off"],
        default="auto",
        help="the Spark reconciliation after each scenario (auto: when PySpark is there)",
    )
    p.add_argument("--seed", type=int, help="the random seed (printed with the figures)")
    p.add_argument("--data-dir", help="where the scenarios' folders go (default: $TMPDIR)")
    p.add_argument("--keep", action="store_true", help="keep the folders of clean scenarios too")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")


def _chaos(args: argparse.Namespace) -> int:
    from rich.console import Console

    from txbroker.chaos import CampaignOptions, Sizes, print_table

    given: dict[str, Any] = {
        "rounds": args.rounds,
        "load": args.load,
        "round_timeout_s": args.round_timeout,
        "max_s": args.max_seconds,
        "settle_s": args.settle,
        "disk": args.disk,
    }
    sizes = Sizes(**{k: v for k, v in given.items() if v is not None})
    if sizes.round_timeout_s <= 0 or sizes.max_s <= 0 or sizes.settle_s <= 0:
        raise InvalidArgument("--round-timeout, --max-seconds and --settle must be positive")
    rows = run_from_flags(
        args,
        tuple(args.scenario or ()) or CampaignOptions().scenarios,
        sizes,
        lambda f: f"{f.faults} faults",
    )
    if rows is None:
        return 2
    if args.json:
        print(json.dumps([r.as_dict() for r in rows], indent=2))
    else:
        print_table(rows, Console(width=None if sys.stdout.isatty() else 160))
    return 0 if all(r.clean for r in rows) else 1
