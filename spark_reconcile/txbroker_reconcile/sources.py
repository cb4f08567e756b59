"""The services' tables, read through Spark's JDBC source.

Each read is one SQL query per table, so the database does the projection and filtering and
times arrive as epoch milliseconds (the broker's unit) whatever the database's own type. That
is also what keeps SQLite's times whole: the SQLite JDBC driver reports a ``DATETIME`` column as
a SQL ``DATE``, so Spark reading the column itself keeps the day and drops the time; SQLite's
own ``julianday`` reads the UTC text it holds, and the milliseconds come out exact. On
PostgreSQL a large table is read in ranges of its indexed time or id column, one partition per
range (Spark's ``partitionColumn``), with a fetch size so no partition is fetched in one go.
Before any of that, a one-row probe per table tells apart "the database is not reachable" and
"the table is missing" (each a :class:`CannotRun` naming the service and what to do).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.jars import jdbc_driver
from txbroker_reconcile.options import ServiceSpec

__all__ = ["ServiceDb", "Watermark"]

# Rows per JDBC partition on PostgreSQL: big enough that a partition's query overhead is small,
# small enough that both cores stay busy on tables of a few hundred thousand rows.
ROWS_PER_PARTITION: Final = 500_000
MAX_PARTITIONS: Final = 64
FETCH_SIZE: Final = 20_000

_MS: Final = {
    "postgresql": "(extract(epoch from {c}) * 1000)::bigint",
    "sqlite": "CAST(ROUND((julianday({c}) - 2440587.5) * 86400000) AS INTEGER)",
}
_TEXT: Final = {"postgresql": "CAST({c} AS text)", "sqlite": "CAST({c} AS TEXT)"}
# SQLite rows written before the txb_0002 migration hold CURRENT_TIMESTAMP's whole seconds:
# "2026-11-27 18:58:37", where the milliseconds' default and SQLAlchemy write a fraction.
_WHOLE_SECOND_SQLITE: Final = "{c} NOT LIKE '%.%'"
_TIME_COLUMNS: Final = {
    "txb_local_tx": "created_at",
    "txb_inbox": "processed_at",
    "txb_outbox": "created_at",
}


# The rows as the job keeps them, whatever types the JDBC driver reports (SQLite's driver
# reports computed integers as decimals, for one).
LOCAL_TX: Final = {"tx_id": "string", "state": "string", "topic": "string", "created_ms": "long"}
INBOX: Final = {"consumer_group": "string", "message_id": "string", "processed_ms": "long"}
OUTBOX: Final = {
    "id": "long",
    "topic": "string",
    "created_ms": "long",
    "published_ms": "long",
    "attempts": "int",
}


def _custom(types: dict[str, str]) -> str:
    return ", ".join(f"{c} {t.upper()}" for c, t in types.items())


def _typed(df: DataFrame, schema: dict[str, str]) -> DataFrame:
    return df.select(*(F.col(c).cast(t).alias(c) for c, t in schema.items()))


@dataclass(frozen=True, slots=True)
class Watermark:
    """Where the previous run stopped reading one service: the newest creation/processing
    times seen (ms) and the outbox ids still to be re-read (any row at or past
    ``outbox_from_id`` is read again: it was unpublished, or new)."""

    local_tx_ms: int | None = None
    inbox_ms: int | None = None
    outbox_from_id: int | None = None


class ServiceDb:
    """One service's database as Spark sees it."""

    def __init__(
        self, spark: SparkSession, spec: ServiceSpec, rows_per_partition: int = ROWS_PER_PARTITION
    ) -> None:
        self.spark = spark
        self.spec = spec
        self.rows_per_partition = rows_per_partition
        url = _url(spec)
        self.dialect = self.dialect_of(spec)
        self.shown = url.render_as_string(hide_password=True)
        self.jdbc_url, self.props = _jdbc(url, self.dialect, spec.name)

    @staticmethod
    def dialect_of(spec: ServiceSpec) -> str:
        dialect = _url(spec).get_backend_name()
        dialect = "postgresql" if dialect == "postgres" else dialect
        if dialect not in _MS:
            raise CannotRun(
                f"service {spec.name}: {dialect!r} databases are not supported "
                "(use postgresql://… or sqlite:///…)"
            )
        return dialect

    # --- the reads -------------------------------------------------------------------------

    def ms(self, column: str) -> str:
        return _MS[self.dialect].format(c=column)

    def local_tx(self, since_ms: int | None) -> DataFrame:
        columns = f"tx_id, state, topic, {self.ms('created_at')} AS created_ms"
        where = self._since("created_at", since_ms)
        return _typed(self._read("txb_local_tx", columns, "created_at", where, LOCAL_TX), LOCAL_TX)

    def inbox(self, since_ms: int | None) -> DataFrame:
        columns = f"consumer_group, message_id, {self.ms('processed_at')} AS processed_ms"
        where = self._since("processed_at", since_ms)
        return _typed(self._read("txb_inbox", columns, "processed_at", where, INBOX), INBOX)

    def outbox(self, from_id: int | None) -> DataFrame:
        columns = (
            f"id, topic, {self.ms('created_at')} AS created_ms, "
            f"{self.ms('published_at')} AS published_ms, attempts"
        )
        where = f" WHERE id >= {int(from_id)}" if from_id is not None else ""
        return _typed(self._read("txb_outbox", columns, "id", where, OUTBOX), OUTBOX)

    def repeated_effects(self, table: str, column: str) -> DataFrame:
        """Values of ``table.column`` found more than once, counted in the database (only the
        repeats travel)."""
        self._probe(table, f"SELECT 1 FROM {table} WHERE 1 = 0", hint="an --effect table")
        sql = (
            f"SELECT {_TEXT[self.dialect].format(c=column)} AS value, COUNT(*) AS copies "
            f"FROM {table} WHERE {column} IS NOT NULL GROUP BY {column} HAVING COUNT(*) > 1"
        )
        return self._jdbc(sql, {"value": "string", "copies": "long"})

    # --- helpers ---------------------------------------------------------------------------

    def whole_second_rows(self) -> int:
        """How many barrier, inbox and outbox rows hold a time in whole seconds (SQLite rows written
        before ``txbroker db upgrade`` gave the tables milliseconds); 0 on PostgreSQL."""
        if self.dialect != "sqlite":
            return 0
        total = 0
        for table, column in _TIME_COLUMNS.items():
            where = _WHOLE_SECOND_SQLITE.format(c=column)
            (n,) = self._probe(table, f"SELECT COUNT(*) FROM {table} WHERE {where}")
            total += int(n)
        return total

    def _since(self, column: str, ms: int | None) -> str:
        if ms is None:
            return ""
        if self.dialect == "postgresql":
            return f" WHERE {column} >= to_timestamp({int(ms) / 1000:.3f})"
        # Compared as text, in the form the column holds ("YYYY-MM-DD HH:MM:SS.SSS").
        return (
            f" WHERE {column} >= strftime('%Y-%m-%d %H:%M:%f', {int(ms) / 1000:.3f}, 'unixepoch')"
        )

    def _read(
        self, table: str, columns: str, part: str, where: str, types: dict[str, str]
    ) -> DataFrame:
        """``SELECT columns FROM table where``; on PostgreSQL in ranges of ``part`` (an
        indexed time or id column) when the table is large."""
        if self.dialect != "postgresql":
            self._probe(table, f"SELECT COUNT(*) FROM {table}")
            return self._jdbc(f"SELECT {columns} FROM {table}{where}", types)
        lo, hi, rows = self._probe(
            table, f"SELECT MIN({part}) AS lo, MAX({part}) AS hi, COUNT(*) AS n FROM {table}{where}"
        )
        parts = min(MAX_PARTITIONS, max(1, -(-rows // self.rows_per_partition)))
        sql = f"SELECT {columns}, {part} AS _part FROM {table}{where}"
        if parts == 1 or lo is None:
            return self._jdbc(sql, types).drop("_part")
        bound = str if part == "id" else _spark_ts
        return (
            self.spark.read.format("jdbc")
            .options(
                url=self.jdbc_url,
                dbtable=f"({sql}) AS t",
                partitionColumn="_part",
                lowerBound=bound(lo),
                upperBound=bound(hi),
                numPartitions=str(parts),
                fetchsize=str(FETCH_SIZE),
                customSchema=_custom(types),
                **self.props,
            )
            .load()
            .drop("_part")
        )

    def _jdbc(self, sql: str, types: dict[str, str] | None = None) -> DataFrame:
        """One query. ``types`` pins the columns' Spark types: SQLite's driver guesses a
        computed column's type from its first value and guesses wrong (decimal for text)."""
        options = {"url": self.jdbc_url, "query": sql, "fetchsize": str(FETCH_SIZE), **self.props}
        if types:
            options["customSchema"] = _custom(types)
        return self.spark.read.format("jdbc").options(**options).load()

    def _probe(self, table: str, sql: str, hint: str = "") -> tuple[Any, ...]:
        """Run a query of at most one row; translate a failure into what the user must do."""
        try:
            rows = self._jdbc(sql).collect()
        except Exception as e:  # py4j wraps every JDBC failure; its text tells which
            raise self._explain(table, e, hint) from None
        return tuple(rows[0]) if rows else ()

    def _explain(self, table: str, e: Exception, hint: str) -> CannotRun:
        text = str(e)
        first = next((ln.strip() for ln in text.splitlines() if "Exception" in ln), text)[:300]
        if ("does not exist" in text and "relation" in text) or "no such table" in text:
            if hint:
                return CannotRun(f"service {self.spec.name}: {hint}, {table}, is missing")
            return CannotRun(
                f"service {self.spec.name}: table {table} is missing in {self.shown}: run "
                f"`txbroker db upgrade --url {self.shown}` (the txbroker migrations)"
            )
        return CannotRun(f"service {self.spec.name}: cannot read {self.shown}: {first}")


def _url(spec: ServiceSpec) -> URL:
    try:
        return make_url(spec.url)
    except ArgumentError:
        raise CannotRun(f"service {spec.name}: {spec.url!r} is not a database URL") from None


def _spark_ts(value: Any) -> str:
    return str(value).replace("T", " ")


def _jdbc(url: URL, dialect: str, service: str) -> tuple[str, dict[str, str]]:
    props = {"driver": jdbc_driver(dialect)}
    if dialect == "sqlite":
        path = url.database
        if not path or path == ":memory:":
            raise CannotRun(f"service {service}: an in-memory SQLite database cannot be read")
        path = os.path.abspath(path)
        if not os.path.isfile(path):
            raise CannotRun(f"service {service}: SQLite database {path} does not exist")
        return f"jdbc:sqlite:{path}", props
    host = url.host or "localhost"
    port = f":{url.port}" if url.port else ""
    if url.username:
        props["user"] = url.username
    if url.password:
        props["password"] = str(url.password)
    jdbc = f"jdbc:postgresql://{host}{port}/{url.database or ''}"
    query = {k: v for k, v in url.query.items() if isinstance(v, str)}
    if query:
        jdbc += "?" + "&".join(f"{k}={v}" for k, v in query.items())
    return jdbc, props
