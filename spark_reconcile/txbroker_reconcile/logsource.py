"""The commit log as a Spark table: a Python data source, ``spark.read.format("txbroker-log")``.

One partition per segment file, read in the executors (the driver only lists file names), each
yielding Arrow batches from :mod:`.segments`. Options are in :class:`LogDataSource`. Executors
must see the same path (a shared disk); when they cannot, export the log to Parquet with
``txbroker log export`` and give the job that instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from txbroker.errors import InvalidArgument
from txbroker_reconcile.segments import LOG_SCHEMA, Segment, SegmentScan, find_segments

__all__ = ["FORMAT", "LogDataSource", "SPARK_SCHEMA"]

FORMAT = "txbroker-log"
SPARK_SCHEMA: StructType = from_arrow_schema(LOG_SCHEMA)


class _SegmentPartition(InputPartition):
    def __init__(self, segment: Segment) -> None:
        super().__init__(segment)
        self.segment = segment


class LogDataSource(DataSource):
    """The ``txbroker-log`` format. Options:

    - ``path``: the broker's data directory or its ``commitlog/`` folder (required);
    - ``start``: JSON ``{"<segment file name>": <byte position>}``, where an incremental run
      resumes: a named file is read from its position (skipped when that is at or past its
      size), an unnamed one from its start;
    - ``segments``: JSON ``[[<segment file path>, <newest>], ...]``, the files to read as the
      caller listed them (:func:`find_segments`), so what it counted is what is read; by
      default the files found in ``path`` when the read is planned.
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        path = self.options.get("path")
        if not path:
            raise InvalidArgument(f'{FORMAT}: give the log directory: .load("<data dir>")')
        start = json.loads(self.options.get("start") or "{}")
        listed = self.options.get("segments")
        if listed:
            segments = [
                Segment(p, int(os.path.basename(p)), 0, new) for p, new in json.loads(listed)
            ]
        else:
            segments = find_segments(path)
        return _LogReader(segments, start)


class _LogReader(DataSourceReader):
    def __init__(self, segments: list[Segment], start: dict[str, int]) -> None:
        self.segments = [
            Segment(s.path, s.base, int(start.get(os.path.basename(s.path), 0)), s.newest)
            for s in segments
        ]

    def partitions(self) -> Sequence[InputPartition]:
        return [_SegmentPartition(s) for s in self.segments]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, _SegmentPartition)
        yield from SegmentScan(partition.segment)
