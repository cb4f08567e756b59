"""What the console's tests share: brokers started with the flags they need, a check-back
endpoint that never knows the answer (served from its own thread, so the test's event loop may
block on the browser meanwhile), signing in, and the screenshots every page leaves behind in
reports/console/ (named in the run's last lines)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from starlette.applications import Starlette
from starlette.routing import Route

from tests.conftest import ROOT
from txbroker.runtime.brokerproc import BrokerProcess
from txbroker.runtime.httpserve import HttpServer
from txbroker_checkback import CheckbackEndpoint, CheckRequest, CheckStatus

TOKEN = "console-s3cret"
GROUP, SECRET = "shop", "shop-secret"
TRACE_URL = "http://jaeger.example:16686/trace/{trace_id}"
# Back-checks every 100-200 ms, parked after 2 that reached the service: parking in a second.
FAST_CHECKS = (
    "--tx-timeout-ms", "200",
    "--check-backoff-base-ms", "100",
    "--check-backoff-cap-ms", "200",
    "--max-checks", "2",
    "--check-timeout-ms", "1000",
)  # fmt: skip
SHOTS = ROOT / "reports" / "console"
WAIT_S = 20.0  # bound on any wait for the broker or the page to reach a state


StartBroker = Callable[..., BrokerProcess]


@pytest.fixture
def start_broker(tmp_path: Path) -> Iterator[StartBroker]:
    """Start brokers (small files, the given flags and TXB_* settings); all stopped after."""
    started: list[BrokerProcess] = []

    def start(*flags: str, env: dict[str, str] | None = None) -> BrokerProcess:
        b = BrokerProcess(
            tmp_path / f"broker{len(started)}",
            "--segment-mib", "8", "--tx-secret", f"{GROUP}={SECRET}", *flags,
            env={"TXB_INDEX_CAPACITY": "65536", **(env or {})},
        )  # fmt: skip
        started.append(b.start())
        return b

    yield start
    for b in started:
        b.stop()


@pytest.fixture(scope="session")
def check_url() -> Iterator[str]:
    """A service's check-back endpoint that always answers UNKNOWN, on its own thread."""

    async def unknown(_: CheckRequest) -> CheckStatus:
        return CheckStatus.UNKNOWN

    app = Starlette(
        routes=[Route("/txb/check", CheckbackEndpoint(unknown, {GROUP: SECRET}), methods=["POST"])]
    )
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    server = HttpServer(app)
    stop = asyncio.Event()

    async def main() -> None:
        await server.start()
        ready.set()
        await stop.wait()
        await server.stop()

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(WAIT_S), "the check-back endpoint did not start"
    yield f"http://127.0.0.1:{server.port}/txb/check"
    loop.call_soon_threadsafe(stop.set)
    thread.join(WAIT_S)
    loop.close()


@pytest.fixture(scope="session")
def shots(request: pytest.FixtureRequest) -> Iterator[Callable[[Any, str], Path]]:
    """``shot(browser, name)`` saves the whole page as reports/console/<name>.png."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    saved: list[Path] = []

    def shot(browser: Any, name: str) -> Path:
        # The window as tall as the page (within bounds), so the picture holds all of it.
        # (The window's outer size includes the browser's own frame: measure, then correct.)
        height = max(
            600, min(int(browser.execute_script("return document.body.scrollHeight")), 3000)
        )
        browser.set_window_size(1280, height)
        inner = int(browser.execute_script("return window.innerHeight"))
        browser.set_window_size(1280, 2 * height - inner)
        path = SHOTS / f"{name}.png"
        browser.save_screenshot(str(path))
        browser.set_window_size(1280, 1800)
        saved.append(path)
        return path

    yield shot
    if saved:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        line = f"console screenshots ({len(saved)}): {SHOTS}"
        if reporter is not None:
            reporter.write_line(line)
        else:
            print(line)


def sign_in(browser: Any, http: str, page: str = "/console/", token: str = TOKEN) -> None:
    """Open ``page`` of the console, land on the sign-in form, enter ``token``."""
    browser.delete_all_cookies()
    browser.get(f"{http}{page}")
    browser.find_element("id", "token").send_keys(token)
    browser.find_element("css selector", "form button[type=submit]").click()
    wait_for(lambda: "/login" not in browser.current_url, "signing in")


def search(browser: Any, query: str) -> None:
    """Type ``query`` in the search bar every page has, as a person would; return once the
    browser is on its search page. (The submit may return before the navigation it starts: a
    page read then is the old one, and a refresh then may reload the old one instead.)"""
    from selenium.webdriver.common.keys import Keys

    box = browser.find_element("css selector", ".bar input[name=q]")
    box.clear()
    box.send_keys(query, Keys.ENTER)
    wait_for(lambda: f"/console/search?q={quote(query)}" in browser.current_url, "the search")


def wait_for(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll ``condition`` (the state under test) until it is truthy; fail after the bound."""
    from selenium.common.exceptions import StaleElementReferenceException

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            value = condition()
        except StaleElementReferenceException:
            value = None  # the page was replaced while it was read: a navigation under way
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


async def until(condition: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
    """``wait_for`` for an async ``condition`` (a question to the broker)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)
