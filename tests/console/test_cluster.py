"""The console's Cluster page in a real browser: a group of two brokers on a real etcd, seen from
the console of its slave (what `txbroker cluster status` prints), then with etcd hung; and a
broker of no group, which says it is none."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import httpx

from tests.cluster.conftest import _require_etcd
from tests.console.conftest import StartBroker, wait_for
from txbroker.chaos.cluster import Cluster
from txbroker.console.views.cluster import STATUS_TIMEOUT_S
from txbroker_sdk import Client

CSS = "css selector"
NUMBER = re.compile(r"^\d[\d,]*$")


def _text(browser: Any) -> str:
    return str(browser.find_element("tag name", "body").text)


def _rows(browser: Any, table: int) -> list[list[str]]:
    """The cells of the page's ``table``-th table (0: groups, 1: brokers, 2: topic routes)."""
    rows = browser.find_elements(CSS, "main table")[table].find_elements(CSS, "tbody tr")
    return [[td.text for td in tr.find_elements(CSS, "td")] for tr in rows]


async def _ranges(http: httpx.AsyncClient, etcd_url: str) -> int:
    """How many Range requests (reads) etcd has served, from its own metrics."""
    answer = await http.get(etcd_url.replace("etcd://", "http://") + "/metrics")
    for line in answer.text.splitlines():
        if line.startswith("grpc_server_started_total{") and 'grpc_method="Range"' in line:
            return int(float(line.rsplit(" ", 1)[1]))
    raise AssertionError("etcd's metrics count no Range request")


async def test_the_cluster_page_shows_the_group_its_brokers_their_lag_and_a_hung_etcd(
    browser: Any, tmp_path: Path, shots: Any
) -> None:
    _require_etcd()
    async with Cluster(
        tmp_path / "c",
        groups=("g1",),
        per_group=2,
        extra=("--segment-mib", "8"),
        env={"TXB_INDEX_CAPACITY": "65536"},
    ) as cluster:
        await cluster.wait_members("g1")
        await cluster.create_topic("orders", queues=4)
        async with await Client.connect(cluster.url, timeout_s=10) as c:
            for i in range(20):
                await c.send("orders", b'{"n": %d}' % i, key=f"o-{i}")
        master = (await cluster.masters())["g1"].broker_id
        [slave] = [m for m in cluster.members if m.broker_id != master]
        page = f"{slave.proc.http}/console/cluster"

        browser.delete_all_cookies()
        browser.get(f"{slave.proc.http}/console/")
        browser.find_element(CSS, "header nav a[href='/console/cluster']").click()  # the nav
        wait_for(lambda: browser.current_url == page, "the cluster page")
        assert browser.find_element(CSS, "header nav a.active").text == "Cluster"

        def registered() -> list[list[str]]:
            """The brokers' rows once the master's registration holds the 20 messages
            (rewritten every second)."""
            browser.get(page)
            rows = _rows(browser, 1)
            by_id = {r[1].split()[0]: r for r in rows}
            return rows if by_id.get(master, ["?"] * 8)[4] not in ("0", "?") else []

        brokers = wait_for(registered, "the master's flushed offset on the page")
        text = _text(browser)
        assert f"this console: broker {slave.broker_id} of group g1 slave" in text
        [group] = _rows(browser, 0)
        assert group[:3] == ["g1", master, master]  # group, master, the election's holder
        assert group[4] == "2" and NUMBER.match(group[5]), group  # brokers, max lag (bytes)
        by_id = {r[1].split()[0]: r for r in brokers}
        assert set(by_id) == {"g1-a", "g1-b"}
        assert by_id[master][2] == "master" and by_id[slave.broker_id][2] == "slave"
        assert by_id[slave.broker_id][1] == f"{slave.broker_id} this console"
        for row in brokers:
            assert row[0] == "g1" and row[3].startswith("txb://127.0.0.1:"), row
            assert NUMBER.match(row[4]) and NUMBER.match(row[5]), row  # flushed, lag in bytes
            assert re.fullmatch(r"[0-9a-f]+", row[7]), row  # the registration's lease
        assert by_id[master][5] == "0"  # a master trails nobody
        [route] = _rows(browser, 2)
        assert route[:2] == ["orders", "4"] and route[2] == "g1 0-3", route
        shots(browser, "cluster")

        # The page reads through the broker's own etcd session: a view is its three listings
        # (brokers, elections, routes), with no session opened (which reads /txb/ first).
        views = 5
        async with httpx.AsyncClient(timeout=30) as http:
            before = await _ranges(http, cluster.etcd.url)
            for _ in range(views):
                answer = await http.get(page)
                assert answer.status_code == 200 and master in answer.text
            ranges = await _ranges(http, cluster.etcd.url) - before
        assert 3 * views <= ranges < 4 * views, ranges

        # etcd hung (SIGSTOP: its sockets open, nothing answering): the page says so, in time.
        cluster.etcd.pause()
        try:
            started = time.monotonic()
            async with httpx.AsyncClient(timeout=30) as http:
                answer = await http.get(page)
            took_s = time.monotonic() - started
            assert answer.status_code == 200
            assert took_s < STATUS_TIMEOUT_S + 2, took_s
            browser.get(page)
            text = _text(browser)
            assert f"etcd at {cluster.etcd.url} cannot be read now." in text
            assert "no etcd endpoint" in text or f"no answer within {STATUS_TIMEOUT_S:g} s" in text
            assert f"this console: broker {slave.broker_id} of group g1" in text
            assert browser.find_elements(CSS, "main table") == []
            shots(browser, "cluster-etcd-hung")
        finally:
            cluster.etcd.resume()


async def test_a_broker_of_no_group_says_it_is_not_part_of_a_cluster(
    browser: Any, start_broker: StartBroker, shots: Any
) -> None:
    b = start_broker()
    browser.delete_all_cookies()
    browser.get(f"{b.http}/console/cluster")
    text = _text(browser)
    assert "This broker is not part of a cluster" in text
    assert "--coordinator etcd://HOST:2379 --group NAME" in text and "docs/cluster.md" in text
    assert browser.find_element(CSS, "header nav a.active").text == "Cluster"
    shots(browser, "cluster-none")
