"""Answering "what happened to order o-1?" in a real browser against a real broker: search by key,
transaction id, message id, idempotency key and header value; the recently ended transactions
and their filters; links from every message and reconciliation id to a timeline; the smaller
things an operator reads (the sign-in label, the rate's window); a search the store cannot
fully answer says what it could not search and why."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import httpx

from tests.console.conftest import (
    FAST_CHECKS,
    GROUP,
    TOKEN,
    StartBroker,
    search,
    sign_in,
    until,
    wait_for,
)
from txbroker.console.search import SCAN_QUEUE_MAX
from txbroker.protocol.messages import SendRequest
from txbroker_sdk import Client, Consumer

CSS = "css selector"


def _text(browser: Any) -> str:
    return str(browser.find_element("tag name", "body").text)


def _search(browser: Any, query: str) -> str:
    """``search`` for ``query``; the result's text."""
    search(browser, query)
    return _text(browser)


def _tables(browser: Any) -> dict[str, list[str]]:
    """The search page's two tables: each row's text, by the table's heading."""
    out: dict[str, list[str]] = {}
    for h2 in browser.find_elements(CSS, "main h2"):
        name = h2.text.split()[0]
        rows = browser.find_elements(
            "xpath", f"//h2[starts-with(., '{name}')]/following-sibling::*[1]//tbody/tr"
        )
        out[name] = [r.text for r in rows]
    return out


async def test_an_order_is_found_by_each_of_its_ids_and_each_hit_links_its_timeline(
    browser: Any, start_broker: StartBroker, check_url: str, shots: Any
) -> None:
    b = start_broker()
    async with await Client.connect(b.url) as c:
        await c.create_topic("orders", queues=2)
        await c.create_topic("audit")
        await c.create_topic("billing", queues=1)
        committed = await c.prepare(
            "orders", b'{"id": "o-1", "amount_cents": 1999}', producer_group=GROUP,
            check_url=check_url, key="o-1", headers={"order-ref": "REF-1"},
        )  # fmt: skip
        await committed.commit()
        await c.send("audit", b'{"event": "order placed", "id": "o-1"}', key="o-1",
                     idempotency_key="outbox:orders:17")  # fmt: skip
        rolled = await c.prepare(
            "orders", b'{"id": "o-2"}', producer_group=GROUP, check_url=check_url, key="o-2"
        )
        await rolled.rollback()
        pending = await c.prepare(
            "orders", b'{"id": "o-3"}', producer_group=GROUP, check_url=check_url, key="o-3",
            headers={"order-ref": "REF-3"}, timeout_ms=600_000,
        )  # fmt: skip
        # An old message past the header scan's reach: SCAN_QUEUE_MAX newer ones in its queue.
        await c.send("billing", b"{}", key="o-old", headers={"order-ref": "REF-OLD"})
        for start in range(0, SCAN_QUEUE_MAX, 1000):
            await c.send_batch([SendRequest("billing", b"{}") for _ in range(start, start + 1000)])
        async with Consumer(c, "invoicing", "orders") as consumer:
            [m] = await until(lambda: consumer.fetch(timeout_ms=500), "the committed order")
            m.ack()
            await consumer.commit()

    browser.delete_all_cookies()
    browser.get(f"{b.http}/console/")
    text = _search(browser, "o-1")
    found = _tables(browser)
    [tx_row] = found["Transactions"]
    assert committed.tx_id in tx_row and "committed" in tx_row and "orders" in tx_row
    assert "key" in tx_row  # how it was found: its message's key
    [orders_row, audit_row] = sorted(found["Messages"])[::-1]
    assert orders_row.startswith("orders") and committed.tx_id in orders_row
    assert "invoicing processed" in orders_row  # who consumed it
    assert audit_row.startswith("audit") and "none: a plain send" in audit_row
    assert "which is every message kept" not in text  # billing's old messages were not read
    assert "older messages were not searched by header" in text
    shots(browser, "search-order")

    # The transaction's link leads to its whole story.
    browser.find_element(CSS, f"table.found a[href$='/transactions/{committed.tx_id}']").click()
    wait_for(lambda: "committed by producer" in _text(browser), "the timeline")
    titles = [e.text for e in browser.find_elements(CSS, "ol.timeline li b")]
    assert titles == ["prepared", "committed by producer", "visible to consumers"]

    for query, expected in (
        (committed.tx_id, "transaction id"),
        (committed.message_id, "message id"),
        ("REF-1", "header order-ref"),
        ("outbox:orders:17", "idempotency key"),
    ):
        _search(browser, query)
        rows = _tables(browser)
        if query != "outbox:orders:17":
            assert len(rows["Transactions"]) == 1 and committed.tx_id in rows["Transactions"][0]
        assert any(expected in r for r in rows["Messages"]), (query, rows)

    # Transactions without a visible message: in memory by their key (halves are not indexed).
    _search(browser, "o-2")
    [row] = _tables(browser)["Transactions"]
    assert rolled.tx_id in row and "rolled back" in row
    assert _tables(browser)["Messages"] == []
    _search(browser, "REF-3")  # a pending transaction's header, in its half message
    [row] = _tables(browser)["Transactions"]
    assert pending.tx_id in row and "pending" in row and "header order-ref" in row

    # Past the scan: found by its key (indexed), not by its header (says so).
    _search(browser, "o-old")
    assert len(_tables(browser)["Messages"]) == 1
    text = _search(browser, "REF-OLD")
    assert "No message under REF-OLD" in text and "older messages were not searched" in text
    text = _search(browser, "nothing-like-this")
    assert "No transaction under nothing-like-this" in text

    # After a restart, memory is empty: a key finds the committed one through the index, the
    # rolled-back one through its half message (read by the scan).
    b.stop()
    b.start()
    browser.get(f"{b.http}/console/")
    _search(browser, "o-1")
    assert committed.tx_id in _tables(browser)["Transactions"][0]
    _search(browser, "o-2")
    [row] = _tables(browser)["Transactions"]
    assert rolled.tx_id in row and "rolled back" in row and "key" in row


