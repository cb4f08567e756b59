"""What broker groups keep in etcd, and its layout, written once: the key of each thing under
``/txb/`` and the JSON of its value (docs/cluster.md, "What is in etcd").

- ``/txb/brokers/<group>/<broker>``: a :class:`BrokerInfo`, under the broker's registration lease;
- ``/txb/topics/<topic>``: a :class:`TopicRoute`, which of the topic's queues each group holds;
- ``/txb/groups/<group>/master``: the election key of a group whose brokers run ``--role auto``;
- ``/txb/groups/<group>/members/<broker>``: a :class:`BrokerInfo` as the broker first registered,
  with no lease: the group's membership, which an election's quorum counts (until an operator
  forgets a decommissioned member, ``txbroker cluster forget``).

A topic's queues are numbered globally and split over groups in blocks (:class:`TopicRoute`),
so one key stays on one queue of one group.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from txbroker.cluster.coordination import Coordinator
from txbroker.errors import CoordinationError, InvalidArgument, TopicExists

__all__ = [
    "BROKERS_PREFIX",
    "GROUPS_PREFIX",
    "ROOT",
    "TOPICS_PREFIX",
    "BrokerInfo",
    "GroupShare",
    "Role",
    "TopicRoute",
    "broker_key",
    "choose_masters",
    "delete_route",
    "election_group",
    "forget_member",
    "is_former_master",
    "master_key",
    "member_key",
    "members_prefix",
    "read_route",
    "replace_route",
    "spread_queues",
    "topic_key",
    "write_route",
]

ROOT: Final = "/txb/"
BROKERS_PREFIX: Final = "/txb/brokers/"
TOPICS_PREFIX: Final = "/txb/topics/"
GROUPS_PREFIX: Final = "/txb/groups/"


def _name(what: str, name: str) -> str:
    # A '/' would move the key to another level of the layout; empty would name the prefix.
    if not name or "/" in name or name.strip() != name:
        raise InvalidArgument(f"{what} name {name!r}: not empty, no '/', no surrounding spaces")
    return name


def broker_key(group: str, broker_id: str) -> str:
    return f"{BROKERS_PREFIX}{_name('group', group)}/{_name('broker', broker_id)}"


def master_key(group: str) -> str:
    return f"{GROUPS_PREFIX}{_name('group', group)}/master"


def election_group(key: str) -> str | None:
    """The group whose election key ``key`` is (:func:`master_key`), or None for another key."""
    group, _, leaf = key.removeprefix(GROUPS_PREFIX).partition("/")
    return group if key.startswith(GROUPS_PREFIX) and leaf == "master" else None


def members_prefix(group: str) -> str:
    return f"{GROUPS_PREFIX}{_name('group', group)}/members/"


def member_key(group: str, broker_id: str) -> str:
    return f"{members_prefix(group)}{_name('broker', broker_id)}"


def topic_key(topic: str) -> str:
    return f"{TOPICS_PREFIX}{_name('topic', topic)}"


class Role(enum.Enum):
    MASTER = "master"
    SLAVE = "slave"


def _loads(what: str, raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CoordinationError(f"{what}: not JSON: {e}") from e
    if not isinstance(data, dict):
        raise CoordinationError(f"{what}: expected a JSON object, got {type(data).__name__}")
    return data


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    """One broker's registration: who it is, where it listens, what it is now."""

    group: str
    broker_id: str
    role: Role
    address: str  # txb://host:port: clients' TCP address
    http: str  # http://host:port: the admin API
    flushed_offset: int = 0  # commit-log bytes durable on this broker, updated periodically
    epoch: int = 0  # as master elected with --role auto: the election key's create revision
    # The last master epoch its log holds writes of (server/epochs.py): with the flushed
    # offset, what ranks candidates for the election (the most recent history wins).
    log_epoch: int = 0
    # An etcd revision read just before the offsets above were (0: not read): everything
    # etcd had done by then, a master key's deletion included, happened before this report's
    # offsets were taken. What makes a report fresh for an election (Membership.eligible).
    seen_revision: int = 0

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "group": self.group,
                "broker": self.broker_id,
                "role": self.role.value,
                "address": self.address,
                "http": self.http,
                "flushed_offset": self.flushed_offset,
                "epoch": self.epoch,
                "log_epoch": self.log_epoch,
                "seen_revision": self.seen_revision,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> BrokerInfo:
        d = _loads("broker registration", raw)
        try:
            return cls(
                str(d["group"]),
                str(d["broker"]),
                Role(d["role"]),
                str(d["address"]),
                str(d.get("http", "")),
                int(d.get("flushed_offset", 0)),
                int(d.get("epoch", 0)),
                int(d.get("log_epoch", 0)),
                int(d.get("seen_revision", 0)),
            )
        except (KeyError, ValueError, TypeError) as e:
            raise CoordinationError(f"broker registration {d!r}: {e!r}") from e


