"""Latency per topic along the message's path, and the traffic over time.

Three legs, each a join on the id both sides carry (:func:`legs`): commit → store, store →
processed (per group), and the two end to end. The services' times are their database's clock
(PostgreSQL's ``now()`` is the transaction's start, to the microsecond; SQLite's to the
millisecond, whole seconds in rows written before ``txbroker db upgrade`` revision txb_0002),
the broker's its own: on one host they agree, across hosts they are as good as the hosts' clock
sync.
"""

from __future__ import annotations

from functools import reduce
from typing import Final

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from txbroker_reconcile.charts import nice_step_ms
from txbroker_reconcile.inputs import Inputs

__all__ = [
    "HISTOGRAM_EDGES_MS",
    "LEGS",
    "MIN_SAMPLES",
    "RATE_BUCKETS_MAX",
    "histograms",
    "latencies",
    "legs",
    "throughput",
]

LEGS: Final = ("commit → store", "store → processed", "commit → processed")
# Histogram bucket edges (ms), roughly x2.5 apart: fine where latencies live, wide in the tail.
HISTOGRAM_EDGES_MS: Final = (
    1,
    2,
    5,
    10,
    25,
    50,
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    60_000,
)
_ACCURACY: Final = 10_000  # percentile_approx's relative error is 1/accuracy
# A percentile is given only from the count at which at least one sample lies above it,
# n >= 1 / (1 - p): below that, the smallest value with a share p of the samples at or under
# it is the largest sample, the max under another name (p99 of 3 samples is their max).
# p95 from 20 samples, p99 from 100; fewer, and the figure is null ("—" in the report). The
# median is given from one sample: a reader takes it for the middle, not for a tail.
MIN_SAMPLES: Final = {"p50": 1, "p95": 20, "p99": 100}
_QUANTILES: Final = [int(name[1:]) / 100 for name in MIN_SAMPLES]  # 0.5, 0.95, 0.99
# The rate chart's points: enough to show a burst, few enough to read each one.
RATE_BUCKETS_MAX: Final = 60


def legs(i: Inputs) -> DataFrame:
    """(topic, leg, group, ms): one row per measured leg of one message.

    ::

        commit → store       txb_local_tx.created_at (or txb_outbox.created_at) to the visible
                             record's store time; joined on the transaction id (the outbox key)
        store → processed    the visible record's store time to txb_inbox.processed_at, per
                             group; joined on the message id
        commit → processed   the two above end to end, per group
    """
    # Transactional messages by transaction (the first copy when there are two: duplicates are
    # reported as such), partitioned like the committed rows they join.
    tx = i.tx_messages.select("tx_id", "topic", "message_id", "store_ms").join(
        i.committed.select("tx_id", F.col("created_ms").alias("commit_ms")), "tx_id"
    )
    vis = i.visible.select("topic", "idempotency_key", "message_id", "store_ms")
    ob = i.outbox.select(
        i.outbox_key().alias("idempotency_key"), F.col("created_ms").alias("commit_ms")
    )
    committed = tx.drop("tx_id").unionByName(
        vis.join(ob, "idempotency_key").drop("idempotency_key")
    )
    processed = i.processed.select(
        "topic", "consumer_group", "message_id", "processed_ms", "store_ms"
    )
    end_to_end = committed.select("message_id", "commit_ms").join(processed, "message_id")
    null_group = F.lit(None).cast("string")
    return reduce(
        DataFrame.unionByName,
        [
            committed.select(
                "topic",
                F.lit(LEGS[0]).alias("leg"),
                null_group.alias("group"),
                (F.col("store_ms") - F.col("commit_ms")).alias("ms"),
            ),
            processed.select(
                "topic",
                F.lit(LEGS[1]).alias("leg"),
                F.col("consumer_group").alias("group"),
                (F.col("processed_ms") - F.col("store_ms")).alias("ms"),
            ),
            end_to_end.select(
                "topic",
                F.lit(LEGS[2]).alias("leg"),
                F.col("consumer_group").alias("group"),
                (F.col("processed_ms") - F.col("commit_ms")).alias("ms"),
            ),
        ],
    )


def latencies(legs: DataFrame) -> DataFrame:
    """(topic, leg, group, count, p50, p95, p99, max) in ms; a percentile is null when
    ``count`` is below its :data:`MIN_SAMPLES`."""
    pct = F.percentile_approx("ms", _QUANTILES, _ACCURACY)

    def shown(n: int, name: str) -> Column:
        return F.when(F.col("count") >= MIN_SAMPLES[name], F.col("p")[n]).alias(name)

    return (
        legs.groupBy("topic", "leg", "group")
        .agg(F.count("*").alias("count"), pct.alias("p"), F.max("ms").alias("max"))
        .select(
            "topic",
            "leg",
            "group",
            "count",
            *(shown(n, name) for n, name in enumerate(MIN_SAMPLES)),
            "max",
        )
    )


def histograms(legs: DataFrame) -> DataFrame:
    """(topic, leg, bucket, count): how many legs fall below each edge (bucket = the edge's
    index; one past the last edge for the rest). Negative legs (clock skew) land in 0."""
    bucket = F.lit(len(HISTOGRAM_EDGES_MS))
    for n, edge in reversed(list(enumerate(HISTOGRAM_EDGES_MS))):
        bucket = F.when(F.col("ms") < edge, n).otherwise(bucket)
    return legs.groupBy("topic", "leg", bucket.alias("bucket")).count()


def throughput(i: Inputs) -> tuple[DataFrame, int]:
    """(topic, t_ms, count): visible messages per topic per time bucket, the bucket a round
    width (:func:`~txbroker_reconcile.charts.nice_step_ms`) that cuts the whole span into at
    most :data:`RATE_BUCKETS_MAX`, its edges on round clock times; returns the width (ms) too.
    Buckets without a message have no row."""
    span = i.visible.agg(F.min("store_ms"), F.max("store_ms")).first()
    lo, hi = (span[0], span[1]) if span and span[0] is not None else (0, 0)
    width = nice_step_ms(lo, hi, RATE_BUCKETS_MAX)
    slot = (F.floor(F.col("store_ms") / width) * width).cast("long")
    return i.visible.groupBy("topic", slot.alias("t_ms")).count(), width
