"""Why an effect was lost or applied twice, told from the logs as settled: where its message is
(broker group, topic, queue, offset, when, which master stored it, in which round) and where
its consumer group's committed offset stands for that queue on every broker. One line per
effect, so a CI log is enough to start from."""

from __future__ import annotations

import bisect
import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from txbroker.server.groups import OFFSETS_FILE
from txbroker.server.replication.epochs import EpochHistory
from txbroker.store.commitlog import read_log_files

__all__ = ["Broker", "Place", "explain", "find"]

MAX_LINES: Final = 30  # beyond this a CI log learns how many more there were


@dataclass(frozen=True, slots=True)
class Broker:
    """A broker whose files are read: its id, its broker group ("" alone) and data folder."""

    broker_id: str
    group: str
    data_dir: Path


@dataclass(frozen=True, slots=True)
class Place:
    """One message of an effect's reference in a group's log."""

    group: str
    topic: str
    queue_id: int  # the group's own queue id
    queue_offset: int
    physical_offset: int
    store_ms: int
    message_id: str


def find(logs: Mapping[str, Path], refs: set[str], topics: Iterable[str]) -> dict[str, list[Place]]:
    """Where each of ``refs`` (``topic:body``, the body up to a ``|``) is in ``logs`` (broker
    group -> the data folder of the broker whose log counts), for messages of ``topics``."""
    wanted = set(topics)
    found: dict[str, list[Place]] = {r: [] for r in refs}
    for group, data_dir in logs.items():
        for rec in read_log_files(data_dir / "store" / "commitlog"):
            if rec.topic not in wanted:
                continue
            ref = f"{rec.topic}:{rec.body.split(b'|', 1)[0].decode(errors='replace')}"
            if ref in found:
                found[ref].append(
                    Place(
                        group,
                        rec.topic,
                        rec.queue_id,
                        rec.queue_offset,
                        rec.physical_offset,
                        rec.store_timestamp_ms,
                        rec.message_id or "",
                    )
                )
    return found


def explain(
    kind: str,
    found: Mapping[str, list[Place]],
    brokers: list[Broker],
    masters: Mapping[str, str],
    consumer_groups: Mapping[str, str],
    faults_ms: list[int],
    terms: Mapping[tuple[str, int], str],
) -> list[str]:
    """A line per reference: ``kind`` ("lost", "applied twice"), where each of its messages
    is on the group's final master (``masters``: broker group -> broker id), which master
    stored it (the epoch its offset falls in, ``terms``: (group, epoch) -> broker id) and in
    which round (``faults_ms``: when each fault struck), and the committed offset of its
    consumer group (``consumer_groups``: topic -> group) for that queue on every broker."""
    offsets = {b.broker_id: _offsets(b.data_dir) for b in brokers}
    epochs = {b.broker_id: EpochHistory(b.data_dir / "meta").load().entries for b in brokers}
    lines = []
    for ref in sorted(found)[:MAX_LINES]:
        places = found[ref]
        if not places:
            lines.append(f"{kind} {ref}: in no group's log as settled")
            continue
        parts = []
        for p in places:
            master = masters.get(p.group, "")
            group = consumer_groups.get(p.topic, "?")
            where = f"group {p.group}, " if p.group else ""
            committed = ", ".join(
                f"{b.broker_id} {_committed(offsets[b.broker_id], group, p.topic, p.queue_id)}"
                for b in brokers
                if b.group == p.group
            )
            parts.append(
                f"{where}topic {p.topic} queue {p.queue_id} offset {p.queue_offset} on "
                f"{master or 'the broker'} (message {p.message_id}, stored "
                f"{_clock(p.store_ms)} in round {bisect.bisect_left(faults_ms, p.store_ms) + 1}"
                f"{_stored_by(epochs.get(master, []), p, terms)}); {group}'s committed offset "
                f"for that queue: {committed}"
            )
        lines.append(f"{kind} {ref}: " + "; and ".join(parts))
    if len(found) > MAX_LINES:
        lines.append(f"... and {len(found) - MAX_LINES} more {kind}")
    return lines


def _stored_by(
    history: list[tuple[int, int]], p: Place, terms: Mapping[tuple[str, int], str]
) -> str:
    """ ", by master X (epoch N)" from the final master's epoch history, when it has one."""
    starts = [start for _, start in history]
    i = bisect.bisect_right(starts, p.physical_offset) - 1
    if i < 0:
        return ""
    epoch = history[i][0]
    return f", by master {terms.get((p.group, epoch), '?')} (epoch {epoch})"


def _offsets(data_dir: Path) -> dict[str, dict[str, dict[int, int]]]:
    path = data_dir / "meta" / OFFSETS_FILE
    if not path.exists():
        return {}
    try:
        return msgspec.json.decode(path.read_bytes(), type=dict[str, dict[str, dict[int, int]]])
    except msgspec.DecodeError:
        return {}  # being rewritten: the line says "none" for it


def _committed(
    offsets: dict[str, dict[str, dict[int, int]]], group: str, topic: str, queue_id: int
) -> str:
    got = offsets.get(group, {}).get(topic, {}).get(queue_id)
    return "none" if got is None else str(got)


def _clock(ms: int) -> str:
    return datetime.datetime.fromtimestamp(ms / 1000).strftime("%H:%M:%S.%f")[:-3]
