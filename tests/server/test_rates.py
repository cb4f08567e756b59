"""The rates operators see (topic describe, group tables): counters sampled once a second, the
rate over the last minute."""

from __future__ import annotations

from txbroker.server.rates import Rates


def test_no_rate_until_two_samples_span_two_seconds() -> None:
    r: Rates[str] = Rates()
    assert r.rate("t") is None
    r.add(100.0, {"t": 0})
    r.add(101.0, {"t": 10})
    assert r.rate("t") is None
    r.add(102.0, {"t": 30})
    assert r.rate("t") == 15.0


def test_the_rate_spans_the_last_minute_only() -> None:
    r: Rates[str] = Rates(window_s=60)
    for s in range(0, 121):
        # 100/s for the first minute, then 10/s.
        r.add(float(s), {"t": 100 * min(s, 60) + 10 * max(s - 60, 0)})
    assert r.rate("t") == 10.0


def test_new_and_vanished_counters() -> None:
    r: Rates[str] = Rates()
    r.add(0.0, {"a": 5})
    r.add(3.0, {"a": 5, "b": 0})
    r.add(6.0, {"a": 11, "b": 9})
    assert r.rate("a") == 1.0 and r.rate("b") == 3.0  # b from its first sample
    r.add(9.0, {"b": 9})
    assert r.rate("a") is None  # deleted: no rate
    r.add(12.0, {"b": 0})
    assert r.rate("b") == 0.0  # went back (deleted and created again): never negative
