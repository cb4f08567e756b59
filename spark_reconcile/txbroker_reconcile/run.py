"""One reconciliation from the command line: inputs → Spark → report, with progress on stderr
and the exit code as the verdict (0 clean, 1 anomalies, 2 could not run).
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console

from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.options import JobOptions, parse_args

__all__ = ["EXIT_ANOMALIES", "EXIT_CANNOT_RUN", "EXIT_CLEAN", "main", "reconcile", "run_job"]

EXIT_CLEAN, EXIT_ANOMALIES, EXIT_CANNOT_RUN = 0, 1, 2


class _Progress:
    """A status line on stderr: the job's current step and Spark's active stage, polled from
    the status tracker (stage, tasks done of total)."""

    def __init__(self, console: Console, enabled: bool) -> None:
        self.console = console
        self.enabled = enabled
        self.step = "starting Spark"
        self._status: Any = None

    def say(self, text: str) -> None:
        self.step = text
        if self.enabled:
            self.console.log(text)

    @contextlib.contextmanager
    def watching(self, spark: Any) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        stop = threading.Event()
        tracker = spark.sparkContext.statusTracker()

        def poll() -> None:
            while not stop.wait(0.5):
                stages = [tracker.getStageInfo(s) for s in tracker.getActiveStageIds()]
                done = sum(s.numCompletedTasks for s in stages if s)
                total = sum(s.numTasks for s in stages if s)
                extra = f" · Spark stage tasks {done}/{total}" if total else ""
                status.update(f"{self.step}{extra}")

        with self.console.status(self.step) as status:
            t = threading.Thread(target=poll, name="reconcile-progress", daemon=True)
            t.start()
            try:
                yield
            finally:
                stop.set()
                t.join(timeout=2)


def reconcile(opts: JobOptions, progress: _Progress, spark: Any = None) -> dict[str, Any]:
    """One pass; returns the summary. ``spark`` lets tests share one session."""
    from txbroker_reconcile.analyze import analyze
    from txbroker_reconcile.extract import check_log, extract
    from txbroker_reconcile.jars import find_jars
    from txbroker_reconcile.report import write_report
    from txbroker_reconcile.session import spark_session
    from txbroker_reconcile.sources import ServiceDb
    from txbroker_reconcile.state import State
    from txbroker_reconcile.summary import write_summary

    check_log(opts.log_specs)
    opts.out.mkdir(parents=True, exist_ok=True)
    if spark is None:
        dialects = [ServiceDb.dialect_of(s) for s in opts.services]
        jars = find_jars(dialects, opts.jars)
        spark = spark_session(opts.master, jars, shuffle_partitions=opts.shuffle_partitions)
    temp = None
    if opts.state is None:
        temp = Path(tempfile.mkdtemp(prefix=".inputs-", dir=opts.out))
    state = State(opts.state or temp)  # type: ignore[arg-type]
    if opts.state is not None:
        opts.state.mkdir(parents=True, exist_ok=True)
    try:
        with progress.watching(spark):
            extracted = extract(spark, opts, state, progress.say)
            progress.say("checking: lost, phantom, duplicate, stuck; latency")
            summary = analyze(spark, opts, state, extracted, opts.out)
        state.commit()
    finally:
        if temp is not None:
            state.discard()
    write_summary(summary, opts.out)
    write_report(summary, opts.out)
    return summary


def _console(*, stderr: bool) -> Console:
    """A console for the terminal, or, into a log or a pipe, lines wide enough not to be
    wrapped (rich assumes 80 columns there)."""
    stream = sys.stderr if stderr else sys.stdout
    return Console(stderr=stderr, width=None if stream.isatty() else 160, log_path=False)


def main(argv: Sequence[str] | None = None, prog: str = "txbroker reconcile") -> int:
    try:
        opts = parse_args(argv, prog)
    except CannotRun as e:
        _console(stderr=True).print(f"[red]cannot run:[/] {e}")
        return EXIT_CANNOT_RUN
    return run_job(opts)


def run_job(opts: JobOptions) -> int:
    """Run (and with ``every_s``, keep running) the job; print the summary; return the exit
    code."""
    from txbroker_reconcile.report import REPORT_FILE
    from txbroker_reconcile.summary import print_summary

    err = _console(stderr=True)
    progress = _Progress(err, opts.progress and not opts.json)
    out = _console(stderr=False)
    stop = threading.Event()
    if opts.every_s is not None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stop.set())
    while True:
        started = time.monotonic()
        try:
            summary = reconcile(opts, progress)
        except CannotRun as e:
            err.print(f"[red]cannot run:[/] {e}")
            return EXIT_CANNOT_RUN
        if opts.json:
            keys = ("clean", "anomalies", "by_reason", "topics", "inputs")
            print(json.dumps({k: summary[k] for k in keys}, default=str), flush=True)
        else:
            print_summary(summary, opts.out / REPORT_FILE, out)
        code = EXIT_CLEAN if summary["clean"] else EXIT_ANOMALIES
        if opts.every_s is None:
            return code
        if stop.wait(max(0.0, opts.every_s - (time.monotonic() - started))):
            return code


if __name__ == "__main__":
    sys.exit(main())