async def test_ended_transactions_are_listed_with_filters_and_commit_is_confirmed(
    browser: Any, start_broker: StartBroker, check_url: str, shots: Any
) -> None:
    b = start_broker("--auth-token", TOKEN, *FAST_CHECKS)
    async with await Client.connect(b.url, auth_token=TOKEN) as c:
        await c.create_topic("orders")
        await c.create_topic("payments")
        ended = {}
        for topic, key, decision in (
            ("orders", "o-1", "commit"),
            ("orders", "o-2", "rollback"),
            ("payments", "p-1", "commit"),
        ):
            tx = await c.prepare(topic, b"{}", producer_group=GROUP, check_url=check_url, key=key)
            await (tx.commit() if decision == "commit" else tx.rollback())
            ended[key] = tx.tx_id
        operator = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url=check_url, key="o-4",
            timeout_ms=600_000,
        )  # fmt: skip
        await c.resolve_transaction(operator.tx_id, "rollback")
        open_tx = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url=check_url, key="o-5",
            timeout_ms=600_000,
        )  # fmt: skip
        checked = await c.prepare(  # back-checked at once, parked after two UNKNOWNs
            "orders", b"{}", producer_group=GROUP, check_url=check_url, key="o-6"
        )

        browser.delete_all_cookies()
        browser.get(f"{b.http}/console/login")
        assert browser.find_element(CSS, "label[for=token]").text == "Token (read or admin role)"
        sign_in(browser, b.http, "/console/transactions")

        def ended_rows() -> list[str]:
            return [r.text for r in browser.find_elements(CSS, "table.ended tbody tr")]

        rows = ended_rows()
        assert len(rows) == 4  # newest first; the open one is not among them
        assert [r.split()[0] for r in rows] == [
            operator.tx_id, ended["p-1"], ended["o-2"], ended["o-1"]
        ]  # fmt: skip
        assert "operator" in rows[0] and "rolled back" in rows[0]
        shots(browser, "transactions-ended")

        browser.find_element(CSS, "select[name=topic] option[value='']")  # any topic
        for name, value in (("topic", "orders"), ("ended", "rolled_back")):
            browser.find_element(CSS, f"select[name={name}] option[value='{value}']").click()
        browser.find_element(CSS, "form.filters button").click()
        wait_for(lambda: "ended=rolled_back" in browser.current_url, "the filter")
        assert [r.split()[0] for r in ended_rows()] == [operator.tx_id, ended["o-2"]]
        browser.get(f"{b.http}/console/transactions?by=operator")
        assert [r.split()[0] for r in ended_rows()] == [operator.tx_id]
        browser.get(f"{b.http}/console/transactions?ended=bogus")
        assert "filter ended='bogus': ended is one of committed, rolled_back" in _text(browser)

        # A confirmation decides only on what it showed: not once the transaction changed (it
        # was resumed meanwhile), nor once it ended (the fence refuses).
        async def parked() -> bool:
            return (await c.show_transaction(checked.tx_id)).state == "parked"

        await until(parked, "the checked transaction to be parked")
        browser.get(f"{b.http}/console/transactions/{checked.tx_id}/commit")
        seen = browser.find_element(CSS, "input[name=seen]").get_attribute("value")
        assert seen.startswith("parked:") and seen != "parked:0"  # the last check's time
        await c.resolve_transaction(checked.tx_id, "resume")  # another operator, meanwhile
        browser.find_element(CSS, "form.confirm button").click()
        notice = wait_for(lambda: browser.find_elements(CSS, ".notice"), "the refusal")[0].text
        assert "changed since its confirmation page was shown" in notice
        assert (await c.show_transaction(checked.tx_id)).state in ("prepared", "parked")

        browser.get(f"{b.http}/console/transactions/{open_tx.tx_id}/commit")
        assert browser.find_element(CSS, "input[name=seen]").get_attribute("value") == (
            "prepared:0"
        )
        await c.resolve_transaction(open_tx.tx_id, "rollback")
        browser.find_element(CSS, "form.confirm button").click()
        notice = wait_for(lambda: browser.find_elements(CSS, ".notice"), "the refusal")[0].text
        assert notice.endswith("is rolled_back (by operator); commit refused")
        assert (await c.show_transaction(open_tx.tx_id)).state == "rolled_back"


