"""The back-check lanes' rules, each on its own: round robin, per-endpoint limits, the breaker."""

from __future__ import annotations

import pytest

from txbroker.tx.checklanes import Breaker, FairLanes, LaneSettings, endpoint_of

SICK = "http://sick:80"
WELL = "http://well:80"


def live(_: str) -> bool:
    return True


def drain(lanes: FairLanes, now: float) -> list[str]:
    out = []
    while (got := lanes.pop(now, live)) is not None:
        out.append(got[0])
    return out


def test_endpoint_is_scheme_host_port() -> None:
    assert endpoint_of("http://a.example/check?x=1") == "http://a.example:80"
    assert endpoint_of("https://a.example/check") == "https://a.example:443"
    assert endpoint_of("http://127.0.0.1:8000/txb/check") == "http://127.0.0.1:8000"


def test_a_backlog_at_one_endpoint_does_not_delay_another() -> None:
    lanes = FairLanes(LaneSettings(endpoint_concurrency=1000, rate_per_s=1e9))
    for i in range(1000):
        lanes.push(f"sick{i}", SICK, "a")
    lanes.push("well", WELL, "b")
    # Queued last, sent second: queues take turns, whatever their length.
    assert drain(lanes, 0.0)[:2] == ["sick0", "well"]


def test_producer_groups_of_one_endpoint_take_turns() -> None:
    lanes = FairLanes(LaneSettings(endpoint_concurrency=1000, rate_per_s=1e9))
    for i in range(3):
        lanes.push(f"a{i}", WELL, "a")
    for i in range(3):
        lanes.push(f"b{i}", WELL, "b")
    assert drain(lanes, 0.0) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_endpoint_concurrency_bounds_checks_in_flight() -> None:
    lanes = FairLanes(LaneSettings(endpoint_concurrency=3, rate_per_s=1e9))
    for i in range(10):
        lanes.push(f"s{i}", SICK, "a")
    assert drain(lanes, 0.0) == ["s0", "s1", "s2"]
    assert lanes.next_ready(0.0) is None  # only a check's end can free a lane
    lanes.done(SICK, 0.0, failed=False)
    assert drain(lanes, 0.0) == ["s3"]


def test_rate_spaces_sends_evenly() -> None:
    lanes = FairLanes(LaneSettings(endpoint_concurrency=100, rate_per_s=10))
    for i in range(3):
        lanes.push(f"s{i}", SICK, "a")
    assert drain(lanes, 0.0) == ["s0"]
    assert lanes.next_ready(0.0) == pytest.approx(0.099)
    assert drain(lanes, 0.05) == []
    assert drain(lanes, 0.1) == ["s1"]


def test_breaker_opens_after_failures_probes_and_backs_off() -> None:
    s = LaneSettings(endpoint_concurrency=10, rate_per_s=1e9, breaker_failures=3,
                     breaker_base_ms=1000, breaker_cap_ms=3000)  # fmt: skip
    lanes = FairLanes(s)
    for i in range(20):
        lanes.push(f"s{i}", SICK, "a")
    assert len(drain(lanes, 0.0)) == 10
    for _ in range(3):
        lanes.done(SICK, 0.0, failed=True)
    (info,) = lanes.info(0.0)
    assert info.breaker is Breaker.OPEN and info.retry_in_ms == 1000 and info.failures == 3
    assert drain(lanes, 0.5) == []  # open: nothing goes, even with lanes free
    assert lanes.next_ready(0.5) == pytest.approx(0.5)
    assert drain(lanes, 1.0) == ["s10"]  # half open: exactly one probe
    assert lanes.info(1.0)[0].breaker is Breaker.HALF_OPEN
    for _ in range(6):  # the checks sent before it opened end too; they do not reopen it
        lanes.done(SICK, 1.0, failed=True)
    assert drain(lanes, 1.0) == []
    lanes.done(SICK, 1.0, failed=True)  # the probe failed: open again, twice as long
    assert lanes.info(1.0)[0].retry_in_ms == 2000
    assert drain(lanes, 3.0) == ["s11"]
    lanes.done(SICK, 3.0, failed=True)
    assert lanes.info(3.0)[0].retry_in_ms == 3000  # capped
    assert drain(lanes, 6.0) == ["s12"]
    lanes.done(SICK, 6.0, failed=False)  # an answer closes it and resets the backoff
    (info,) = lanes.info(6.0)
    assert info.breaker is Breaker.CLOSED and info.failures == 0 and info.opened == 0
    assert len(drain(lanes, 6.0)) == 7


def test_an_answer_of_any_kind_resets_the_failure_count() -> None:
    lanes = FairLanes(LaneSettings(rate_per_s=1e9, breaker_failures=2))
    for i in range(3):
        lanes.push(f"s{i}", SICK, "a")
    drain(lanes, 0.0)
    lanes.done(SICK, 0.0, failed=True)
    lanes.done(SICK, 0.0, failed=False)
    lanes.done(SICK, 0.0, failed=True)
    assert lanes.info(0.0)[0].breaker is Breaker.CLOSED


def test_stale_items_are_dropped_without_using_a_lane() -> None:
    lanes = FairLanes(LaneSettings(endpoint_concurrency=1, rate_per_s=1e9))
    for i in range(3):
        lanes.push(f"s{i}", SICK, "a")
    got = lanes.pop(0.0, lambda item: item == "s2")
    assert got == ("s2", SICK)
    assert len(lanes) == 0 and lanes.info(0.0)[0].inflight == 1
    lanes.done(SICK, 0.0, failed=False)
    assert lanes.info(0.0) == []  # idle and healthy endpoints are forgotten


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="endpoint_concurrency"):
        LaneSettings(endpoint_concurrency=0)
    with pytest.raises(ValueError, match="rate_per_s"):
        LaneSettings(rate_per_s=0)
    with pytest.raises(ValueError, match="breaker_base_ms"):
        LaneSettings(breaker_base_ms=10, breaker_cap_ms=5)
