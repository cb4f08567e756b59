"""The reconciliation on real data: a broker's log and service databases (PostgreSQL for
orders, SQLite for billing) filled by the SDK, read by a real local Spark.

A clean world reports nothing. A dirty world holds one injected case per anomaly reason and
the report lists exactly those ids. An incremental run after more traffic equals a full run.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BrokerProcess
from tests.reconcile import worlds
from tests.reconcile.conftest import run_async, scratch_pg
from tests.reconcile.worlds import Expected
from tests.tx.conftest import tx_broker
from txbroker_reconcile.checks import REASONS
from txbroker_reconcile.export import export_log
from txbroker_reconcile.options import JobOptions, ServiceSpec
from txbroker_reconcile.run import _Progress, reconcile
from txbroker_sdk.schema import upgrade

TWO_HOURS_MS = 2 * 3600 * 1000


@dataclass
class World:
    broker: BrokerProcess
    orders_url: str
    billing_url: str
    expected: Expected

    def options(self, out: Path, **kw: Any) -> JobOptions:
        services = (
            ServiceSpec("orders", self.orders_url, worlds.NAMESPACE),
            ServiceSpec("billing", self.billing_url, "billing", (("copies", "order_id"),)),
        )
        base = JobOptions(
            services=services,
            log=self.broker.data_dir,
            out=out,
            grace_s=0,
            as_of_ms=int(time.time() * 1000) + TWO_HOURS_MS,
            progress=False,
            examples=50,
        )
        return replace(base, **kw)


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    with scratch_pg("txb_rec") as url:
        yield url


def _world(tmp: Path, orders_url: str, *, dirty: bool) -> World:
    billing_url = f"sqlite:///{tmp / 'billing.db'}"
    upgrade(billing_url)
    broker = tx_broker(tmp / "broker").start()
    expected = Expected()

    async def fill() -> None:
        async with worlds.services(broker.url, orders_url, billing_url) as s:
            await worlds.clean_traffic(s)
            if dirty:
                await worlds.inject_lost(s, expected)
                await worlds.inject_phantoms(s, expected)
                await worlds.inject_parked(s, expected)
                await worlds.inject_undecided(s, expected)
            await worlds.consume_all(s)
            if dirty:
                await worlds.inject_effect_twice(s, expected)
                await worlds.inject_unpublished(s, expected)
                await worlds.inject_unprocessed(s, expected)

    try:
        run_async(fill())
    except BaseException:
        broker.stop()
        raise
    return World(broker, orders_url, billing_url, expected)


@pytest.fixture(scope="module")
def dirty(
    spark: Any, pg_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[World, dict[str, Any], Path]]:
    world = _world(tmp_path_factory.mktemp("dirty"), pg_database, dirty=True)
    try:
        out = tmp_path_factory.mktemp("dirty-out")
        summary = reconcile(world.options(out), _Progress(None, False), spark)  # type: ignore[arg-type]
        yield world, summary, out
    finally:
        world.broker.stop()


def _listed(spark: Any, out: Path) -> dict[str, set[str]]:
    rows = spark.read.parquet(str(out / "anomalies")).select("reason", "id").collect()
    found: dict[str, set[str]] = {}
    for r in rows:
        found.setdefault(r["reason"], set()).add(r["id"])
    return found


@pytest.mark.parametrize("reason", list(REASONS))
def test_each_injected_anomaly_is_listed_exactly(
    spark: Any, dirty: tuple[World, dict[str, Any], Path], reason: str
) -> None:
    world, summary, out = dirty
    assert _listed(spark, out).get(reason, set()) == world.expected.ids.get(reason, set())
    counted = sum(r["count"] for r in summary["by_reason"] if r["reason"] == reason)
    assert counted == len(world.expected.ids.get(reason, ()))


def test_the_dirty_world_has_every_kind_and_is_not_clean(
    dirty: tuple[World, dict[str, Any], Path],
) -> None:
    world, summary, _out = dirty
    assert not summary["clean"]
    for kind in ("lost", "phantom", "duplicate", "stuck"):
        assert summary["anomalies"][kind] > 0, kind
    assert sum(summary["anomalies"].values()) == sum(len(v) for v in world.expected.ids.values())


def test_a_clean_world_reports_nothing(spark: Any, tmp_path: Path, pg_database: str) -> None:
    # Its own PostgreSQL database would cost a minute of fixtures; the orders side uses SQLite.
    orders_url = f"sqlite:///{tmp_path / 'orders.db'}"
    upgrade(orders_url)
    world = _world(tmp_path, orders_url, dirty=False)
    try:
        summary = reconcile(world.options(tmp_path / "out"), _Progress(None, False), spark)  # type: ignore[arg-type]
    finally:
        world.broker.stop()
    assert summary["clean"], summary["by_reason"]
    topics = {t["topic"]: t for t in summary["topics"]}
    assert topics["orders"]["messages"] == 12 and topics["orders"]["transactional"] == 12
    assert topics["audit"]["messages"] == 6 and topics["audit"]["outbox"] == 6
    legs = {(r["topic"], r["leg"]) for r in summary["latency"]}
    assert ("orders", "commit → processed") in legs and ("audit", "commit → store") in legs
    # Both databases are SQLite: their times keep milliseconds, so the figures are not whole
    # seconds (all of them a multiple of 1,000 by chance: about one in 10^20).
    figures = [r[k] for r in summary["latency"] for k in ("p50", "max")]
    assert any(v % 1000 for v in figures), figures
    assert summary["inputs"]["whole_second_rows"] == {"orders": 0, "billing": 0}
    # A dozen messages are too few for a p95 or p99: they are not given.
    assert all(
        r["count"] < 20 and r["p95"] is None and r["p99"] is None for r in summary["latency"]
    )


def _comparable(spark: Any, summary: dict[str, Any], out: Path) -> tuple[Any, ...]:
    topics = [{k: v for k, v in t.items() if k != "latency"} for t in summary["topics"]]
    rows = spark.read.parquet(str(out / "anomalies")).collect()
    return summary["anomalies"], topics, sorted(tuple(r) for r in rows)


@pytest.mark.parametrize("source", ["segments", "export"])
def test_an_incremental_run_after_more_traffic_equals_a_full_run(
    spark: Any, tmp_path: Path, source: str
) -> None:
    """The log read from the broker's segments, or from a Parquet export made again after the
    new traffic (a cluster's way): either way the second run reads only what is new."""
    orders_url = f"sqlite:///{tmp_path / 'orders.db'}"
    upgrade(orders_url)
    world = _world(tmp_path, orders_url, dirty=False)
    exported = tmp_path / "export"

    def log() -> Path:
        if source == "segments":
            return world.broker.data_dir
        export_log(world.broker.data_dir, exported)
        return exported

    try:
        as_of = int(time.time() * 1000) + TWO_HOURS_MS
        opts = world.options(tmp_path / "inc", state=tmp_path / "state", as_of_ms=as_of)
        first = reconcile(replace(opts, log=log()), _Progress(None, False), spark)  # type: ignore[arg-type]
        assert first["inputs"]["run"] == 1 and first["clean"]

        async def more() -> None:
            async with worlds.services(world.broker.url, orders_url, world.billing_url) as s:
                await worlds.clean_traffic(s, orders=7, audits=3)
                await worlds.inject_lost(s, world.expected)
                await worlds.consume_all(s)

        run_async(more())
        second = reconcile(replace(opts, log=log()), _Progress(None, False), spark)  # type: ignore[arg-type]
        full = reconcile(
            world.options(tmp_path / "full", log=log(), as_of_ms=as_of),
            _Progress(None, False),
            spark,  # type: ignore[arg-type]
        )
    finally:
        world.broker.stop()
    assert second["inputs"]["run"] == 2
    # The second run kept only the new records (the log) and rows (the tables, give or take
    # the look-back overlap), yet its result is the full run's.
    assert 0 < second["inputs"]["log"]["read_this_run"] < full["inputs"]["log"]["read_this_run"]
    assert _comparable(spark, second, tmp_path / "inc") == _comparable(
        spark, full, tmp_path / "full"
    )
    assert second["anomalies"]["lost"] == 1
    topics = {t["topic"]: t["messages"] for t in second["topics"]}
    assert topics == {"orders": 19, "audit": 9}


def test_the_summary_and_report_files_are_written(
    dirty: tuple[World, dict[str, Any], Path],
) -> None:
    out = dirty[2]
    assert (out / "summary.json").is_file() and (out / "report.html").is_file()
    for table in ("anomalies", "latencies", "topics"):
        assert any((out / table).glob("*.parquet")), table
    html = (out / "report.html").read_text()
    assert "http://" not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in html  # nothing to fetch, nothing to run: it opens offline


def test_the_report_renders_its_charts_offline_in_chromium(
    browser: Any, dirty: tuple[World, dict[str, Any], Path]
) -> None:
    _world, summary, out = dirty
    browser.get((out / "report.html").as_uri())
    charts = browser.find_elements("css selector", "svg.chart")
    # a latency chart per topic, the throughput and the anomalies
    assert len(charts) == len({h["topic"] for h in summary["histograms"]}) + 2
    for chart in charts:
        assert chart.size["width"] > 300 and chart.size["height"] > 100
        assert chart.find_elements("css selector", "rect, polyline")
    fetched = browser.execute_script("return performance.getEntriesByType('resource').length")
    assert fetched == 0  # nothing loaded from anywhere: the file is the whole report
    verdict = browser.find_element("css selector", ".verdict").text
    assert verdict.startswith("Anomalies found") and "lost" in verdict
    labels = browser.execute_script(
        "return [...document.querySelectorAll('svg.chart text.xtick')].map(t => {"
        "  const b = t.getBBox(); return [t.closest('svg').getAttribute('aria-label'),"
        "  b.x, b.x + b.width, t.textContent]; });"
    )
    for chart in {c for c, *_ in labels}:
        boxes = sorted(b[1:] for b in labels if b[0] == chart)
        assert len(boxes) >= 2, chart
        for (_l1, r1, t1), (l2, _r2, t2) in itertools.pairwise(boxes):
            assert r1 <= l2, f"{chart}: {t1!r} overlaps {t2!r}"
    examples = browser.find_elements("css selector", "section code")
    ids = {e.text for e in examples}
    assert ids >= set().union(
        *(v for k, v in _world.expected.ids.items() if k != "effect applied twice")
    )
    browser.save_screenshot(str(out / "report.png"))


def test_partitioned_postgresql_reads_return_every_row_once(
    spark: Any, dirty: tuple[World, dict[str, Any], Path]
) -> None:
    from txbroker_reconcile.sources import ServiceDb

    world = dirty[0]
    spec = ServiceSpec("orders", world.orders_url, worlds.NAMESPACE)
    whole = ServiceDb(spark, spec)
    split = ServiceDb(spark, spec, rows_per_partition=3)  # a dozen rows: several ranges
    for read in ("local_tx", "inbox", "outbox"):
        one, many = getattr(whole, read)(None), getattr(split, read)(None)
        if read != "inbox":  # orders' inbox is empty
            assert many.rdd.getNumPartitions() > 1, read
        assert sorted(map(tuple, many.collect())) == sorted(map(tuple, one.collect())), read
        assert many.count() == one.count()
