"""The anomalies: each kind is one join, written here once (docs/reconciliation.md explains
each in words, with the same names).

Every check returns rows of one schema, :data:`ANOMALY_COLUMNS` (its comment says what each
column holds). ``cutoff_ms`` is "now minus the grace": anything younger is still in flight and
not judged.
"""

from __future__ import annotations

from functools import reduce
from typing import Final

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from txbroker.tx.state import HALF_TOPIC, OP_TOPIC
from txbroker_reconcile.inputs import Inputs, is_user_topic

__all__ = ["ANOMALY_COLUMNS", "KINDS", "REASONS", "anomalies", "subscriptions"]

KINDS: Final = ("lost", "phantom", "duplicate", "stuck")

# reason -> kind, in the order the report lists them.
REASONS: Final = {
    "committed, no message": "lost",
    "outbox row published, no message": "lost",
    "local transaction rolled back": "phantom",
    "no local transaction": "phantom",
    "two messages for one transaction": "duplicate",
    "two messages for one idempotency key": "duplicate",
    "one message in two broker groups": "duplicate",
    "effect applied twice": "duplicate",
    "half message undecided": "stuck",
    "transaction parked": "stuck",
    "outbox row not published": "stuck",
    "not processed by the group": "stuck",
    "dead-lettered": "stuck",
}

# The columns of every check's rows:
#   kind     lost | phantom | duplicate | stuck
#   reason   which check found it
#   topic    the message's topic (the intended one for halves and outbox rows)
#   service  the service whose table the row came from, when there is one
#   group    the consumer group, for consumer-side findings; the broker groups holding a
#            message stored in several (``g1,g2``)
#   id       the transaction id, outbox key, idempotency key, message id or effect value
#   at_ms    when the thing happened (local commit, store time, ...), epoch ms
#   copies   how many there are, for duplicates
ANOMALY_COLUMNS: Final = ("kind", "reason", "topic", "service", "group", "id", "at_ms", "copies")


def _rows(df: DataFrame, reason: str, shape: dict[str, str]) -> DataFrame:
    """Shape ``df`` into anomaly rows: ``shape`` maps anomaly columns to ``df``'s; the others
    are null."""
    values = {c: F.lit(None) for c in ANOMALY_COLUMNS}
    values["kind"], values["reason"] = F.lit(REASONS[reason]), F.lit(reason)
    for name, column in shape.items():
        values[name] = F.col(column)
    return df.select(
        *(
            values[c].cast("long" if c in ("at_ms", "copies") else "string").alias(c)
            for c in ANOMALY_COLUMNS
        )
    )


# How each check's rows become anomaly rows (anomaly column -> the check's column).
_LOCAL = {"topic": "topic", "service": "service", "id": "tx_id", "at_ms": "created_ms"}
_OUTBOX = {"topic": "topic", "service": "service", "id": "key", "at_ms": "created_ms"}
_VISIBLE_TX = {"topic": "topic", "service": "service", "id": "tx_id", "at_ms": "store_ms"}
_COPIES = {"topic": "topic", "at_ms": "store_ms", "copies": "copies"}
_SPREAD = {**_COPIES, "id": "message_id", "group": "broker_groups"}
_EFFECT = {"service": "service", "group": "effect", "id": "value", "copies": "copies"}
_HALF = {"topic": "target_topic", "group": "producer_group", "id": "tx_id", "at_ms": "store_ms"}
_MISSED = {
    "topic": "topic",
    "service": "service",
    "group": "consumer_group",
    "id": "message_id",
    "at_ms": "store_ms",
}


def producer_topics(i: Inputs) -> DataFrame:
    """(topic) whose transactional messages some given service produces: the topics its local
    transactions name, and the target topics of halves from producer groups whose transactions
    are found in a given service's table (so a topic is covered even before its first
    committed row). A phantom can only be judged on a covered topic."""
    from_rows = i.local_tx.select("topic").where(F.col("topic").isNotNull())
    groups = (
        i.halves.select("tx_id", "producer_group")
        .join(i.local_tx.select("tx_id"), "tx_id")
        .select("producer_group")
        .distinct()
    )
    from_halves = i.halves.join(F.broadcast(groups), "producer_group").select(
        F.col("target_topic").alias("topic")
    )
    return from_rows.union(from_halves).distinct()


def subscriptions(i: Inputs) -> DataFrame:
    """(service, group, topic, since_ms): a group consumes a topic when its inbox holds a
    message of that topic; it is judged on messages stored from the first one it processed
    (a group created later may have started at the end of the queue)."""
    return i.processed.groupBy("service", "consumer_group", "topic").agg(
        F.min("store_ms").alias("since_ms")
    )


def lost(i: Inputs, cutoff_ms: int) -> list[DataFrame]:
    committed = i.committed.where(F.col("created_ms") < cutoff_ms)
    lost_tx = committed.join(i.tx_messages, "tx_id", "left_anti")
    vis_keys = i.visible.select(F.col("idempotency_key").alias("key")).where(
        F.col("key").isNotNull()
    )
    published = i.outbox.where(
        F.col("published_ms").isNotNull() & (F.col("created_ms") < cutoff_ms)
    ).withColumn("key", i.outbox_key())
    lost_outbox = published.join(vis_keys.distinct(), "key", "left_anti")
    return [
        _rows(lost_tx, "committed, no message", _LOCAL),
        _rows(lost_outbox, "outbox row published, no message", _OUTBOX),
    ]