@dataclass(frozen=True, slots=True)
class GroupShare:
    """The queues of a topic one group holds: global queue ids, in the group's local order
    (local queue ``i`` is ``queues[i]``)."""

    group: str
    queues: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class TopicRoute:
    """Which of a topic's queues each group holds; kept with no lease (``txbroker topic create
    ... --groups``).

    A topic's queues are numbered globally, ``0 .. queues-1``, and split over groups in blocks
    (:func:`spread_queues`): with 8 queues on g1 and g2, g1 holds 0-3 and g2 4-7. Each group holds
    the topic under the same name with its share of queues, numbered locally: local queue ``i`` of
    a group is the ``i``-th global queue of its share. A client picks a global queue as a single
    broker does (a key's hash, or round-robin, over the topic's total queues) and sends to the
    group owning it with the local queue id.
    """

    topic: str
    queues: int  # over all groups
    shares: tuple[GroupShare, ...]

    def __post_init__(self) -> None:
        held = sorted(q for s in self.shares for q in s.queues)
        if held != list(range(self.queues)):
            raise InvalidArgument(
                f"route of {self.topic!r}: the groups must hold queues 0..{self.queues - 1} "
                f"once each, they hold {held}"
            )
        groups = [s.group for s in self.shares]
        if len(set(groups)) != len(groups) or any(not s.queues for s in self.shares):
            raise InvalidArgument(f"route of {self.topic!r}: each group once, with a queue")

    def locate(self, queue: int) -> tuple[str, int]:
        """The group holding global ``queue``, and the queue's id there."""
        for share in self.shares:
            if queue in share.queues:
                return share.group, share.queues.index(queue)
        raise InvalidArgument(f"topic {self.topic!r} has no queue {queue}")

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "topic": self.topic,
                "queues": self.queues,
                "groups": [{"group": s.group, "queues": list(s.queues)} for s in self.shares],
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> TopicRoute:
        d = _loads("topic route", raw)
        try:
            shares = tuple(
                GroupShare(str(g["group"]), tuple(int(q) for q in g["queues"])) for g in d["groups"]
            )
            return cls(str(d["topic"]), int(d["queues"]), shares)
        except (KeyError, ValueError, TypeError, InvalidArgument) as e:
            raise CoordinationError(f"topic route {d!r}: {e}") from e


def spread_queues(topic: str, queues: int, groups: Iterable[str]) -> TopicRoute:
    """``queues`` split over ``groups`` in contiguous blocks, the first groups taking one more
    when it does not divide: 8 over g1, g2 is g1: 0-3, g2: 4-7; 5 over three is 0-1, 2-3, 4."""
    names = [_name("group", g) for g in groups]
    if not names:
        raise InvalidArgument("a route needs at least one group")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"a group is named twice in {names}")
    if queues < len(names):
        raise InvalidArgument(f"{queues} queues cannot spread over {len(names)} groups")
    each, extra = divmod(queues, len(names))
    shares, start = [], 0
    for i, name in enumerate(names):
        n = each + (1 if i < extra else 0)
        shares.append(GroupShare(name, tuple(range(start, start + n))))
        start += n
    return TopicRoute(_name("topic", topic), queues, tuple(shares))


async def read_route(coordinator: Coordinator, topic: str) -> TopicRoute | None:
    kv = await coordinator.get(topic_key(topic))
    return None if kv is None else TopicRoute.from_json(kv.value)


async def write_route(coordinator: Coordinator, route: TopicRoute) -> bool:
    """Write ``route`` if the topic has none: True when written, False when the same route was
    there already (creating a topic twice is a no-op); ``TopicExists`` when another is."""
    key = topic_key(route.topic)
    if await coordinator.create(key, route.to_json()) is not None:
        return True
    existing = await read_route(coordinator, route.topic)
    if existing == route:
        return False
    raise TopicExists(
        f"topic {route.topic!r} is routed otherwise already: "
        f"{_describe(existing) if existing else 'deleted meanwhile'}"
    )


async def replace_route(coordinator: Coordinator, route: TopicRoute) -> int:
    """Put ``route`` whatever was there (moving queues between groups, adding groups); clients
    pick it up on their next refresh. Returns the write's revision."""
    return await coordinator.put(topic_key(route.topic), route.to_json())


async def delete_route(coordinator: Coordinator, topic: str) -> bool:
    """Remove ``topic``'s route (after the topic was deleted on its groups): NameServers answer
    NO_ROUTE for it from then on. Whether there was one."""
    return await coordinator.delete(topic_key(topic))


async def forget_member(coordinator: Coordinator, group: str, broker_id: str) -> None:
    """Remove a decommissioned broker from ``group``'s members, so elections stop waiting for
    its reports (``txbroker cluster forget``). Refused while it is registered (running): it
    would count again at its next start anyway, and forgetting a live member weakens the
    quorum that keeps acknowledged writes."""
    if await coordinator.get(broker_key(group, broker_id)) is not None:
        raise InvalidArgument(
            f"broker {broker_id} of group {group} is registered (running): stop it first"
        )
    if not await coordinator.delete(member_key(group, broker_id)):
        raise InvalidArgument(f"broker {broker_id} is not a member of group {group}")


def _describe(route: TopicRoute) -> str:
    return ", ".join(f"{s.group}: {list(s.queues)}" for s in route.shares)


def is_former_master(broker: BrokerInfo, elections: Mapping[str, int]) -> bool:
    """Whether ``broker`` is registered as an elected master (epoch > 0) whose term is over:
    its group's election key (``elections``: group -> the key's create revision, the current
    term's epoch) is gone or names a later term. A killed master's registration lingers until
    its lease ends (10 s), well after its successor is elected (3 s)."""
    return (
        broker.role is Role.MASTER
        and broker.epoch > 0
        and elections.get(broker.group) != broker.epoch
    )


def choose_masters(
    brokers: Iterable[BrokerInfo], elections: Mapping[str, int] | None = None
) -> Mapping[str, BrokerInfo]:
    """Each group's master among its registered brokers: the one registered as master (of the
    highest epoch, should an old master's registration linger until its lease ends). With
    ``elections`` (see :func:`is_former_master`), a former master is none, even alone."""
    masters: dict[str, BrokerInfo] = {}
    for b in brokers:
        if b.role is not Role.MASTER:
            continue
        if elections is not None and is_former_master(b, elections):
            continue
        current = masters.get(b.group)
        if current is None or (b.epoch, b.broker_id) > (current.epoch, current.broker_id):
            masters[b.group] = b
    return masters
