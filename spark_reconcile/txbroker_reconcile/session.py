"""The Spark session the job runs in: local by default, the cluster's under spark-submit.

Settings that matter for correctness are fixed here: the session time zone is UTC (the services'
timestamps are compared with the broker's epoch milliseconds) and the workers run this
interpreter (the log's data source and the record layout are Python).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from pyspark.sql import SparkSession

from txbroker_reconcile.logsource import LogDataSource

__all__ = ["spark_session"]

_LOG4J = (Path(__file__).parent / "log4j2.properties").as_uri()


def spark_session(
    master: str, jars: Sequence[str], *, shuffle_partitions: int | None = None
) -> SparkSession:
    """Build (or join, under spark-submit) the session, with the JDBC jars and the log's data
    source registered."""
    # Executors started by this driver run the same interpreter, so they import the same
    # txbroker_reconcile; PYSPARK_PYTHON set by the user (a cluster's own Python) wins.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    cores = os.cpu_count() or 2
    java = f"-Duser.timezone=UTC -Dlog4j2.configurationFile={_LOG4J}"
    builder = (
        SparkSession.builder.appName("txbroker-reconcile")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", java)
        .config("spark.executor.extraJavaOptions", "-Duser.timezone=UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions or max(4, 4 * cores)))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        # Only the joins the job marks (small tables: topics, subscriptions) are broadcast.
        # Left to itself Spark once chose to broadcast a multi-million-row side and ran the
        # driver out of memory.
        .config("spark.sql.autoBroadcastJoinThreshold", "-1")
        .config("spark.sql.adaptive.autoBroadcastJoinThreshold", "-1")
    )
    if not os.environ.get("PYSPARK_GATEWAY_PORT"):
        # Not under spark-submit (which starts the JVM first and hands Python its port): the
        # master is ours to set. Under spark-submit its --master stands.
        builder = (
            builder.master(master)
            .config("spark.ui.enabled", "false")
            # Local mode runs the executors inside the driver's JVM: its heap is theirs.
            .config("spark.driver.memory", os.environ.get("TXBROKER_SPARK_MEMORY", "4g"))
        )
        if _on_loopback(master):
            # A master on loopback (python -m txbroker_reconcile.standalone) has its executors
            # there too, and they call the driver back: it listens on loopback as well, not on
            # whatever address the host name resolves to.
            builder = builder.config("spark.driver.host", "127.0.0.1").config(
                "spark.driver.bindAddress", "127.0.0.1"
            )
    if jars:
        builder = builder.config("spark.jars", ",".join(jars))
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.dataSource.register(LogDataSource)
    return spark


def _on_loopback(master: str) -> bool:
    """``spark://127.0.0.1:7077`` or ``spark://localhost:7077`` (a standalone master here)."""
    host = master.removeprefix("spark://").rpartition(":")[0]
    return master.startswith("spark://") and host in ("127.0.0.1", "localhost")
