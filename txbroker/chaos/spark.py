"""The Spark reconciliation after each scenario: the orders and billing databases and the
broker's commit log, read by ``txbroker reconcile``'s job (:mod:`txbroker_reconcile`), one
session for the whole campaign (starting one costs seconds). When PySpark, Java or a JDBC jar
is missing, :meth:`Reconciler.unavailable` says which and the campaign reports "not run".
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from txbroker.chaos.service import EFFECTS, NAMESPACE

__all__ = ["Reconciler"]


class Reconciler:
    """Runs the job; ``spark`` lets a caller (the tests) share its session, which is then
    theirs to stop."""

    def __init__(self, spark: Any = None) -> None:
        self._spark = spark
        self._own = spark is None

    @staticmethod
    def unavailable() -> str | None:
        """Why the job cannot run here, or None."""
        try:
            import pyspark  # noqa: F401

            from txbroker_reconcile.errors import CannotRun
            from txbroker_reconcile.jars import find_jars
        except ImportError as e:
            return f"no pyspark ({e.name}): pip install 'txbroker[reconcile]'"
        if shutil.which("java") is None:
            return "no Java"
        try:
            find_jars(["postgresql", "sqlite"])
        except CannotRun as e:
            return str(e)
        return None

    def run(
        self, orders_url: str, billing_url: str, log: Path | dict[str, Path], out: Path
    ) -> tuple[str, int]:
        """One pass over a settled world: ("clean" | "N anomalies: reasons", anomaly count).
        ``log``: the broker's data directory, or each broker group's (its master's)."""
        from txbroker_reconcile.jars import find_jars
        from txbroker_reconcile.options import JobOptions, LogSpec, ServiceSpec
        from txbroker_reconcile.run import _Progress, reconcile
        from txbroker_reconcile.session import spark_session

        if self._spark is None:
            jars = find_jars(["postgresql", "sqlite"])
            self._spark = spark_session("local[2]", jars, shuffle_partitions=4)
        opts = JobOptions(
            services=(
                ServiceSpec("orders", orders_url, NAMESPACE),
                ServiceSpec("billing", billing_url, "billing", ((EFFECTS.name, "ref"),)),
            ),
            log=log if isinstance(log, Path) else None,
            logs=tuple(LogSpec(g, d) for g, d in sorted(log.items()))
            if isinstance(log, dict)
            else (),
            out=out,
            grace_s=0,  # the world has settled: everything is judged
            as_of_ms=int(time.time() * 1000),
            progress=False,
            examples=5,
        )
        summary = reconcile(opts, _Progress(Console(stderr=True), False), spark=self._spark)
        count = sum(int(n) for n in summary["anomalies"].values())
        if count == 0:
            return "clean", 0
        reasons = "; ".join(
            f"{r['kind']} {r['reason']} on {r['topic']}: {r['count']}" for r in summary["by_reason"]
        )
        return f"{count} anomalies ({reasons}; report in {out})", count

    def close(self) -> None:
        if self._own and self._spark is not None:
            self._spark.stop()
            self._spark = None