def phantom(i: Inputs) -> list[DataFrame]:
    vis_tx = i.tx_messages.join(F.broadcast(producer_topics(i)), "topic")
    orphan = vis_tx.join(i.committed, "tx_id", "left_anti")
    rolled = i.local_tx.where(F.col("state") == "rolled_back").select("tx_id", "service")
    found = orphan.join(rolled, "tx_id", "left")
    return [
        _rows(
            found.where(F.col("service").isNotNull()), "local transaction rolled back", _VISIBLE_TX
        ),
        _rows(found.where(F.col("service").isNull()), "no local transaction", _VISIBLE_TX),
    ]


def duplicate(i: Inputs) -> list[DataFrame]:
    keyed = (
        i.visible.where(F.col("idempotency_key").isNotNull())
        .groupBy("idempotency_key")
        .agg(
            F.count("*").alias("copies"),
            F.min("topic").alias("topic"),
            F.min("store_ms").alias("store_ms"),
        )
        .where(F.col("copies") > 1)
    )
    twice = "two messages for one transaction"
    return [
        _rows(i.tx_messages.where(F.col("copies") > 1), twice, {**_COPIES, "id": "tx_id"}),
        _rows(keyed, "two messages for one idempotency key", {**_COPIES, "id": "idempotency_key"}),
        _rows(spread(i), "one message in two broker groups", _SPREAD),
        _rows(i.effects, "effect applied twice", _EFFECT),
    ]


def spread(i: Inputs) -> DataFrame:
    """Message ids stored by more than one broker group. A group's broker gives the ids of
    what it stores, so one id in two groups' logs is one message delivered by both (a group's
    log restored into another, a slave that joined the wrong group). Within one group a
    record keeps its id through replication and failover: that is not judged here."""
    # One log has nothing to compare: limit(0) lets Spark's optimiser drop the scan and the
    # shuffle, so a single broker's run costs nothing more.
    visible = i.visible if i.several_groups else i.visible.limit(0)
    return (
        visible.groupBy("message_id")
        .agg(
            F.countDistinct("broker_group").alias("groups"),
            F.array_join(F.array_sort(F.collect_set("broker_group")), ",").alias("broker_groups"),
            F.count("*").alias("copies"),
            F.min("topic").alias("topic"),
            F.min("store_ms").alias("store_ms"),
        )
        .where(F.col("groups") > 1)
    )


def stuck(i: Inputs, cutoff_ms: int) -> list[DataFrame]:
    # A commit is recorded by the committed copy itself (visible, or in the schedule topic
    # while delayed); a rollback by an op record.
    scheduled = i.records.where(
        F.col("tx_id").isNotNull()
        & ~is_user_topic(F.col("topic"))
        & ~F.col("topic").isin(HALF_TOPIC, OP_TOPIC)
    ).select("tx_id")
    decided = i.ops.where(F.col("tx_op").isin("commit", "rollback")).select("tx_id")
    # Parked: the latest park/resume op is a park, or a half copied forward after it (its op
    # records may be gone with their segment) says parked.
    last = Window.partitionBy("tx_id").orderBy(F.col("position").desc())
    events = (
        i.ops.where(F.col("tx_op").isin("park", "resume"))
        .select("tx_id", "position", (F.col("tx_op") == "park").alias("is_parked"))
        .unionByName(
            i.halves.where(F.col("tx_state").isNotNull()).select(
                "tx_id", "position", (F.col("tx_state") == "parked").alias("is_parked")
            )
        )
    )
    parked = (
        events.withColumn("n", F.row_number().over(last))
        .where((F.col("n") == 1) & F.col("is_parked"))
        .select("tx_id", F.lit(True).alias("parked"))
    )
    open_halves = (
        i.halves.join(i.tx_messages, "tx_id", "left_anti")
        .join(decided, "tx_id", "left_anti")
        .join(scheduled, "tx_id", "left_anti")
        .where(F.col("store_ms") + F.coalesce(F.col("timeout_ms"), F.lit(0)) < cutoff_ms)
        .join(parked, "tx_id", "left")
    )
    unpublished = i.outbox.where(
        F.col("published_ms").isNull() & (F.col("created_ms") < cutoff_ms)
    ).withColumn("key", i.outbox_key())
    subs = subscriptions(i)
    due = (
        i.visible.where(F.col("store_ms") < cutoff_ms)
        .select("topic", "message_id", "store_ms")
        .join(F.broadcast(subs), "topic")
        .where(F.col("store_ms") >= F.col("since_ms"))
    )
    missed = due.join(
        i.inbox.select("service", "consumer_group", "message_id"),
        ["service", "consumer_group", "message_id"],
        "left_anti",
    )
    # A message the group gave up on sits in its dead-letter topic with the same id.
    dead = i.dead_letters.select(
        "message_id",
        F.substring_index(F.col("topic"), "%", -1).alias("consumer_group"),
        F.lit(True).alias("dead"),
    ).distinct()
    missed = missed.join(dead, ["message_id", "consumer_group"], "left")
    return [
        _rows(open_halves.where(F.col("parked").isNull()), "half message undecided", _HALF),
        _rows(open_halves.where(F.col("parked")), "transaction parked", _HALF),
        _rows(unpublished, "outbox row not published", _OUTBOX),
        _rows(missed.where(F.col("dead").isNull()), "not processed by the group", _MISSED),
        _rows(missed.where(F.col("dead")), "dead-lettered", _MISSED),
    ]


def anomalies(i: Inputs, cutoff_ms: int) -> DataFrame:
    parts = [*lost(i, cutoff_ms), *phantom(i), *duplicate(i), *stuck(i, cutoff_ms)]
    return reduce(DataFrame.unionByName, parts)
