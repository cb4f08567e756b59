"""The running result of incremental runs: the inputs read so far, and where reading stopped.

A state directory holds, per input, one Parquet folder per run and ``watermark.json``, the marks
past which the next run reads. A run appends its rows as the next folder, then moves the
watermark (written last, atomically: a run that dies half-way is redone). The checks then run
over everything kept, so an incremental result equals a full run over the same data (tested).
Overlaps are deliberate and removed here (:class:`State` says which and why).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from txbroker_reconcile.errors import CannotRun
from txbroker_reconcile.sources import Watermark

__all__ = ["LOOKBACK_MS", "TABLES", "State", "latest", "log_rows"]

LOOKBACK_MS: Final = 15 * 60 * 1000
TABLES: Final = ("log", "local_tx", "outbox", "inbox")
_FILE: Final = "watermark.json"
_VERSION: Final = 1


@dataclass
class _Marks:
    run: int = 0
    # [<broker group>/]<segment file name> -> resume position
    log: dict[str, int] = field(default_factory=dict)
    services: dict[str, dict[str, int | None]] = field(default_factory=dict)


class State:
    """The state directory: per input, one Parquet folder per run (``log/run=0003/``, ...) and
    ``watermark.json``: per segment file the byte position after its last whole record (keyed
    ``<group>/<segment>`` for a broker group's log: every group's log has a segment
    ``00000000000000000000``, so the bare file name of a single broker's log would collide), per
    service the newest ``created_at`` / ``processed_at`` seen and the outbox id from which rows are
    read again (rows not yet published change later). Re-reading the kept Parquet is far cheaper
    than the sources.

    Overlaps are deliberate and removed here: table rows are re-read from ``LOOKBACK_MS`` before
    their mark, because a transaction that started before the mark may commit after it (its
    ``created_at`` is its start); the newest segment's damaged tail may be read again once the
    broker has finished writing it.
    """

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.marks = _Marks()
        path = directory / _FILE
        if path.exists():
            try:
                raw = json.loads(path.read_text())
                if raw.get("version") != _VERSION:
                    raise ValueError(f"version {raw.get('version')!r}, expected {_VERSION}")
                self.marks = _Marks(raw["run"], raw["log"], raw["services"])
            except (ValueError, KeyError, TypeError) as e:
                raise CannotRun(
                    f"state {path} is not a reconciliation watermark ({e}); "
                    "remove the directory to start over"
                ) from e
        self.run = self.marks.run + 1

    # --- reading marks ---------------------------------------------------------------------

    def log_start(self, group: str = "") -> dict[str, int]:
        """Where to resume reading ``group``'s log: segment file name -> byte position."""
        prefix = f"{group}/" if group else ""
        return {
            key.removeprefix(prefix): pos
            for key, pos in self.marks.log.items()
            if ("/" in key) == bool(group) and key.startswith(prefix)
        }

    def log_groups(self) -> set[str]:
        """The broker groups whose logs this state has read records of ("" for one broker's)."""
        return {key.rpartition("/")[0] for key in self.marks.log}

    def watermark(self, service: str) -> Watermark:
        m = self.marks.services.get(service, {})

        def back(ms: int | None) -> int | None:
            return None if ms is None else ms - LOOKBACK_MS

        return Watermark(
            back(m.get("local_tx_ms")), back(m.get("inbox_ms")), m.get("outbox_from_id")
        )

    # --- writing a run ---------------------------------------------------------------------

    def folder(self, table: str) -> Path:
        return self.dir / table / f"run={self.run:06d}"

    def append(self, table: str, df: DataFrame) -> int:
        """Write ``df`` as this run's folder of ``table``; return its row count (read back
        from the written files, so the source is read once)."""
        path = self.folder(table)
        df.write.mode("overwrite").parquet(str(path))
        return df.sparkSession.read.parquet(str(path)).count()

    def advance_log(self, spark: SparkSession) -> None:
        """Move each segment's mark past the last whole record this run read."""
        rows = (
            spark.read.parquet(str(self.folder("log")))
            .where(F.col("corrupt").isNull())
            .groupBy("broker_group", "segment")
            .agg(F.max(F.col("position") + F.col("size")).alias("end"))
            .collect()
        )
        for r in rows:
            group = r["broker_group"]
            key = f"{group}/{r['segment']}" if group else r["segment"]
            self.marks.log[key] = int(r["end"]) - int(r["segment"])

    def advance_service(self, spark: SparkSession, service: str) -> None:
        def newest(table: str, column: str, agg: Any = F.max) -> Any:
            path = self.folder(table)
            if not path.exists():
                return None
            return _scalar(
                spark.read.parquet(str(path)).where(F.col("service") == service).agg(agg(column))
            )

        old = self.marks.services.get(service, {})
        unpublished = _scalar(
            spark.read.parquet(str(self.folder("outbox")))
            .where((F.col("service") == service) & F.col("published_ms").isNull())
            .agg(F.min("id"))
        )
        last_id = newest("outbox", "id")
        self.marks.services[service] = {
            "local_tx_ms": _max(old.get("local_tx_ms"), newest("local_tx", "created_ms")),
            "inbox_ms": _max(old.get("inbox_ms"), newest("inbox", "processed_ms")),
            # Next time, read from the oldest row still unpublished, else past the newest.
            "outbox_from_id": unpublished
            if unpublished is not None
            else (last_id + 1 if last_id is not None else old.get("outbox_from_id")),
        }

    def commit(self) -> None:
        self.marks.run = self.run
        payload = {"version": _VERSION, **asdict(self.marks)}
        tmp = self.dir / (_FILE + ".tmp")
        tmp.write_text(json.dumps(payload, indent=2, sort_keys=True))
        os.replace(tmp, self.dir / _FILE)

    # --- reading everything kept -----------------------------------------------------------

    def table(self, spark: SparkSession, name: str) -> DataFrame | None:
        path = self.dir / name
        if not path.exists() or not any(path.glob("run=*")):
            return None
        # Runs of an earlier version may lack a column added since (the log's tx_state).
        return spark.read.option("mergeSchema", "true").parquet(str(path))

    def runs(self, name: str) -> int:
        """How many runs' folders ``name`` holds."""
        path = self.dir / name
        return sum(1 for _ in path.glob("run=*")) if path.exists() else 0

    def discard(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)


def latest(df: DataFrame, keys: list[str]) -> DataFrame:
    """One row per key: the one from the newest run (rows read again replace older reads)."""
    w = Window.partitionBy(*keys).orderBy(F.col("run").desc())
    return df.withColumn("_n", F.row_number().over(w)).where(F.col("_n") == 1).drop("_n", "run")


def log_rows(df: DataFrame) -> DataFrame:
    """The kept log without repeats: a damaged position read again (the newest segment's tail)
    counts once, and not at all once a later run read a whole record there. A position is
    a place in one broker group's log (each group's log starts at 0)."""
    at = ["broker_group", "position"]
    df = df.drop("run")
    valid = df.where(F.col("corrupt").isNull())
    damaged = df.where(F.col("corrupt").isNotNull()).dropDuplicates(at)
    healed = valid.join(F.broadcast(damaged.select(*at)), at, "left_semi")
    return valid.unionByName(damaged.join(healed.select(*at), at, "left_anti"))


def _scalar(df: DataFrame) -> int | None:
    row = df.first()
    value = row[0] if row is not None else None
    return None if value is None else int(value)


def _max(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)
