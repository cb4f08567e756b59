"""The job's inputs as DataFrames, named once: the log split by what its records are, and the
services' tables with the service each row came from.

Every check in :mod:`.checks` starts from these, so what "visible", "half" and "decided" mean
is written here and nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from txbroker.protocol.names import SYSTEM_PREFIX
from txbroker.tx.state import HALF_TOPIC, OP_TOPIC

__all__ = ["DLQ_PREFIX", "Inputs", "is_user_topic"]

DLQ_PREFIX = SYSTEM_PREFIX + "DLQ" + SYSTEM_PREFIX  # dead letters of group G: %DLQ%G


def is_user_topic(topic: Column) -> Column:
    return ~topic.startswith(SYSTEM_PREFIX)


@dataclass(frozen=True)
class Inputs:
    """``log`` is every record (valid and corrupt), each with the ``broker_group`` whose log
    it came from (a segment and position are places in one group's log); the tables carry a
    ``service`` column (and the outbox its ``namespace``)."""

    log: DataFrame
    local_tx: DataFrame  # service, tx_id, state, topic, created_ms
    outbox: DataFrame  # service, namespace, id, topic, created_ms, published_ms, attempts
    inbox: DataFrame  # service, consumer_group, message_id, processed_ms
    effects: DataFrame  # service, effect (table.column), value, copies
    # inbox rows joined to their visible message: service, consumer_group, message_id,
    # processed_ms, topic, store_ms. Groups' subscriptions, misses and latencies all start
    # here, so it is computed (and kept) once.
    processed: DataFrame
    # visible transactional messages per transaction id: tx_id, copies, and the first one's
    # topic, store_ms and message_id. Lost, phantom, duplicate and undecided all join on it;
    # it is kept hash-partitioned by tx_id, as is ``committed_tx``, so those joins move no
    # data.
    tx_messages: DataFrame
    # committed local transactions: service, tx_id, topic, created_ms, partitioned by tx_id
    committed_tx: DataFrame
    # The log holds several broker groups' logs (records carry ``broker_group``; one
    # broker's log is group ""): only then are message ids compared across groups.
    several_groups: bool = False

    @property
    def records(self) -> DataFrame:
        return self.log.where(F.col("corrupt").isNull())

    @property
    def corrupt(self) -> DataFrame:
        return self.log.where(F.col("corrupt").isNotNull())

    @property
    def visible(self) -> DataFrame:
        """Messages a consumer can see: records in user topics (committed transactional
        copies, plain sends, outbox sends, delivered delayed messages). Retry copies, dead
        letters, halves and op records live in % topics."""
        return self.records.where(is_user_topic(F.col("topic")))

    @property
    def halves(self) -> DataFrame:
        """Half messages, one per transaction. The broker copies an open one forward so it
        outlives retention (``txbroker/tx/halfcopy.py``): the copies are one transaction, the
        newest says its state (``tx_state``), and ``store_ms`` is the PREPARE's (a copy
        keeps it as its born time)."""
        newest = Window.partitionBy("tx_id").orderBy(F.col("position").desc())
        return (
            self.records.where(F.col("topic") == HALF_TOPIC)
            .withColumn("_n", F.row_number().over(newest))
            .where(F.col("_n") == 1)
            .drop("_n")
            .withColumn("store_ms", F.least("born_ms", "store_ms"))
        )

    @property
    def ops(self) -> DataFrame:
        return self.records.where(F.col("topic") == OP_TOPIC)

    @property
    def dead_letters(self) -> DataFrame:
        return self.records.where(F.col("topic").startswith(DLQ_PREFIX))

    @property
    def committed(self) -> DataFrame:
        return self.committed_tx

    def outbox_key(self) -> Column:
        """The idempotency key the relay sends an outbox row with (txbroker_outbox.Relay)."""
        return F.concat(F.lit("outbox:"), F.col("namespace"), F.lit(":"), F.col("id"))
