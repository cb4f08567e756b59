"""Spark reconciliation: prove, from the services' own tables and the broker's commit log, that
every committed local transaction produced exactly one visible message, no rolled-back one did,
and every consumer group applied each message once.

Run it as ``txbroker reconcile ...`` or ``spark-submit spark_reconcile/job.py ...``; the checks
and their joins are described in docs/reconciliation.md.
"""

from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.options import JobOptions, ServiceSpec

__all__ = ["CannotRun", "JobOptions", "ServiceSpec"]
