"""The nemesis on real test hosts: a cut drops packets one way or both, between hosts or
between a host and this process, and a heal lets them through again; and the history checker
(and the transactions' checker) finds each anomaly it reports, on a history made up for it."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from tests.cluster.conftest import TestNet
from txbroker.chaos.history import (
    Delivery,
    History,
    Op,
    Outcome,
    Stored,
    check,
    check_transactions,
    windows_p50_max,
)
from txbroker.chaos.nemesis import Nemesis
from txbroker.chaos.netns import Host

PORT = 7000
PROBE_S = 0.5  # a datagram on a bridge arrives in microseconds; this bounds the wait


def _hears(receiver: Host, sender: Host) -> bool:
    """Whether a datagram ``sender`` sends reaches ``receiver`` (either may be this process,
    a host without a namespace)."""
    listen = (
        "import socket,sys;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM);"
        f"s.bind(('{receiver.address}',{PORT}));s.settimeout({PROBE_S * 4});"
        "print('ready',flush=True);print(s.recv(9).decode())"
    )
    rx = subprocess.Popen(
        [*receiver.run_prefix, sys.executable, "-c", listen]
        if receiver.netns
        else [sys.executable, "-c", listen],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
    # A DROP in the sender's own OUTPUT chain refuses the datagram (EPERM): not sent either.
    send = (
        "import socket,contextlib;s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
        "with contextlib.suppress(PermissionError):\n"
        f" [s.sendto(b'hello',('{receiver.address}',{PORT})) for _ in range(3)]"
    )
    cmd = [sys.executable, "-c", send]
    subprocess.run([*sender.run_prefix, *cmd] if sender.netns else cmd, check=True, timeout=30)
    out, _ = rx.communicate(timeout=30)
    return out.strip() == "hello"


def test_cuts_drop_packets_one_way_or_both_and_heal_restores_them(net: TestNet) -> None:
    a, b = net.host("a"), net.host("b")
    nemesis = Nemesis(net)
    client = nemesis.client
    assert _hears(b, a) and _hears(a, b) and _hears(a, client)

    nemesis.cut(a, b, one_way=True)
    assert not _hears(b, a)
    assert _hears(a, b)
    nemesis.heal()
    assert _hears(b, a)

    nemesis.cut(client, a, one_way=True)  # the rule lands in a's namespace
    assert not _hears(a, client)
    assert _hears(client, a) and _hears(a, b)
    nemesis.heal()

    nemesis.isolate(a)
    assert not _hears(a, b) and not _hears(b, a) and not _hears(client, a)
    assert _hears(b, client)
    nemesis.heal()
    assert _hears(a, b) and _hears(client, a)
    assert nemesis.cuts == []


def test_the_checker_reports_each_anomaly() -> None:
    history = History()
    ops = [
        (0, "w0-0", Outcome.OK),
        (0, "w0-1", Outcome.OK),
        (0, "w0-2", Outcome.OK),  # acknowledged, then not in the log: lost
        (1, "w1-0", Outcome.UNKNOWN),
        (1, "w1-0", Outcome.OK),  # retried, acknowledged
        (1, "w1-1", Outcome.FAIL),  # refused every time, yet in the log: a phantom
        (1, "w1-2", Outcome.UNKNOWN),  # never known, stored
    ]
    for p, w, outcome in ops:
        history.ops.append(_op(history, p, w, outcome))
    order = {"k0": ["w0-0", "w0-1", "w0-2"], "k1": ["w1-0", "w1-1", "w1-2"]}
    log = [
        Stored("w0-1", "k0", 0, 0),  # before w0-0, which its writer made first
        Stored("w0-0", "k0", 0, 1),
        Stored("w1-0", "k1", 1, 0),
        Stored("w1-0", "k1", 1, 1),  # twice
        Stored("w1-1", "k1", 1, 2),
        Stored("w1-2", "k1", 1, 3),
        Stored("x", "k9", 2, 0),  # nobody wrote it
    ]
    deliveries = [
        Delivery("w0-0", 0),
        Delivery("w0-0", 0),
        Delivery("w0-1", 0),
        Delivery("w0-1", 1),
        Delivery("w0-2", 0),  # read, then gone from the log
    ]
    r = check(history, log, deliveries, order)
    assert (r.writes, r.attempts, r.acknowledged, r.unknown, r.unknown_stored) == (6, 7, 4, 1, 1)
    assert r.lost == ["w0-2"]
    assert r.duplicated == ["w1-0"]
    assert r.out_of_order == ["w0-0 after w0-1"]
    assert r.phantoms == ["w1-1", "x"]
    assert r.delivered_twice == ["w0-0"]  # w0-1's second delivery came from a nack
    assert r.vanished == ["w0-2"]
    assert r.anomalies == 6
    assert r.losses == 2  # w0-2 lost, and the same write vanished from under its reader


def test_the_loss_window_and_the_unavailability_come_from_acknowledgement_times() -> None:
    history = History()
    history.cut_s = 10.0
    # (write, outcome, completed at): w3 and w5 acknowledged, then not in the log.
    ok, unknown = Outcome.OK, Outcome.UNKNOWN
    times = [(ok, 9.0), (ok, 9.9), (ok, 9.95), (ok, 11.0), (unknown, 12.0), (ok, 14.0)]
    times += [(ok, 14.1), (ok, 17.1)]
    for i, (outcome, at) in enumerate(times):
        history.ops.append(Op(0, f"w{i}", at - 0.01, at, outcome))
    log = [Stored(f"w{i}", "k0", 0, n) for n, i in enumerate((0, 1, 2, 4, 6, 7))]
    order = {"k0": [f"w{i}" for i in range(8)]}
    r = check(history, log, [], order)
    assert r.lost == ["w3", "w5"]
    assert r.lost_acked_s == [1.0, 4.0]
    assert r.loss_window() == (1.0, 4.0)
    # Gaps over UNAVAILABLE_MIN_S between acknowledgements: 9.0-9.9, 9.95-11.0, 11.0-14.0 (the
    # unknown attempt in between is no acknowledgement) and 14.1-17.1.
    assert r.unavailable_s == [0.9, 1.05, 3.0, 3.0]
    assert r.unavailable_p50_max() == (3.0, 3.0)
    assert windows_p50_max([0.6, 2.0, 5.0, 1.0]) == (2.0, 5.0)
    assert windows_p50_max([]) == (0.0, 0.0)
    history.cut_s = None  # no fault: no loss window, though the losses are reported
    assert check(history, log, [], order).loss_window() is None


def test_acknowledgement_latency_is_told_by_when_each_attempt_began() -> None:
    history = History()
    history.cut_s, history.heal_s = 10.0, 20.0
    # (invoked, completed, outcome): latency 0.01 before the cut, 0.1 to 0.3 in it, 0.02 after;
    # a failed attempt has no latency of an acknowledgement.
    ok = Outcome.OK
    attempts = [(1.0, 1.01, ok), (2.0, 2.01, ok), (11.0, 11.1, ok), (12.0, 12.2, ok)]
    attempts += [(13.0, 13.3, ok), (19.9, 20.1, ok), (15.0, 17.0, Outcome.UNKNOWN)]
    attempts += [(21.0, 21.02, ok)]
    for i, (invoked, completed, outcome) in enumerate(attempts):
        history.ops.append(Op(0, f"w{i}", invoked, completed, outcome))
    r = check(history, [], [], {})
    # Nearest rank: the p50 of four is the second; the attempt begun before the heal and
    # acknowledged after it is the fault's.
    assert r.ack_latency_s == {
        "before": [0.01, 0.01, 0.01],
        "during": [0.2, 0.3, 0.3],
        "after": [0.02, 0.02, 0.02],
    }
    assert "during 0.200 / 0.300 / 0.300" in r.summary()
    history.cut_s = history.heal_s = None  # no fault: the whole run is "before"
    assert list(check(history, [], [], {}).ack_latency_s) == ["before"]


def test_the_transactions_checker_reports_each_anomaly() -> None:
    committed = {"o1", "o2", "o3", "o4", "o5"}
    acknowledged = {"o1", "o2", "o6"}  # o6: told committed, not in its own database
    log = ["o1", "o2", "o2", "o3", "o5", "o7"]  # o2 twice; o4 missing; o7 never committed
    applied = Counter({"o1": 1, "o2": 1, "o3": 2, "o8": 1})  # o5 never applied, o8 phantom
    r = check_transactions(committed, acknowledged, log, applied, open_transactions=1)
    assert (r.committed, r.acknowledged, r.in_log) == (5, 3, 6)
    assert r.vanished == [
        "o4 (not in the log)",
        "o5 (never applied)",
        "o6 (not in the log)",
    ]
    assert r.phantoms == ["o7 (in the log)", "o8 (applied)"]
    assert r.duplicated == ["o2"]
    assert r.applied_twice == ["o3"]
    assert r.acknowledged_not_committed == ["o6"]
    assert r.open == 1
    assert r.anomalies == 9
    assert "vanished ['o4 (not in the log)'" in r.summary()
    clean = check_transactions({"o1"}, {"o1"}, ["o1"], Counter({"o1": 1}), 0)
    assert clean.anomalies == 0 and clean.summary().endswith("open 0")


def _op(history: History, p: int, w: str, outcome: Outcome):  # type: ignore[no-untyped-def]
    from txbroker.chaos.history import Op

    return Op(p, w, history.now(), history.now(), outcome, "" if outcome is Outcome.OK else "E")