async def test_messages_and_reconciliation_ids_link_to_timelines_and_rates_name_their_window(
    browser: Any, start_broker: StartBroker, check_url: str, tmp_path: Path, shots: Any
) -> None:
    reports = tmp_path / "reports"
    b = start_broker("--reconcile-reports", str(reports))
    async with await Client.connect(b.url) as c:
        await c.create_topic("orders")
        tx = await c.prepare("orders", b"{}", producer_group=GROUP, check_url=check_url, key="o-9")
        await tx.commit()
        await c.send("orders", b"{}", key="o-10")
        rolled = await c.prepare("orders", b"{}", producer_group=GROUP, check_url=check_url)
        await rolled.rollback()

    browser.delete_all_cookies()
    browser.get(f"{b.http}/console/topics/orders")

    def links(kind: str) -> list[str]:
        found = browser.find_elements(CSS, f"dl.message dd a[href*='/{kind}']")
        return sorted(a.get_attribute("href") for a in found)

    assert links("transactions/") == [f"{b.http}/console/transactions/{tx.tx_id}"]  # one has
    assert links("search?") == [f"{b.http}/console/search?q=o-10", f"{b.http}/console/search?q=o-9"]
    browser.get(f"{b.http}/console/")
    assert browser.find_elements(CSS, "th.num")[2].text == "RATE, LAST 60 S"

    def topic_rate() -> str | None:  # once the broker sampled offsets over 2 s
        browser.get(f"{b.http}/console/topics/orders")
        line = str(browser.find_element(CSS, "main p.muted").text)
        return line if "/s over the last 60 s" in line else None

    wait_for(topic_rate, "the topic's rate, with its window")

    run = reports / "2026-11-27"
    run.mkdir(parents=True)
    examples = [
        {"kind": "phantom", "reason": "no local transaction", "topic": "orders", "id": tx.tx_id},
        {"kind": "lost", "reason": "committed, no message", "topic": "orders",
         "id": rolled.tx_id},
        {"kind": "lost", "reason": "outbox row published, no message", "topic": "orders",
         "id": "outbox:orders:5"},
    ]  # fmt: skip
    (run / "summary.json").write_text(json.dumps(_summary(examples)))
    browser.get(f"{b.http}/console/reconciliation")
    hrefs = [a.get_attribute("href") for a in browser.find_elements(CSS, "table a.mono")]
    assert hrefs == [
        f"{b.http}/console/transactions/{tx.tx_id}",
        f"{b.http}/console/transactions/{rolled.tx_id}",
        f"{b.http}/console/search?q=outbox%3Aorders%3A5",  # not a transaction: a search
    ]
    shots(browser, "reconciliation-links")
    browser.find_elements(CSS, "table a.mono")[1].click()
    wait_for(lambda: "rolled back by producer" in _text(browser), "the rolled-back timeline")


