"""What `txbroker cluster status` shows, read from etcd in one pass: every registered broker with
its role, flushed offset and lease; each group's master and how far each slave trails it; the
election key's holder where a group elects; the topic routes (docs/cluster.md).

The offsets are what each broker last registered (rewritten about every second), so a slave's
lag is the bytes of commit log between its flushed offset and its master's at their last
registrations: a figure to watch trend, exact only when traffic stops. An elected master
whose term is over (its group elected another, or none holds the election) shows as a
"former master" until its registration goes: a group shows one master from its successor's
election on.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Final

from txbroker.cluster.coordination import Coordinator
from txbroker.cluster.routes import (
    BROKERS_PREFIX,
    GROUPS_PREFIX,
    TOPICS_PREFIX,
    BrokerInfo,
    Role,
    TopicRoute,
    choose_masters,
    election_group,
    is_former_master,
)

__all__ = [
    "FORMER_MASTER",
    "BrokerStatus",
    "ClusterStatus",
    "GroupStatus",
    "queue_span",
    "read_status",
]


# The role shown for an elected master whose term is over while its registration lingers
# (``routes.is_former_master``): a killed master's, until its lease ends.
FORMER_MASTER: Final = "former master"


def queue_span(queues: tuple[int, ...]) -> str:
    """A group's share of a topic's queues as shown: ``0-3`` for a block, else the list."""
    if len(queues) > 1 and list(queues) == list(range(queues[0], queues[-1] + 1)):
        return f"{queues[0]}-{queues[-1]}"
    return ",".join(map(str, queues))


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    group: str
    broker: str
    role: str
    address: str
    http: str
    flushed_offset: int
    lag_bytes: int | None  # behind its group's master; 0 for the master; None without a master
    epoch: int
    lease: str  # the registration's etcd lease, hex, as `etcdctl lease timetolive` takes it


@dataclass(frozen=True, slots=True)
class GroupStatus:
    group: str
    master: str | None  # the broker registered as master (highest epoch), if any
    elected: str | None  # the election key's holder, for groups whose brokers run --role auto
    election_lease: str | None
    brokers: int
    max_lag_bytes: int | None  # the slowest slave's lag; None without a slave or a master


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    revision: int  # etcd's revision the brokers were read at
    groups: tuple[GroupStatus, ...]
    brokers: tuple[BrokerStatus, ...]
    topics: tuple[TopicRoute, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "revision": self.revision,
            "groups": [asdict(g) for g in self.groups],
            "brokers": [asdict(b) for b in self.brokers],
            "topics": [
                {
                    "topic": t.topic,
                    "queues": t.queues,
                    "groups": [{"group": s.group, "queues": list(s.queues)} for s in t.shares],
                }
                for t in self.topics
            ],
        }


async def read_status(coordinator: Coordinator) -> ClusterStatus:
    registered = await coordinator.list_prefix(BROKERS_PREFIX)
    elections = await coordinator.list_prefix(GROUPS_PREFIX)
    routes = await coordinator.list_prefix(TOPICS_PREFIX)
    infos = [(BrokerInfo.from_json(kv.value), kv.lease_id) for kv in registered.items]
    elected: dict[str, tuple[str, str]] = {}
    terms: dict[str, int] = {}  # group -> the current term's epoch
    for kv in elections.items:
        if (group := election_group(kv.key)) is not None:
            elected[group] = (BrokerInfo.from_json(kv.value).broker_id, f"{kv.lease_id:x}")
            terms[group] = kv.create_revision
    masters = choose_masters((info for info, _ in infos), terms)
    brokers = []
    for info, lease_id in sorted(infos, key=lambda x: (x[0].group, x[0].broker_id)):
        master = masters.get(info.group)
        lag = None if master is None else max(master.flushed_offset - info.flushed_offset, 0)
        brokers.append(
            BrokerStatus(
                info.group,
                info.broker_id,
                FORMER_MASTER if is_former_master(info, terms) else info.role.value,
                info.address,
                info.http,
                info.flushed_offset,
                0 if master is info else lag,
                info.epoch,
                f"{lease_id:x}",
            )
        )
    groups = []
    for name in sorted({b.group for b in brokers} | set(elected)):
        mine = [b for b in brokers if b.group == name]
        lags = [b.lag_bytes for b in mine if b.role == Role.SLAVE.value and b.lag_bytes is not None]
        master = masters.get(name)
        holder, election_lease = elected.get(name, (None, None))
        groups.append(
            GroupStatus(
                name,
                master.broker_id if master is not None else None,
                holder,
                election_lease,
                len(mine),
                max(lags) if lags else None,
            )
        )
    topics = tuple(sorted((TopicRoute.from_json(kv.value) for kv in routes.items), key=_topic))
    return ClusterStatus(registered.revision, tuple(groups), tuple(brokers), topics)


def _topic(route: TopicRoute) -> str:
    return route.topic
