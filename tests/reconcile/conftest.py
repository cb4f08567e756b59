"""One local Spark session for the whole test run (starting one costs seconds), and the worlds
the reconciliation tests read: a real broker's log and real service databases filled by the
SDK, the outbox relay and consumers.

Spark needs Java and the JDBC jars of Debian's packages: by hand these tests skip without
them; with CI=true they must run.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

from tests.conftest import IN_CI
from tests.databases import run_async, scratch_pg
from txbroker_sdk.schema import upgrade

__all__ = ["run_async", "scratch_pg"]


def _skip_or_fail(why: str) -> NoReturn:
    if IN_CI:
        pytest.fail(f"reconciliation tests need {why} under CI=true")
    pytest.skip(f"reconciliation tests need {why}")


@pytest.fixture(scope="session")
def spark_jars() -> list[str]:
    """What any Spark here needs (pyspark, Java, the JDBC jars): the jars, or a skip (a
    failure under CI) naming what is missing."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        _skip_or_fail("pyspark (pip install -e '.[reconcile]')")
    if shutil.which("java") is None:
        _skip_or_fail("Java")
    from txbroker_reconcile.errors import CannotRun
    from txbroker_reconcile.jars import find_jars

    try:
        return find_jars(["postgresql", "sqlite"])
    except CannotRun as e:
        _skip_or_fail(str(e))


@pytest.fixture(scope="session")
def spark(spark_jars: list[str]) -> Iterator[Any]:
    from txbroker_reconcile.session import spark_session

    session = spark_session("local[2]", spark_jars, shuffle_partitions=4)
    yield session
    session.stop()


@pytest.fixture
def empty_log(tmp_path: Path) -> Path:
    """A broker data directory holding one empty segment, as a new broker has."""
    segments = tmp_path / "broker" / "store" / "commitlog"
    segments.mkdir(parents=True)
    (segments / f"{0:020d}").write_bytes(bytes(4096))
    return tmp_path / "broker"


@pytest.fixture
def service_db(tmp_path: Path) -> str:
    """A migrated SQLite service database with empty txbroker tables."""
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    upgrade(url)
    return url
