"""Spark reconciliation: prove, from the services' own tables and the broker's commit log, that
every committed local transaction produced exactly one visible message, no rolled-back one did,
and every consumer group applied each message once.

Run it as ``txbroker reconcile ...`` or ``spark-submit spark_reconcile/job.py ...``; the checks
and their joins are described in docs/reconciliation.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.options import JobOptions, LogSpec, ServiceSpec

if TYPE_CHECKING:
    from txbroker_reconcile.standalone import StandaloneCluster


def __getattr__(name: str) -> Any:
    # The cluster (subprocesses, HTTP) is imported when first asked for: `txbroker --help`
    # reads the options above without it.
    if name != "StandaloneCluster":
        raise AttributeError(f"module 'txbroker_reconcile' has no attribute {name!r}")
    from txbroker_reconcile.standalone import StandaloneCluster

    globals()[name] = StandaloneCluster  # once: later lookups are plain attribute reads
    return StandaloneCluster


__all__ = [
    # the job's options and its one error
    "CannotRun",
    "JobOptions",
    "LogSpec",
    "ServiceSpec",
    # a Spark standalone cluster (a master and a worker) on this machine
    "StandaloneCluster",
]
