"""From the kept inputs to the results: anomaly rows (Parquet), latency and summary tables
(Parquet), and the summary document every other output is drawn from.

Only aggregates and at most ``examples`` ids per anomaly kind, reason and topic reach the
driver, so its memory does not grow with the data.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from txbroker_reconcile.checks import KINDS, REASONS, anomalies
from txbroker_reconcile.extract import Extracted, read_effects
from txbroker_reconcile.inputs import Inputs, is_user_topic
from txbroker_reconcile.latency import histograms, latencies, legs, throughput
from txbroker_reconcile.options import JobOptions
from txbroker_reconcile.state import State, latest, log_rows
from txbroker_reconcile.summary import SUMMARY_VERSION

__all__ = ["analyze", "load_inputs"]

_EMPTY = {
    "log": "",
    "local_tx": "service string, tx_id string, state string, topic string, created_ms long",
    "outbox": "service string, namespace string, id long, topic string, created_ms long, "
    "published_ms long, attempts int",
    "inbox": "service string, consumer_group string, message_id string, processed_ms long",
}


_LOG_COLUMNS = (
    "broker_group",
    "segment",
    "position",
    "topic",
    "born_ms",
    "store_ms",
    "message_id",
    "idempotency_key",
    "tx_id",
    "tx_op",
    "producer_group",
    "target_topic",
    "timeout_ms",
    "tx_state",
    "corrupt",
)


def load_inputs(spark: SparkSession, state: State, opts: JobOptions) -> Inputs:
    from txbroker_reconcile.logsource import SPARK_SCHEMA

    def kept(name: str, keys: list[str]) -> DataFrame:
        df = state.table(spark, name)
        if df is None:
            if name == "log":
                return spark.createDataFrame([], SPARK_SCHEMA).withColumn("broker_group", F.lit(""))
            return spark.createDataFrame([], _EMPTY[name])
        if name == "log":
            # A state kept before logs had broker groups holds one broker's log: group "".
            group = F.col("broker_group") if "broker_group" in df.columns else F.lit(None)
            df = df.withColumn("broker_group", F.coalesce(group, F.lit("")))
        if state.runs(name) == 1:
            return df.drop("run")  # one read: nothing was read twice
        if name == "log":
            return log_rows(df)
        # Rows of the local-transaction and inbox tables never change once written: any copy
        # of a row read twice will do. Outbox rows do change (published later): the newest.
        return latest(df, keys) if name == "outbox" else df.drop("run").dropDuplicates(keys)

    # Only the columns a check reads are kept in memory (the rest stay in Parquet).
    log = kept("log", ["broker_group", "position"]).select(*_LOG_COLUMNS).persist()
    inbox = kept("inbox", ["service", "consumer_group", "message_id"]).persist()
    local_tx = kept("local_tx", ["service", "tx_id"]).persist()
    visible = log.where(F.col("corrupt").isNull() & is_user_topic(F.col("topic")))
    processed = inbox.join(visible.select("message_id", "topic", "store_ms"), "message_id")
    parts = spark.conf.get("spark.sql.shuffle.partitions") or "8"
    tx_messages = (
        visible.where(F.col("tx_id").isNotNull())
        .repartition(int(parts), "tx_id")
        .groupBy("tx_id")
        .agg(
            F.count("*").alias("copies"),
            F.min("topic").alias("topic"),
            F.min("store_ms").alias("store_ms"),
            F.min_by("message_id", "store_ms").alias("message_id"),
        )
    )
    committed = (
        local_tx.where(F.col("state") == "committed")
        .select("service", "tx_id", "topic", "created_ms")
        .repartition(int(parts), "tx_id")
    )
    return Inputs(
        log=log,
        local_tx=local_tx,
        outbox=kept("outbox", ["service", "id"]).persist(),
        inbox=inbox,
        effects=read_effects(spark, opts),
        processed=processed.persist(),
        tx_messages=tx_messages.persist(),
        committed_tx=committed.persist(),
        several_groups=len(state.log_groups() | {s.group for s in opts.log_specs}) > 1,
    )


def _counts(df: DataFrame, *keys: str) -> dict[Any, int]:
    return {
        tuple(r[:-1]) if len(keys) > 1 else r[0]: r[-1] for r in df.groupBy(*keys).count().collect()
    }


def analyze(
    spark: SparkSession, opts: JobOptions, state: State, extracted: Extracted, out: Path
) -> dict[str, Any]:
    started = time.time()
    as_of_ms = opts.as_of_ms if opts.as_of_ms is not None else int(time.time() * 1000)
    cutoff_ms = as_of_ms - int(opts.grace_s * 1000)
    i = load_inputs(spark, state, opts)

    found = anomalies(i, cutoff_ms)
    found.write.mode("overwrite").parquet(str(out / "anomalies"))
    found = spark.read.parquet(str(out / "anomalies"))

    rank = Window.partitionBy("kind", "reason", "topic").orderBy("at_ms", "id")
    examples = (
        found.withColumn("_n", F.row_number().over(rank))
        .where(F.col("_n") <= opts.examples)
        .drop("_n")
        .collect()
    )
    by_reason = _counts(found, "kind", "reason", "topic")

    leg_rows = legs(i).persist()
    lat = latencies(leg_rows)
    lat.write.mode("overwrite").parquet(str(out / "latencies"))
    lat_rows = spark.read.parquet(str(out / "latencies")).collect()
    hist_rows = histograms(leg_rows).collect()
    tp, slot_ms = throughput(i)
    tp_rows = tp.collect()

    per_topic, tx_topic, ik_topic = {}, {}, {}
    outbox_sent = F.col("idempotency_key").startswith("outbox:").cast("int")
    for r in (
        i.visible.groupBy("topic").agg(F.count("*"), F.count("tx_id"), F.sum(outbox_sent)).collect()
    ):
        per_topic[r[0]], tx_topic[r[0]], ik_topic[r[0]] = r[1], r[2], r[3] or 0
    corrupt = i.corrupt.orderBy("broker_group", "position").limit(max(opts.examples, 1)).collect()
    corrupt_by_group = _counts(i.corrupt, "broker_group")
    records_by_group = _counts(i.records, "broker_group")
    messages_by_group = _counts(i.visible, "broker_group")
    corrupt_count = sum(corrupt_by_group.values())
    records = sum(records_by_group.values())
    # Every group kept in the state, also one this run was not given (its records still count).
    log_groups = {
        group: {
            "path": None,
            "segments": 0,
            "read_this_run": 0,
            **extracted.log_groups.get(group, {}),
            "records": records_by_group.get(group, 0),
            "messages": messages_by_group.get(group, 0),
            "corrupt": corrupt_by_group.get(group, 0),
        }
        for group in sorted({*extracted.log_groups, *records_by_group, *corrupt_by_group})
    }

    topics = sorted(set(per_topic) | {t for (_k, _r, t) in by_reason if t})
    topic_rows = []
    for t in topics:
        row: dict[str, Any] = {
            "topic": t,
            "messages": per_topic.get(t, 0),
            "transactional": tx_topic.get(t, 0),
            "outbox": ik_topic.get(t, 0),
        }
        for kind in KINDS:
            row[kind] = sum(n for (k, _r, tt), n in by_reason.items() if k == kind and tt == t)
        row["latency"] = {
            r["leg"]: {
                "count": r["count"],
                "p50": r["p50"],
                "p95": r["p95"],
                "p99": r["p99"],
                "max": r["max"],
            }
            for r in lat_rows
            if r["topic"] == t and (r["group"] is None or r["leg"] != "commit → store")
        }
        topic_rows.append(row)
    spark.createDataFrame(
        [{k: v for k, v in r.items() if k != "latency"} for r in topic_rows] or [],
        "topic string, messages long, transactional long, outbox long, lost long, "
        "phantom long, duplicate long, stuck long",
    ).write.mode("overwrite").parquet(str(out / "topics"))

    totals = {k: sum(n for (kk, _r, _t), n in by_reason.items() if kk == k) for k in KINDS}
    summary: dict[str, Any] = {
        "version": SUMMARY_VERSION,
        "generated_at_ms": int(time.time() * 1000),
        "as_of_ms": as_of_ms,
        "grace_s": opts.grace_s,
        "clean": sum(totals.values()) == 0,
        "anomalies": totals,
        "by_reason": [
            {"kind": k, "reason": r, "topic": t, "count": n}
            for (k, r, t), n in sorted(
                by_reason.items(), key=lambda x: (list(REASONS).index(x[0][1]), x[0][2] or "")
            )
        ],
        "inputs": {
            "log": {
                "path": ", ".join(s.shown() for s in opts.log_specs) or None,
                "segments": extracted.log_segments,
                "records": records,
                "corrupt": corrupt_count,
                "read_this_run": extracted.log_records,
                # per broker group ("" for a single broker's log): path, segments,
                # read_this_run, records, messages (visible), corrupt
                "groups": log_groups,
            },
            "services": extracted.rows,
            "dialects": extracted.dialects,
            "whole_second_rows": extracted.whole_second_rows,
            "run": state.run,
        },
        "topics": topic_rows,
        "latency": [r.asDict() for r in lat_rows],
        "histograms": [r.asDict() for r in hist_rows],
        "throughput": {"slot_ms": slot_ms, "rows": [r.asDict() for r in tp_rows]},
        "examples": [r.asDict() for r in examples],
        "corrupt": [
            {
                "broker_group": r["broker_group"],
                "segment": r["segment"],
                "position": r["position"],
                "reason": r["corrupt"],
            }
            for r in corrupt
        ],
        "seconds": round(time.time() - started, 3),
    }
    kept = (i.log, i.local_tx, i.outbox, i.inbox, i.processed, i.tx_messages, i.committed_tx)
    for df in (*kept, leg_rows):
        df.unpersist()
    return summary
