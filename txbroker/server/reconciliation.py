"""The newest reconciliation summary, as `txbroker reconcile` leaves it: read by the console and
meant for /metrics too.

The job writes ``summary.json`` into its ``--out`` folder atomically; its file name and format
version are repeated here because the broker does not import the reconciliation (a test keeps
the two equal). The newest summary of the folder and its direct subfolders wins. Never raises
for what a folder may hold: no summary yet is ``None``; an unreadable or foreign file is a
summary with ``problem`` set, so a page can say what is wrong.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

__all__ = ["SUMMARY_FILE", "SUMMARY_VERSION", "ReconcileSummary", "latest_summary"]

SUMMARY_FILE: Final = "summary.json"
SUMMARY_VERSION: Final = 1
# A summary holds bounded tables (examples per reason, histogram buckets, throughput slots):
# a few hundred KiB for large runs. Anything far bigger is not one of ours.
SUMMARY_BYTES_MAX: Final = 16 * 1024 * 1024
# Subfolders looked into: a year of daily report folders, and a bound on one directory scan.
SUBFOLDERS_MAX: Final = 1000


@dataclass(frozen=True, slots=True)
class ReconcileSummary:
    path: Path
    modified_ms: int
    document: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None  # why the document could not be used (then it is empty)

    @property
    def clean(self) -> bool | None:
        value = self.document.get("clean")
        return value if isinstance(value, bool) else None

    @property
    def as_of_ms(self) -> int | None:
        value = self.document.get("as_of_ms")
        return value if isinstance(value, int) else None

    @property
    def anomalies(self) -> dict[str, int]:
        raw = self.document.get("anomalies")
        if not isinstance(raw, dict):
            return {}
        return {str(k): v for k, v in raw.items() if isinstance(v, int)}


def _candidates(reports: Path) -> list[Path]:
    found = [reports / SUMMARY_FILE]
    try:
        with os.scandir(reports) as entries:
            for i, entry in enumerate(entries):
                if i >= SUBFOLDERS_MAX:
                    break
                if entry.is_dir(follow_symlinks=False):
                    found.append(Path(entry.path) / SUMMARY_FILE)
    except OSError:
        pass  # no such folder (yet): nothing to show
    return found


def latest_summary(reports: Path) -> ReconcileSummary | None:
    """The most recently written summary in ``reports`` or a direct subfolder; None if none.

    An operator points the broker at the job's ``--out`` folder, or at a parent of dated ones
    (``--out reports/2026-11-25``)::

        >>> latest_summary(Path("reports"))          # doctest: +SKIP
        ReconcileSummary(path=PosixPath('reports/summary.json'), ...)
    """
    newest: tuple[int, Path] | None = None
    for path in _candidates(reports):
        try:
            mtime = path.stat().st_mtime_ns
        except OSError:
            continue
        if newest is None or mtime > newest[0]:
            newest = (mtime, path)
    if newest is None:
        return None
    mtime, path = newest
    modified_ms = mtime // 1_000_000
    try:
        if path.stat().st_size > SUMMARY_BYTES_MAX:
            return ReconcileSummary(path, modified_ms, problem="larger than a summary can be")
        document = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        return ReconcileSummary(path, modified_ms, problem=f"cannot be read: {e}")
    if not isinstance(document, dict) or document.get("version") != SUMMARY_VERSION:
        version = document.get("version") if isinstance(document, dict) else None
        problem = f"format version {version!r}, this broker reads {SUMMARY_VERSION}"
        return ReconcileSummary(path, modified_ms, problem=problem)
    return ReconcileSummary(path, modified_ms, document)
