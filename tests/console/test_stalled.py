"""A stalled transaction on the console's Transactions page (headless Chromium, a real broker
whose check-back endpoint is really unreachable): its badge, and the filter that shows only
the stalled ones."""

from __future__ import annotations

from typing import Any

from tests.conftest import free_port
from tests.console.conftest import (
    FAST_CHECKS,
    GROUP,
    TOKEN,
    StartBroker,
    sign_in,
    until,
    wait_for,
)
from txbroker_sdk import Client

CSS = "css selector"


def _rows(browser: Any) -> dict[str, str]:
    """The pending table's rows by transaction id (the first line of each row)."""
    rows = browser.find_elements(CSS, "table.tx tbody tr")
    return {r.text.split("\n", 1)[0]: r.text for r in rows}


async def test_a_stalled_transaction_is_badged_and_filtered(
    browser: Any, start_broker: StartBroker, check_url: str, shots: Any
) -> None:
    b = start_broker("--auth-token", TOKEN, *FAST_CHECKS, "--stall-after-ms", "500")
    down = f"http://127.0.0.1:{free_port()}/txb/check"  # nothing listens: every check refused
    async with await Client.connect(b.url, auth_token=TOKEN) as c:
        await c.create_topic("orders")
        stalled = await c.prepare("orders", b"{}", producer_group=GROUP, check_url=down, key="o-1")
        waiting = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url=check_url, key="o-2",
            timeout_ms=600_000,
        )  # fmt: skip

        async def is_stalled() -> bool:
            return (await c.show_transaction(stalled.tx_id)).stalled

        await until(is_stalled, "the transaction to stall")
        sign_in(browser, b.http)
        browser.get(f"{b.http}/console/transactions")
        rows = _rows(browser)
        assert "stalled" in rows[stalled.tx_id].split("\n")[1]  # the badge under its id
        assert "checks reach no one: unreachable since" in rows[stalled.tx_id]
        assert "pending" in rows[waiting.tx_id] and "stalled" not in rows[waiting.tx_id]
        shots(browser, "transactions-stalled")

        browser.find_element(CSS, "h2 a.count").click()  # "1 stalled"
        assert browser.current_url.endswith("/console/transactions?state=stalled")
        assert list(_rows(browser)) == [stalled.tx_id]
        headings = [h.text.split(" ")[0] for h in browser.find_elements(CSS, "h2")]
        assert "Stalled" in headings and "Pending" not in headings and "Parked" in headings
        shots(browser, "transactions-stalled-only")
        # Decided by hand from the filtered page, like any pending transaction.
        browser.find_element(CSS, "table.tx a.btn.bad").click()  # Roll back…: asks first
        wait_for(lambda: "/rollback" in browser.current_url, "the confirmation page")
        browser.find_element(CSS, "form.confirm button.bad").click()
        notice = wait_for(lambda: browser.find_elements(CSS, ".notice"), "a notice")[0].text
        assert notice == f"transaction {stalled.tx_id} rolled back"
        assert (await c.show_transaction(stalled.tx_id)).state == "rolled_back"
