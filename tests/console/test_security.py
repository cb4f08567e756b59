"""Who may do what in the console, asked over plain HTTP of real brokers (the browser tests
click; these forge what a browser never would): sessions, CSRF tokens, origins, the headers
every answer carries, and the broker without a token."""

from __future__ import annotations

import re

import httpx

from tests.console.conftest import GROUP, TOKEN, StartBroker
from txbroker.console.app import CSP
from txbroker_sdk import Client, Consumer


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert m is not None, "no CSRF token in the page"
    return m.group(1)


async def _signed_in(h: httpx.AsyncClient) -> None:
    r = await h.post("/console/login", data={"token": TOKEN, "next": "/console/transactions"})
    assert r.status_code == 303 and r.headers["location"] == "/console/transactions"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie


async def test_actions_need_a_session_its_csrf_token_and_the_same_origin(
    start_broker: StartBroker, check_url: str
) -> None:
    b = start_broker("--auth-token", TOKEN)
    async with (
        await Client.connect(b.url, auth_token=TOKEN) as c,
        httpx.AsyncClient(base_url=b.http) as h,
    ):
        await c.create_topic("orders")
        tx = await c.prepare(
            "orders", b"{}", producer_group=GROUP, check_url=check_url, timeout_ms=600_000
        )
        r = await h.get("/console/transactions")
        assert r.status_code == 303 and r.headers["location"].startswith("/console/login?next=")
        r = await h.post(f"/console/transactions/{tx.tx_id}/commit", data={"csrf": "x"})
        assert r.status_code == 401 and "Sign in" in r.text

        await _signed_in(h)
        page = await h.get("/console/transactions")
        assert page.status_code == 200 and tx.tx_id in page.text
        for name, value in {
            "content-security-policy": CSP,
            "x-frame-options": "DENY",
            "x-content-type-options": "nosniff",
            "cache-control": "no-store",
        }.items():
            assert page.headers[name] == value
        assert "script-src" not in CSP and "frame-ancestors 'none'" in CSP
        csrf = _csrf(page.text)
        act = f"/console/transactions/{tx.tx_id}/commit"
        origin = b.http  # http://127.0.0.1:PORT, as the browser names this console
        refused = {
            "a wrong CSRF token": ({"csrf": "0" * 64}, {}),
            "no CSRF token": ({"back": "/console"}, {}),
            "another site's origin": ({"csrf": csrf}, {"origin": "http://evil.example"}),
            "a cross-site fetch": ({"csrf": csrf}, {"sec-fetch-site": "cross-site"}),
            "a same-site fetch": ({"csrf": csrf}, {"sec-fetch-site": "same-site"}),
        }
        for why, (form, headers) in refused.items():
            r = await h.post(act, data=form, headers=headers)
            assert r.status_code == 403, why
            assert (await c.show_transaction(tx.tx_id)).state == "prepared", why
        r = await h.post(act, content=b"csrf=" + csrf.encode() + b"&pad=" + b"x" * 20_000,
                         headers={"content-type": "application/x-www-form-urlencoded"})  # fmt: skip
        assert r.status_code == 400  # larger than any console form

        headers = {"origin": origin, "sec-fetch-site": "same-origin"}
        r = await h.post(act, data={"csrf": csrf}, headers=headers)
        assert r.status_code == 303  # a well-formed action, but not from the confirmation page
        assert (await c.show_transaction(tx.tx_id)).state == "prepared"
        assert "from its confirmation page only" in (await h.get("/console/")).text
        confirmation = await h.get(act)
        m = re.search(r'name="seen" value="([^"]+)"', confirmation.text)
        assert confirmation.status_code == 200 and m is not None
        form = {"csrf": csrf, "seen": m.group(1), "back": "//evil.example/x"}
        r = await h.post(act, data=form, headers=headers)
        assert r.status_code == 303 and r.headers["location"] == "/console"  # not elsewhere
        assert (await c.show_transaction(tx.tx_id)).state == "committed"
        page = await h.get("/console/")
        assert f"transaction {tx.tx_id} committed" in page.text  # the notice, once
        assert f"transaction {tx.tx_id} committed" not in (await h.get("/console/")).text

        css = await h.get("/console/static/console.css")
        assert css.headers["content-type"].startswith("text/css")
        assert "no-store" not in css.headers.get("cache-control", "")
        r = await h.post("/console/logout", headers=headers)
        assert r.status_code == 303
        assert (await h.get("/console/")).status_code == 303  # signed out
        assert (await h.get("/v1/topics")).status_code == 401  # the JSON API is as it was


