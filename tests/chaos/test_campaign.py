"""The fault campaign at CI size (`txbroker chaos`, docs/reliability.md "Fault campaign"): each
scenario a few rounds against a real broker and real service processes, then its checks. A
scenario is clean when it lost no acknowledged message, applied no effect twice and found no
anomaly; the longer run by hand is the same code with more rounds."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI, run_cli
from txbroker.chaos import CampaignOptions, Figures, Sizes, run_campaign

SMALL = Sizes(rounds=3, load=60, round_timeout_s=60, max_s=120)


async def _run(
    tmp_path: Path,
    scenario: str,
    sizes: Sizes = SMALL,
    *,
    ci_may_skip: bool = False,
    spark: Any = None,
) -> Figures:
    opts = CampaignOptions(
        scenarios=(scenario,),
        sizes=sizes,
        root=tmp_path,
        reconcile=spark is not None,
        spark=spark,
    )
    [row] = await run_campaign(opts)
    if skipped := [n for n in row.notes if n.startswith("skipped: ")]:
        if IN_CI and not ci_may_skip:
            pytest.fail(f"{scenario} must run under CI=true: {skipped[0]}")
        pytest.skip(skipped[0])
    assert row.clean, row.explain()
    assert row.rounds == sizes.rounds and row.faults >= sizes.rounds, row.as_dict()
    assert row.acknowledged >= sizes.rounds * sizes.load // 4, row.as_dict()
    return row


async def test_broker_kill_under_sends_and_transactions(tmp_path: Path, spark: Any) -> None:
    # The Spark reconciliation reads the orders and billing databases and the broker's log:
    # no transaction lost or phantom, no message twice, nothing stuck.
    row = await _run(tmp_path, "broker-kill", spark=spark)
    assert row.reconciled == "clean", row.reconciled


async def test_service_kill_at_every_crash_point(tmp_path: Path) -> None:
    # Four rounds: each of the four crash points once (before and after @transactional's
    # database commit, after the relay's send, after the subscriber's inbox commit).
    sizes = Sizes(rounds=4, load=60, round_timeout_s=60, max_s=180)
    row = await _run(tmp_path, "service-kill", sizes)
    assert not [n for n in row.notes if "never reached" in n or "exited with" in n], row.notes


async def test_broker_stop_past_the_check_timeout(tmp_path: Path) -> None:
    await _run(tmp_path, "broker-stop")


async def test_network_latency_resets_and_truncation(tmp_path: Path) -> None:
    row = await _run(tmp_path, "network")
    [proxied] = [n for n in row.notes if "through the proxy" in n]
    assert " 0 reset" not in proxied and " 0 truncated" not in proxied, proxied


async def test_postgres_restarted_under_a_subscriber_and_a_relay(tmp_path: Path) -> None:
    row = await _run(tmp_path, "postgres-restart")
    assert any("restarted 3 times" in n for n in row.notes), row.notes


async def test_disk_full_refuses_and_resumes(tmp_path: Path) -> None:
    # Mounting the small tmpfs needs root: elsewhere (CI included) this is skipped, and
    # tests/server/test_failed_append.py covers a full quota with RLIMIT_FSIZE.
    row = await _run(tmp_path, "disk-full", replace(SMALL, disk="tmpfs"), ci_may_skip=True)
    assert row.faults == SMALL.rounds, row.notes  # every round saw STORE_FAILED


async def test_disk_full_simulated_with_rlimit(tmp_path: Path) -> None:
    sizes = replace(SMALL, rounds=6, disk="rlimit", settle_s=20)
    row = await _run(tmp_path, "disk-full", sizes)
    assert row.faults == sizes.rounds, row.notes


def test_the_command_prints_the_table(tmp_path: Path) -> None:
    res = run_cli(
        "chaos",
        "--scenario",
        "broker-kill",
        "--rounds",
        "1",
        "--load",
        "20",
        "--reconcile",
        "off",
        "--data-dir",
        str(tmp_path),
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for column in ("scenario", "rounds", "faults", "acknowledged", "lost", "duplicated"):
        assert column in res.stdout
    assert "broker-kill" in res.stdout
    assert list(tmp_path.iterdir()) == []  # a clean run leaves nothing behind
