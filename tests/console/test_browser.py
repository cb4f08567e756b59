"""The console in a real browser (Debian's headless Chromium), against real broker processes:
what an operator sees, and what clicking does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import NoAlertPresentException

from tests.console.conftest import (
    FAST_CHECKS,
    GROUP,
    TOKEN,
    TRACE_URL,
    StartBroker,
    sign_in,
    until,
    wait_for,
)
from txbroker_sdk import Client, Consumer

EVIL_KEY = '<script>alert("key")</script>'
EVIL_HEADER = "<script>alert('header')</script>"
EVIL_BODY = '{"note": "<script>alert(1)</script>", "pad": "' + "x" * 400 + '"}'
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
CSS = "css selector"


def _text(browser: Any) -> str:
    return str(browser.find_element("tag name", "body").text)


def _no_script_ran(browser: Any) -> None:
    assert browser.find_elements("tag name", "script") == []
    with pytest.raises(NoAlertPresentException):
        browser.switch_to.alert  # noqa: B018 (the property raises when no alert is open)


def _row(browser: Any, tx_id: str) -> Any:
    [row] = [r for r in browser.find_elements(CSS, "table.tx tbody tr") if tx_id in r.text]
    return row


def _titles(browser: Any) -> list[str]:
    return [e.text for e in browser.find_elements(CSS, "ol.timeline li b")]


def _notice(browser: Any) -> str:
    return str(wait_for(lambda: browser.find_elements(CSS, ".notice"), "a notice")[0].text)


async def test_a_pending_transaction_committed_by_clicking_reaches_a_consumer(
    browser: Any, start_broker: StartBroker, check_url: str, shots: Any
) -> None:
    b = start_broker("--auth-token", TOKEN, "--trace-url", TRACE_URL)
    async with await Client.connect(b.url, auth_token=TOKEN) as c:
        await c.create_topic("orders", queues=2)
        for topic, queues, n in (("payments", 4, 12), ("shipments", 2, 5)):
            await c.create_topic(topic, queues=queues)  # neighbours, for a fuller overview
            for i in range(n):
                await c.send(topic, b'{"n": %d}' % i, key=f"{topic}-{i}")
        tx = await c.prepare(
            "orders",
            EVIL_BODY.encode(),
            producer_group=GROUP,
            check_url=check_url,
            key=EVIL_KEY,
            headers={"x-note": EVIL_HEADER},
            traceparent=TRACEPARENT,
            timeout_ms=600_000,  # no back-check during the test: the operator decides
        )
        browser.delete_all_cookies()
        browser.get(f"{b.http}/console/transactions")
        assert "/console/login" in browser.current_url  # a broker with a token: sign in first
        shots(browser, "login")
        sign_in(browser, b.http, "/console/transactions")
        assert browser.current_url.endswith("/console/transactions")  # back where it started
        row = _row(browser, tx.tx_id)
        assert "pending" in row.text and EVIL_KEY in row.text  # the key, as text
        _no_script_ran(browser)
        shots(browser, "transactions-pending")

        row.find_element(CSS, "a.btn.ok").click()  # Commit…: a confirmation first
        wait_for(lambda: "/commit" in browser.current_url, "the confirmation page")
        text = _text(browser)
        assert f"Commit transaction {tx.tx_id}?" in text
        assert "Publishes the message shown here to orders, queue" in text
        assert EVIL_KEY in text and "none yet" in text  # its key; no back-check has run
        assert (await c.show_transaction(tx.tx_id)).state == "prepared"  # nothing done yet
        _no_script_ran(browser)
        shots(browser, "confirm-commit")
        browser.find_element(CSS, "form.confirm button.ok").click()
        assert _notice(browser) == f"transaction {tx.tx_id} committed"
        assert browser.current_url.endswith("/console/transactions")  # back where it began
        assert (await c.show_transaction(tx.tx_id)).state == "committed"
        async with Consumer(c, "billing", "orders") as consumer:
            got = await until(lambda: consumer.fetch(timeout_ms=500), "the committed message")
            assert [m.body for m in got] == [EVIL_BODY.encode()]
            got[0].ack()
            await consumer.commit()

            browser.get(f"{b.http}/console/transactions/{tx.tx_id}")
            assert _titles(browser) == [
                "prepared",
                "committed by operator",
                "visible to consumers",
            ]
            groups = browser.find_element(CSS, "table").text
            assert "billing" in groups and "processed" in groups
            link = browser.find_element(CSS, ".facts a[rel=noreferrer]")
            assert link.get_attribute("href") == TRACE_URL.format(trace_id=TRACEPARENT[3:35])
            text = _text(browser)
            for evil in (EVIL_KEY, EVIL_HEADER, '"<script>alert(1)</script>"'):
                assert evil in text  # shown as text ...
            assert "<script>alert" not in browser.page_source  # ... escaped in the page
            assert "x" * 300 not in text and "shortened" in text  # the body is cut short
            _no_script_ran(browser)
            shots(browser, "timeline-committed")

            browser.get(f"{b.http}/console/")
            assert "orders" in browser.find_element(CSS, "table").text
            shots(browser, "overview")
            browser.get(f"{b.http}/console/topics/orders")
            assert EVIL_KEY in _text(browser)
            _no_script_ran(browser)
            shots(browser, "topic")
            browser.get(f"{b.http}/console/groups")
            assert "billing" in _text(browser)
            shots(browser, "groups")


async def test_a_parked_transaction_shows_why_and_is_resumed_then_rolled_back(
    browser: Any, start_broker: StartBroker, check_url: str, shots: Any
) -> None:
    b = start_broker("--auth-token", TOKEN, *FAST_CHECKS)
    async with await Client.connect(b.url, auth_token=TOKEN) as c:
        await c.create_topic("orders")
        tx = await c.prepare("orders", b"{}", producer_group=GROUP, check_url=check_url, key="o-7")
        waiting = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url=check_url, key="o-8",
            timeout_ms=600_000,
        )  # fmt: skip

        async def parked() -> bool:
            return (await c.show_transaction(tx.tx_id)).state == "parked"

        await until(parked, "the transaction to be parked")
        sign_in(browser, b.http)
        browser.get(f"{b.http}/console/transactions")
        row = _row(browser, tx.tx_id)
        assert "parked after 2 checks" in row.text
        assert row.text.count("unknown") >= 2  # the check history, newest first
        assert "pending" in _row(browser, waiting.tx_id).text
        shots(browser, "transactions")

        browser.get(f"{b.http}/console/transactions/{tx.tx_id}")
        assert _titles(browser) == [
            "prepared",
            "back-check: unknown",
            "back-check: unknown",
            "parked",
            "parked: waiting for an operator",
        ]
        shots(browser, "timeline-parked")

        browser.find_element(CSS, ".act-bar button.info").click()  # Resume checks
        assert _notice(browser) == f"transaction {tx.tx_id} resumed"
        await until(parked, "the resumed transaction to be parked again")
        browser.get(f"{b.http}/console/transactions/{tx.tx_id}")
        assert "resumed by operator" in _text(browser)
        browser.find_element(CSS, ".act-bar a.btn.bad").click()  # Roll back…
        text = wait_for(lambda: "Publishes nothing" in _text(browser) and _text(browser), "it")
        assert f"Roll back transaction {tx.tx_id}?" in text and "o-7" in text
        assert "parked after 2 checks" in text  # why it is parked ...
        last = browser.find_element(CSS, ".last-check").text
        assert last.startswith("unknown") and "answered UNKNOWN" in last  # ... the last answer
        shots(browser, "confirm-rollback")
        browser.find_element(CSS, "form.confirm button.bad").click()
        assert _notice(browser) == f"transaction {tx.tx_id} rolled back"
        assert (await c.show_transaction(tx.tx_id)).state == "rolled_back"
        browser.get(f"{b.http}/console/transactions/{tx.tx_id}")
        assert "rolled back by operator" in _text(browser)
        assert "Not delivered" in _text(browser)


async def test_without_the_token_the_action_is_refused(
    browser: Any, start_broker: StartBroker, check_url: str, shots: Any
) -> None:
    b = start_broker("--auth-token", TOKEN)
    async with await Client.connect(b.url, auth_token=TOKEN) as c:
        await c.create_topic("orders")
        tx = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url=check_url, timeout_ms=600_000
        )
        browser.delete_all_cookies()
        browser.get(f"{b.http}/console/login")
        browser.find_element("id", "token").send_keys("not-the-token")
        browser.find_element(CSS, "form button[type=submit]").click()
        assert "not a token of this broker" in _notice(browser)

        sign_in(browser, b.http)
        browser.get(f"{b.http}/console/transactions")
        _row(browser, tx.tx_id).find_element(CSS, "a.btn.ok").click()
        button = wait_for(lambda: browser.find_elements(CSS, "form.confirm button"), "it")[0]
        browser.delete_all_cookies()  # the session is gone (expired, or never signed in)
        button.click()
        wait_for(lambda: "Sign in required" in _text(browser), "the refusal")
        assert "Sign in with the broker's admin token to act" in _text(browser)
        shots(browser, "refused")
        assert (await c.show_transaction(tx.tx_id)).state == "prepared"


async def test_dead_letters_are_redriven_and_the_reconciliation_shown(
    browser: Any, start_broker: StartBroker, tmp_path: Path, shots: Any
) -> None:
    reports = tmp_path / "reports"
    # No token: pages are open, and actions allowed from this host (the browser is on it).
    # One failure sends a message to the dead letters.
    b = start_broker("--reconcile-reports", str(reports), env={"TXB_MAX_RECONSUME": "0"})
    async with await Client.connect(b.url) as c:
        await c.create_topic("payments")
        await c.send("payments", EVIL_BODY.encode(), key=EVIL_KEY)
        async with Consumer(c, "ledger", "payments") as consumer:
            [m] = await until(lambda: consumer.fetch(timeout_ms=500), "the message")
            assert (await m.nack()).dead_lettered
            await consumer.commit()

            browser.delete_all_cookies()
            browser.get(f"{b.http}/console/deadletters")
            text = _text(browser)
            assert "group ledger" in text and "1 waiting" in text and EVIL_KEY in text
            _no_script_ran(browser)
            shots(browser, "deadletters")
            browser.find_element(CSS, "form button.info").click()  # Re-drive
            assert _notice(browser) == "re-drove 1 dead letter(s) of group ledger to their topics"
            again = await until(lambda: consumer.fetch(timeout_ms=500), "the re-driven message")
            assert [x.body for x in again] == [EVIL_BODY.encode()]
            again[0].ack()
            await consumer.commit()
        browser.get(f"{b.http}/console/deadletters")
        assert "0 waiting" in _text(browser) and "re-driven" in _text(browser)

    browser.get(f"{b.http}/console/reconciliation")
    assert "No reconciliation yet" in _text(browser)
    run = reports / "2026-11-25"
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(_summary()))
    browser.get(f"{b.http}/console/reconciliation")
    text = _text(browser)
    assert "Anomalies: 1 lost." in text and "payments" in text and "o-lost-1" in text
    _no_script_ran(browser)
    shots(browser, "reconciliation")


def _summary() -> dict[str, Any]:
    """A summary.json as `txbroker reconcile` writes it (format version 1), one loss found."""
    topic = {
        "topic": "payments", "messages": 1200, "transactional": 1000, "outbox": 200,
        "lost": 1, "phantom": 0, "duplicate": 0, "stuck": 0,
        "latency": {"commit → processed": {"count": 1199, "p50": 41.0, "p95": 88.0,
                                            "p99": 130.0, "max": 410.0}},
    }  # fmt: skip
    return {
        "version": 1,
        "generated_at_ms": 1_764_000_000_000,
        "as_of_ms": 1_763_999_940_000,
        "grace_s": 60.0,
        "clean": False,
        "anomalies": {"lost": 1, "phantom": 0, "duplicate": 0, "stuck": 0},
        "by_reason": [
            {"kind": "lost", "reason": "committed, no message", "topic": "payments", "count": 1}
        ],
        "topics": [topic],
        "examples": [
            {
                "kind": "lost",
                "reason": "committed, no message",
                "topic": "payments",
                "id": "o-lost-1",
            }
        ],
    }