def _summary(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """A summary.json as `txbroker reconcile` writes it (format version 1)."""
    return {
        "version": 1,
        "generated_at_ms": 1_764_000_000_000,
        "as_of_ms": 1_763_999_940_000,
        "grace_s": 60.0,
        "clean": False,
        "anomalies": {"lost": 2, "phantom": 1, "duplicate": 0, "stuck": 0},
        "by_reason": [],
        "topics": [
            {"topic": "orders", "messages": 3, "lost": 2, "phantom": 1, "duplicate": 0, "stuck": 0}
        ],
        "examples": examples,
    }


def _rot(data_dir: Path, marker: bytes) -> None:
    """Flip one bit of the newest record holding ``marker`` in the broker's commit log, as a
    failing disk would: the broker maps the same file, so its next read of the record fails
    its CRC. (Segments are named by their first offset: sorted, they are the log's order.)"""
    segment = max(p for p in data_dir.rglob("commitlog/*") if marker in p.read_bytes())
    at = segment.read_bytes().rindex(marker)
    fd = os.open(segment, os.O_RDWR)
    try:
        [byte] = os.pread(fd, 1, at)
        assert os.pwrite(fd, bytes([byte ^ 0x20]), at) == 1
        os.fsync(fd)
    finally:
        os.close(fd)


async def test_a_search_the_store_cannot_fully_read_names_what_was_not_searched_and_why(
    browser: Any, start_broker: StartBroker, check_url: str, shots: Any
) -> None:
    b = start_broker()
    outbox = b'{"event": "order placed", "id": "o-7", "rot": "here"}'
    async with await Client.connect(b.url) as c:
        await c.create_topic("orders", queues=2)
        await c.create_topic("audit", queues=1)
        tx = await c.prepare("orders", b'{"id": "o-7"}', producer_group=GROUP,
                             check_url=check_url, key="o-7")  # fmt: skip
        await tx.commit()
        await c.send("audit", outbox, key="o-7")
        # Past the header scan's reach: SCAN_QUEUE_MAX newer messages in its queue. Only the
        # key index reads the outbox message then, and its failure would go unseen.
        for _ in range(0, SCAN_QUEUE_MAX, 1000):
            await c.send_batch([SendRequest("audit", b"{}") for _ in range(1000)])
    _rot(b.data_dir, outbox)

    async with httpx.AsyncClient(base_url=b.http) as h:
        page = await h.get("/console/search", params={"q": "o-7"})
    assert page.status_code == 200, page.text
    text = page.text
    assert "The search is incomplete" in text
    assert "the key index (keys): the record at physical offset" in text
    assert "CRC mismatch" in text and "queue audit/0" not in text
    assert tx.tx_id in text  # what the rest holds is still shown: the transaction, from memory
    assert "No message under" not in text  # no claim of absence where the store failed
    assert 'None found under <span class="mono">o-7</span> in what could be searched' in text

    browser.delete_all_cookies()
    browser.get(f"{b.http}/console/")
    _search(browser, "o-7")
    warning = browser.find_element(CSS, "main .notice.error[role=alert]")
    assert warning.text.startswith("The search is incomplete")
    [line] = [li.text for li in warning.find_elements(CSS, "li")]
    assert line.startswith("the key index (keys): the record at physical offset")
    assert line.endswith(")") and "is corrupt: CRC mismatch (stored 0x" in line
    # Above the results, where an operator looks first.
    first_table = browser.find_element(CSS, "main h2")
    assert warning.location["y"] < first_table.location["y"]
    [row] = _tables(browser)["Transactions"]
    assert tx.tx_id in row and "committed" in row
    assert _tables(browser)["Messages"] == []
    shots(browser, "search-incomplete")

    # A search that reads none of it is complete, and says plainly that nothing is there.
    text = _search(browser, "nothing-like-this")
    assert "The search is incomplete" not in text and "No message under nothing-like-this" in text

    # A bad record the header scan reads too: one cause, one line naming both sources; and the
    # timeline of its transaction says what it could not read, claiming neither "not delivered"
    # nor "no longer in the log".
    async with await Client.connect(b.url) as c:
        other = await c.prepare("orders", b'{"id": "o-8", "rot": "here"}', producer_group=GROUP,
                                check_url=check_url, key="o-8")  # fmt: skip
        await other.commit()
    _rot(b.data_dir, b'{"id": "o-8", "rot": "here"}')  # the committed copy, after its half
    _search(browser, "o-8")
    warning = browser.find_element(CSS, "main .notice.error[role=alert]")
    [line] = [li.text for li in warning.find_elements(CSS, "li")]
    assert line.startswith("the key index (keys), queue orders/"), line
    assert "CRC mismatch" in line
    [row] = _tables(browser)["Transactions"]
    assert other.tx_id in row
    async with httpx.AsyncClient(base_url=b.http) as h:
        page = await h.get(f"/console/transactions/{other.tx_id}")
    assert page.status_code == 200, page.text
    assert "This timeline may be incomplete" in page.text
    assert "the decision: the record at physical offset" in page.text
    assert "the visible copy: the record at physical offset" in page.text
    assert "Not delivered" not in page.text
    browser.get(f"{b.http}/console/transactions/{other.tx_id}")
    wait_for(lambda: "This timeline may be incomplete" in _text(browser), "the timeline")
    shots(browser, "timeline-incomplete")
