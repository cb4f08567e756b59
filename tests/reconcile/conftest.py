"""One local Spark session for the whole test run (starting one costs seconds), and the worlds
the reconciliation tests read: a real broker's log and real service databases filled by the
SDK, the outbox relay and consumers.

Spark needs Java and the JDBC jars of Debian's packages: by hand these tests skip without
them; with CI=true they must run.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from tests.conftest import IN_CI

T = TypeVar("T")


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` on a loop of its own thread (fixtures here are sync and long-lived)."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def _skip_or_fail(why: str) -> None:
    if IN_CI:
        pytest.fail(f"reconciliation tests need {why} under CI=true")
    pytest.skip(f"reconciliation tests need {why}")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        _skip_or_fail("pyspark (pip install -e '.[reconcile]')")
    if shutil.which("java") is None:
        _skip_or_fail("Java")
    from txbroker_reconcile.errors import CannotRun
    from txbroker_reconcile.jars import find_jars
    from txbroker_reconcile.session import spark_session

    try:
        jars = find_jars(["postgresql", "sqlite"])
    except CannotRun as e:
        _skip_or_fail(str(e))
    session = spark_session("local[2]", jars, shuffle_partitions=4)
    yield session
    session.stop()