async def test_sign_in_refuses_wrong_tokens_foreign_pages_and_guessing(
    start_broker: StartBroker,
) -> None:
    b = start_broker("--auth-token", TOKEN)
    async with httpx.AsyncClient(base_url=b.http) as h:
        r = await h.post(
            "/console/login", data={"token": TOKEN}, headers={"origin": "http://x.example"}
        )
        assert r.status_code == 403 and "set-cookie" not in r.headers
        r = await h.post("/console/login", data={"token": TOKEN, "next": "https://evil.example"})
        assert r.status_code == 303 and r.headers["location"] == "/console"
        h.cookies.clear()
        for _ in range(10):
            r = await h.post("/console/login", data={"token": "guess"})
            assert r.status_code == 401 and "set-cookie" not in r.headers
        r = await h.post("/console/login", data={"token": TOKEN})
        assert r.status_code == 429  # ten failures a minute: then wait, even with the token


async def test_without_a_token_pages_are_open_and_actions_only_from_this_host(
    start_broker: StartBroker,
) -> None:
    b = start_broker(env={"TXB_MAX_RECONSUME": "0"})
    async with await Client.connect(b.url) as c, httpx.AsyncClient(base_url=b.http) as h:
        await c.create_topic("orders")
        await c.send("orders", b"{}")
        async with Consumer(c, "billing", "orders") as consumer:
            [m] = await consumer.fetch(timeout_ms=5_000)
            assert (await m.nack()).dead_lettered
        page = await h.get("/console/deadletters")
        assert page.status_code == 200 and "1 waiting" in page.text  # open: no sign-in
        assert "SameSite=strict" in page.headers["set-cookie"]  # an anonymous session
        form = {"csrf": _csrf(page.text), "max": "10"}
        # DNS rebinding: a page of evil.example whose name now resolves to 127.0.0.1.
        rebound = {"host": "evil.example", "origin": "http://evil.example"}
        r = await h.post("/console/deadletters/billing/redrive", data=form, headers=rebound)
        assert r.status_code == 403 and "own host" in r.text
        r = await h.post("/console/deadletters/billing/redrive", data=form)
        assert r.status_code == 303
        assert "0 waiting" in (await h.get("/console/deadletters")).text


async def test_the_timeline_survives_a_restart_from_the_log_alone(
    start_broker: StartBroker, check_url: str
) -> None:
    b = start_broker()
    assert f"console: {b.http}/console" in b.log_path.read_text()  # serve names the console
    async with await Client.connect(b.url) as c:
        await c.create_topic("orders")
        committed = await c.prepare("orders", b"{}", producer_group=GROUP, check_url=check_url)
        await committed.commit()
        rolled = await c.prepare("orders", b"{}", producer_group=GROUP, check_url=check_url)
        await rolled.rollback()
    b.stop()
    b.start()  # the coordinator remembers neither now: only the log does
    async with httpx.AsyncClient(base_url=b.http) as h:
        page = (await h.get(f"/console/transactions/{committed.tx_id}")).text
        assert "committed by producer" in page and "visible to consumers" in page
        page = (await h.get(f"/console/transactions/{rolled.tx_id}")).text
        assert "rolled back by producer" in page and "half message at %HALF offset 1" in page
        r = await h.get("/console/transactions/never-prepared")
        assert r.status_code == 404 and "No transaction &#39;never-prepared&#39;" in r.text
