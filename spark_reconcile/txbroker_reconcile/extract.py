"""Reading what is new from the sources into the state: the log first, then the tables.

The order matters. A message visible in the log was committed locally before the broker made
it visible, so the tables, read after the log, hold its local transaction: no false phantom.
A local transaction committed after the log was read has no message yet: the grace period
keeps it from being called lost.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import reduce
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.logsource import FORMAT, SPARK_SCHEMA
from txbroker_reconcile.options import JobOptions
from txbroker_reconcile.segments import find_segments
from txbroker_reconcile.sources import ServiceDb
from txbroker_reconcile.state import State

__all__ = ["Extracted", "check_log", "extract", "read_effects"]

Say = Callable[[str], None]


@dataclass
class Extracted:
    log_records: int = 0
    log_segments: int = 0
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # service -> table -> rows
    dialects: dict[str, str] = field(default_factory=dict)  # service -> postgresql | sqlite


def _is_export(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*.parquet")) and not (path / "commitlog").exists()


def _read_log(spark: SparkSession, path: Path, state: State) -> tuple[DataFrame, int]:
    if _is_export(path):
        df = spark.read.schema(SPARK_SCHEMA).parquet(str(path))
        # The export is read whole each time: keep only what lies past the marks, as the
        # segment reader does, so an incremental run does not count a record twice.
        for segment, start in state.log_start().items():
            seen = (F.col("segment") == segment) & (F.col("position") < int(segment) + start)
            df = df.where(~seen)
        return df, len(list(path.glob("*.parquet")))
    segments = find_segments(path)
    df = spark.read.format(FORMAT).option("start", json.dumps(state.log_start())).load(str(path))
    return df, len(segments)


def extract(spark: SparkSession, opts: JobOptions, state: State, say: Say) -> Extracted:
    out = Extracted()
    run = F.lit(state.run)
    if opts.log is not None:
        say(f"reading the commit log in {opts.log}")
        log, out.log_segments = _read_log(spark, opts.log, state)
        out.log_records = state.append("log", log.withColumn("run", run))
        state.advance_log(spark)
        say(f"read {out.log_records:,} log records from {out.log_segments} segment file(s)")
    dbs = [ServiceDb(spark, s) for s in opts.services]
    parts: dict[str, list[DataFrame]] = {"local_tx": [], "outbox": [], "inbox": []}
    for db in dbs:
        wm = state.watermark(db.spec.name)
        say(f"reading service {db.spec.name} ({db.shown})")
        tag = [F.lit(db.spec.name).alias("service"), run.alias("run")]
        parts["local_tx"].append(db.local_tx(wm.local_tx_ms).select("*", *tag))
        parts["outbox"].append(
            db.outbox(wm.outbox_from_id).select(
                "*", F.lit(db.spec.outbox_namespace).alias("namespace"), *tag
            )
        )
        parts["inbox"].append(db.inbox(wm.inbox_ms).select("*", *tag))
    for table, dfs in parts.items():
        if not dfs:
            continue
        state.append(table, reduce(DataFrame.unionByName, dfs))
    counts = {
        t: {
            r["service"]: r["count"]
            for r in spark.read.parquet(str(state.folder(t))).groupBy("service").count().collect()
        }
        for t in parts
        if state.folder(t).exists()
    }
    for db in dbs:
        name = db.spec.name
        out.rows[name] = {t: counts.get(t, {}).get(name, 0) for t in parts}
        out.dialects[name] = db.dialect
        state.advance_service(spark, name)
        say(
            f"read service {name}: "
            + ", ".join(f"{n:,} {t} rows" for t, n in out.rows[name].items())
        )
    return out


def read_effects(spark: SparkSession, opts: JobOptions) -> DataFrame:
    """Repeated effect values per service and column, counted in each database."""
    frames = []
    for spec in opts.services:
        db = ServiceDb(spark, spec)
        for table, column in spec.effects:
            frames.append(
                db.repeated_effects(table, column).select(
                    F.lit(spec.name).alias("service"),
                    F.lit(f"{table}.{column}").alias("effect"),
                    F.col("value").cast("string"),
                    F.col("copies").cast("long"),
                )
            )
    if frames:
        return reduce(DataFrame.unionByName, frames)
    return spark.createDataFrame([], "service string, effect string, value string, copies long")


def check_log(path: Path | None) -> None:
    if path is not None and not path.exists():
        raise CannotRun(f"--log {path}: no such directory")
