"""The rules of what a person reads about failing back-checks, and of the stall clock, each on
its own (no clock, no I/O: the broker-level tests are in test_stalled.py)."""

from __future__ import annotations

from txbroker.runtime.timetext import duration_text
from txbroker.tx.checkhealth import REPEAT_S, TRACKED_MAX, CheckHealth
from txbroker.tx.state import SINCE_UNKNOWN, Tx, TxState

EP = "http://orders:8000"


def test_a_run_is_told_when_it_starts_at_most_every_repeat_and_when_it_ends() -> None:
    h = CheckHealth()
    assert h.answered(EP, 0.0) is None  # nothing was failing: nothing to say
    first = h.failed(
        EP, "connection refused", "unreachable: [Errno 111]", unreachable=True, now_s=10
    )
    assert first == "back-checks to http://orders:8000 started failing: unreachable: [Errno 111]"
    # A storm of failures in between says nothing more...
    for i in range(1000):
        assert h.failed(EP, "connection refused", "r", unreachable=True, now_s=11 + i * 0.2) is None
    assert h.failed(EP, "timeout", "no answer within 3 s", unreachable=False, now_s=200) is None
    # ...until REPEAT_S after the last line, with what happened meanwhile.
    again = h.failed(EP, "timeout", "no answer within 3 s", unreachable=False, now_s=10 + REPEAT_S)
    assert again == (
        "back-checks to http://orders:8000 still failing after 5 min 0 s: 1003 checks failed "
        "(connection refused: 1001, timeout: 2); last: no answer within 3 s"
    )
    assert h.failed(EP, "timeout", "t", unreachable=False, now_s=20 + REPEAT_S) is None
    done = h.answered(EP, 10 + 754)
    assert done == (
        "back-checks to http://orders:8000 recovered after 12 min 34 s: 1004 checks failed "
        "(connection refused: 1001, timeout: 3) meanwhile"
    )
    assert h.failing == 0 and h.answered(EP, 800) is None
    # The next failure starts a new run, told at once.
    assert h.failed(EP, "HTTP 500", "HTTP 500", unreachable=False, now_s=801) is not None


def test_runs_are_per_endpoint() -> None:
    h = CheckHealth()
    assert h.failed(EP, "TLS", "t", unreachable=True, now_s=0) is not None
    assert h.failed("http://billing:80", "TLS", "t", unreachable=True, now_s=1) is not None
    assert h.answered("http://billing:80", 2) is not None
    assert h.failed(EP, "TLS", "t", unreachable=True, now_s=3) is None  # still EP's first run
    assert h.failing == 1


def test_unreachable_follows_the_last_check_of_the_run() -> None:
    h = CheckHealth()
    assert not h.unreachable(EP)
    h.failed(EP, "timeout", "t", unreachable=False, now_s=0)
    assert not h.unreachable(EP)  # a timeout was sent: it reached the endpoint
    h.failed(EP, "connection refused", "r", unreachable=True, now_s=1)
    assert h.unreachable(EP)
    h.answered(EP, 2)
    assert not h.unreachable(EP)


def test_failing_endpoints_are_bounded_and_the_overflow_said_once() -> None:
    h = CheckHealth()
    for i in range(TRACKED_MAX):
        assert h.failed(f"http://h{i}:80", "DNS", "d", unreachable=True, now_s=0) is not None
    over = h.failed("http://one-more:80", "DNS", "d", unreachable=True, now_s=0)
    assert over is not None and f"more than {TRACKED_MAX} endpoints" in over
    assert h.failed("http://and-another:80", "DNS", "d", unreachable=True, now_s=0) is None
    assert h.failing == TRACKED_MAX and not h.unreachable("http://one-more:80")
    assert h.answered("http://h0:80", 1) is not None  # room again: the next overflow is said
    assert h.failed("http://one-more:80", "DNS", "d", unreachable=True, now_s=2) is not None


def test_durations_read_as_a_person_says_them() -> None:
    assert [duration_text(s) for s in (0.4, 59, 60, 754, 3600, 11_100)] == [
        "0 s", "59 s", "1 min 0 s", "12 min 34 s", "1 h 0 min", "3 h 5 min",
    ]  # fmt: skip


def _tx(created_ms: int = 1_000, timeout_ms: int = 6_000) -> Tx:
    return Tx("t", "orders", 0, "g", "http://x/c", "m", None, None, timeout_ms, created_ms,
              0, 0, 0)  # fmt: skip


def test_the_stall_clock_starts_at_the_first_unreached_check_and_stops_at_a_reached_one() -> None:
    tx = _tx()
    assert not tx.stalled(10**12, 1)  # never unreachable
    assert tx.unreached(50_000) and tx.unreachable_since_ms == 50_000
    assert not tx.unreached(60_000) and tx.unreachable_since_ms == 50_000  # the run goes on
    assert not tx.stalled(50_000 + 899_999, 900_000)
    assert tx.stalled(50_000 + 900_000, 900_000)
    tx.state = TxState.PARKED
    assert not tx.stalled(10**12, 1)  # parked is escalated already: not stalled as well
    tx.state = TxState.PREPARED
    tx.reached()
    assert tx.unreachable_since_ms == 0 and not tx.stalled(10**12, 1)


def test_an_unknown_run_is_dated_from_the_first_due_check() -> None:
    tx = _tx(created_ms=1_000, timeout_ms=6_000)
    tx.unreachable_since_ms = SINCE_UNKNOWN
    assert not tx.stalled(10**12, 1)  # unknown: not stalled until a check fails to reach
    assert tx.unreached(2_000_000) and tx.unreachable_since_ms == 7_000
    fresh = _tx(created_ms=1_000, timeout_ms=6_000)
    fresh.unreachable_since_ms = SINCE_UNKNOWN
    fresh.unreached(5_000)  # never later than now
    assert fresh.unreachable_since_ms == 5_000
