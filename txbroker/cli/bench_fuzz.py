"""`txbroker bench fuzz`: the socket-level and HTTP admin fuzz runs, with a table of figures.

Registered by ``bench.py`` beside the other benches; the runs are ``txbroker/bench/fuzz_*.py``.
Exits 1 when a run saw a crash (the broker gone, an INTERNAL answer, a 5xx, a hang, or the
healthy client failing).
"""

from __future__ import annotations

import argparse
import json
import time

from txbroker.cli.common import Subparsers, positive
from txbroker.cli.output import note, status

__all__ = ["register_fuzz"]


def register_fuzz(bsub: Subparsers) -> None:
    bf = bsub.add_parser(
        "fuzz",
        help="random bytes, mutated frames and odd HTTP requests at a broker; crashes counted",
    )
    bf.add_argument("--cases", type=positive, default=20_000, help="cases per target at most")
    bf.add_argument(
        "--seconds", type=float, default=300.0, help="time per target at most (default 300)"
    )
    bf.add_argument(
        "--target",
        choices=["wire", "http", "all"],
        default="all",
        help="the TCP protocol port, the HTTP admin port, or both (default)",
    )
    bf.add_argument(
        "--seed", type=int, help="replay a run: case N draws from Random(f'{seed}:{N}')"
    )
    bf.add_argument(
        "--concurrency", type=positive, default=8, help="connections at a time (default 8)"
    )
    bf.add_argument("--data-dir", help="where to put the broker's data (default: $TMPDIR)")
    bf.add_argument("--json", action="store_true", help="print one JSON object per target")
    bf.set_defaults(func=_fuzz)


def _fuzz(args: argparse.Namespace) -> int:
    from pathlib import Path

    from txbroker.bench.fuzz_bench import TARGETS, bench_fuzz, kept_log
    from txbroker.bench.fuzz_report import format_reports

    seed = args.seed if args.seed is not None else int(time.time())
    root = Path(args.data_dir) if args.data_dir else None
    targets = TARGETS if args.target == "all" else (args.target,)
    what = f"fuzzing {', '.join(targets)}: up to {args.cases:,} cases, {args.seconds:g} s each"
    with status(f"{what} (seed {seed})", enabled=not args.json):
        reports = bench_fuzz(
            targets,
            args.cases,
            args.seconds,
            seed,
            args.concurrency,
            root,
        )
    if args.json:
        for r in reports:
            print(json.dumps(r.as_dict()))
    else:
        print(format_reports(reports))
    if any(r.crashes or r.tracebacks for r in reports):
        note(f"the broker's log is kept at {kept_log(seed, root)}")
    return 1 if any(r.crashes for r in reports) else 0
