"""The route and registration records (txbroker/cluster/routes.py) and NameServer addresses
(txbroker_sdk/cluster.py): pure code, no etcd."""

from __future__ import annotations

import pytest

from txbroker.cluster.routes import (
    BrokerInfo,
    GroupShare,
    Role,
    TopicRoute,
    broker_key,
    choose_masters,
    spread_queues,
    topic_key,
)
from txbroker.errors import CoordinationError, InvalidArgument
from txbroker.server.config import ServerConfig
from txbroker_sdk.requests import parse_nameserver_url


def test_queues_spread_in_blocks_the_first_groups_taking_the_remainder() -> None:
    route = spread_queues("orders", 8, ["g1", "g2"])
    assert route.shares == (GroupShare("g1", (0, 1, 2, 3)), GroupShare("g2", (4, 5, 6, 7)))
    odd = spread_queues("t", 5, ["a", "b", "c"])
    assert [s.queues for s in odd.shares] == [(0, 1), (2, 3), (4,)]
    assert route.locate(0) == ("g1", 0) and route.locate(5) == ("g2", 1)
    with pytest.raises(InvalidArgument, match="no queue 8"):
        route.locate(8)


@pytest.mark.parametrize(
    ("queues", "groups", "match"),
    [
        (1, ["g1", "g2"], "cannot spread"),
        (4, [], "at least one group"),
        (4, ["g1", "g1"], "named twice"),
        (4, ["g/1"], "no '/'"),
    ],
)
def test_a_spread_that_cannot_be_is_refused(queues: int, groups: list[str], match: str) -> None:
    with pytest.raises(InvalidArgument, match=match):
        spread_queues("orders", queues, groups)


def test_a_route_must_hold_every_queue_once() -> None:
    with pytest.raises(InvalidArgument, match="once each"):
        TopicRoute("t", 4, (GroupShare("g1", (0, 1)), GroupShare("g2", (1, 2, 3))))
    with pytest.raises(InvalidArgument, match="once each"):
        TopicRoute("t", 4, (GroupShare("g1", (0, 1)),))


def test_records_round_trip_through_json_and_bad_json_is_a_coordination_error() -> None:
    route = spread_queues("orders", 8, ["g1", "g2"])
    assert TopicRoute.from_json(route.to_json()) == route
    info = BrokerInfo("g1", "b1", Role.MASTER, "txb://h:1", "http://h:2", 42, 7)
    assert BrokerInfo.from_json(info.to_json()) == info
    for raw in (b"{", b"[]", b'{"topic": "t", "queues": 2, "groups": [{"group": "g"}]}'):
        with pytest.raises(CoordinationError):
            TopicRoute.from_json(raw)
    with pytest.raises(CoordinationError):
        BrokerInfo.from_json(b'{"group": "g1", "broker": "b1", "role": "leader", "address": ""}')


def test_keys_and_the_master_of_each_group() -> None:
    assert broker_key("g1", "b1") == "/txb/brokers/g1/b1"
    assert topic_key("orders") == "/txb/topics/orders"
    old = BrokerInfo("g1", "b1", Role.MASTER, "txb://old:1", "", 0, 5)
    new = BrokerInfo("g1", "b2", Role.MASTER, "txb://new:1", "", 0, 9)
    slave = BrokerInfo("g2", "b3", Role.SLAVE, "txb://s:1", "")
    masters = choose_masters([old, new, slave])
    assert masters == {"g1": new}  # the highest epoch; a group of slaves has none


def test_nameserver_urls() -> None:
    assert parse_nameserver_url("txbns://h1:9878, h2") == ["txb://h1:9878", "txb://h2:9876"]
    for bad in ("txb://h1:1", "txbns://", "txbns://h1:1,,h2:2"):
        with pytest.raises(InvalidArgument):
            parse_nameserver_url(bad)


def test_broker_group_settings_go_together() -> None:
    with pytest.raises(InvalidArgument, match="coordinator and group go together"):
        ServerConfig(coordinator="etcd://127.0.0.1:2379")
    with pytest.raises(InvalidArgument, match="role must be"):
        ServerConfig(coordinator="etcd://127.0.0.1:2379", group="g1", role="leader")
    with pytest.raises(InvalidArgument, match="coordinator URL"):
        ServerConfig(coordinator="http://127.0.0.1:2379", group="g1")
    assert ServerConfig().coordinator is None  # a lone broker by default
