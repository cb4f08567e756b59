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
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.logsource import FORMAT, SPARK_SCHEMA
from txbroker_reconcile.options import JobOptions, LogSpec
from txbroker_reconcile.segments import find_segments, gone_in
from txbroker_reconcile.sources import ServiceDb
from txbroker_reconcile.state import State

__all__ = ["Extracted", "check_log", "extract", "keep_log", "read_effects"]

Say = Callable[[str], None]


@dataclass
class Extracted:
    log_records: int = 0
    log_segments: int = 0
    # broker group -> what was read of its log: path, segments, read_this_run
    log_groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows: dict[str, dict[str, int]] = field(default_factory=dict)  # service -> table -> rows
    dialects: dict[str, str] = field(default_factory=dict)  # service -> postgresql | sqlite
    # service -> rows whose time has whole seconds (SQLite tables not yet upgraded)
    whole_second_rows: dict[str, int] = field(default_factory=dict)


def _is_export(path: Path) -> bool:
    return path.is_dir() and any(path.glob("*.parquet")) and not (path / "commitlog").exists()


def _read_log(spark: SparkSession, spec: LogSpec, state: State) -> tuple[DataFrame, int]:
    """One broker group's log, past its marks, its rows tagged with the group: positions and
    segment names are per log (each group's starts at 0), so the group is part of a record's
    key wherever the log is keyed."""
    path, start = spec.path, state.log_start(spec.group)
    if _is_export(path):
        df = spark.read.schema(SPARK_SCHEMA).parquet(str(path))
        # The export is read whole each time: keep only what lies past the marks, as the
        # segment reader does, so an incremental run does not count a record twice.
        for segment, pos in start.items():
            seen = (F.col("segment") == segment) & (F.col("position") < int(segment) + pos)
            df = df.where(~seen)
        segments = len(list(path.glob("*.parquet")))
    else:
        # Listed once: the files counted are the files read.
        listing = [[seg.path, seg.newest] for seg in find_segments(path)]
        segments = len(listing)
        df = (
            spark.read.format(FORMAT)
            .option("start", json.dumps(start))
            .option("segments", json.dumps(listing))
            .load(str(path))
        )
    return df.withColumn("broker_group", F.lit(spec.group)), segments


def keep_log(state: State, log: DataFrame) -> int:
    """Append what was read of the logs to the state (the read happens here); a segment that
    retention deleted since it was listed is a :class:`CannotRun`, not a crash."""
    try:
        return state.append("log", log)
    except Exception as e:  # an executor's failure reaches the driver wrapped by Spark
        gone = gone_in(e)
        if gone is None:
            raise
        raise gone from None


def extract(spark: SparkSession, opts: JobOptions, state: State, say: Say) -> Extracted:
    out = Extracted()
    run = F.lit(state.run)
    if opts.log_specs:
        logs = []
        for spec in opts.log_specs:
            say(f"reading the commit log in {spec.shown()}")
            log, segments = _read_log(spark, spec, state)
            logs.append(log)
            out.log_segments += segments
            out.log_groups[spec.group] = {"path": str(spec.path), "segments": segments}
        out.log_records = keep_log(
            state, reduce(DataFrame.unionByName, logs).withColumn("run", run)
        )
        state.advance_log(spark)
        if len(out.log_groups) == 1:  # one log: what was read is its count, no job to run
            read = {opts.log_specs[0].group: out.log_records}
        else:
            read = _counts(spark.read.parquet(str(state.folder("log"))), "broker_group")
        for group, info in out.log_groups.items():
            info["read_this_run"] = read.get(group, 0)
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
        t: _counts(spark.read.parquet(str(state.folder(t))), "service")
        for t in parts
        if state.folder(t).exists()
    }
    for db in dbs:
        name = db.spec.name
        out.rows[name] = {t: counts.get(t, {}).get(name, 0) for t in parts}
        out.dialects[name] = db.dialect
        out.whole_second_rows[name] = db.whole_second_rows()
        state.advance_service(spark, name)
        say(
            f"read service {name}: "
            + ", ".join(f"{n:,} {t} rows" for t, n in out.rows[name].items())
        )
    return out


def _counts(df: DataFrame, key: str) -> dict[str, int]:
    return {r[key]: r["count"] for r in df.groupBy(key).count().collect()}


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


def check_log(specs: tuple[LogSpec, ...]) -> None:
    for spec in specs:
        if not spec.path.exists():
            raise CannotRun(f"--log {spec.shown()}: no such directory")
