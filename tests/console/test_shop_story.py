"""The README's promise, in a real browser: run examples/shop (a broker, the orders and billing
services as uvicorn processes on PostgreSQL), place order o-1, and find its whole story in the
console from the order id alone: the order id is the message key of its ``orders`` transaction
and of its outbox ``audit`` message."""

from __future__ import annotations

from typing import Any

from tests.console.conftest import search, sign_in, wait_for
from tests.examples.test_shop import TOKEN, Shop, databases, shop

__all__ = ["databases", "shop"]  # the shop's fixtures, used here by name

CSS = "css selector"


def _rows(browser: Any, table: int) -> list[str]:
    tables = browser.find_elements(CSS, "table.found")
    return [r.text for r in tables[table].find_elements(CSS, "tbody tr")] if tables else []


async def test_an_orders_whole_story_is_found_from_its_order_id(
    shop: Shop, browser: Any, shots: Any
) -> None:
    shop.orders.start()
    assert (await shop.place("o-1")).status_code == 201

    async def billed() -> bool:
        return "o-1" in await shop.invoices()

    await shop.until("o-1 invoiced", billed)

    sign_in(
        browser, shop.broker.http, token=TOKEN
    )  # the shop's broker wants a token, as in the README
    search(browser, "o-1")

    def story() -> bool:
        # The audit message is published by the outbox relay, a moment after the commit; billing
        # commits its offset after its handler's transaction: look until both are there.
        messages = _rows(browser, 1)
        if len(messages) == 2 and "billing processed" in "".join(messages):
            return True
        browser.refresh()
        return False

    wait_for(story, "the order's transaction, its two messages, billing's progress")
    [tx_row] = _rows(browser, 0)
    assert "committed" in tx_row and "orders" in tx_row and "o-1" in tx_row
    orders_msg, audit_msg = sorted(_rows(browser, 1), key=lambda r: not r.startswith("orders"))
    assert '"id":"o-1"' in orders_msg and "billing processed" in orders_msg
    assert audit_msg.startswith("audit") and "order placed" in audit_msg
    assert "none: a plain send" in audit_msg  # the outbox's message has no transaction
    shots(browser, "shop-search-o-1")

    browser.find_element(CSS, "table.found a.mono[href*='/transactions/']").click()
    wait_for(lambda: browser.find_elements(CSS, "ol.timeline"), "the order's timeline")
    titles = [e.text for e in browser.find_elements(CSS, "ol.timeline li b")]
    assert titles == ["prepared", "committed by producer", "visible to consumers"]
    groups = browser.find_element(CSS, "table").text
    assert "billing" in groups and "processed" in groups
    assert "o-1" in browser.find_element(CSS, "dl.message").text  # its key
    shots(browser, "shop-timeline-o-1")
