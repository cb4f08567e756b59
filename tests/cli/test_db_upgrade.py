"""`txbroker db upgrade` says what it did: created the tables, upgraded them, or found them
current; on a scratch SQLite file and on a fresh PostgreSQL database."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy.exc import SQLAlchemyError

from tests.conftest import IN_CI, run_cli
from tests.databases import PG_URL
from txbroker_sdk.schema import UpgradeResult, upgrade
from txbroker_sdk.testing import scratch_database

HEAD = "txb_0002"


def _upgrade(url: str, *extra: str) -> str:
    out = run_cli("db", "upgrade", "--url", url, *extra, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_sqlite_created_then_already_current(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    assert _upgrade(url) == f"created the txbroker tables (revision {HEAD})"
    assert _upgrade(url) == f"the txbroker tables are already at revision {HEAD}"
    assert json.loads(_upgrade(url, "--json")) == {
        "before": HEAD,
        "after": HEAD,
        "created": False,
        "changed": False,
    }
    tables = {
        r[0]
        for r in sqlite3.connect(tmp_path / "svc.db").execute(
            "select name from sqlite_master where type='table'"
        )
    }
    assert {"txb_local_tx", "txb_inbox", "txb_outbox", "txb_alembic_version"} <= tables


def test_the_result_from_python(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'svc.db'}"
    first = upgrade(url)
    assert (first.before, first.after, first.created, first.changed) == (None, HEAD, True, True)
    again = upgrade(url)
    assert (again.before, again.after, again.created, again.changed) == (HEAD, HEAD, False, False)


def test_the_three_sentences() -> None:
    assert str(UpgradeResult(None, "b")) == "created the txbroker tables (revision b)"
    assert str(UpgradeResult("a", "b")) == "upgraded the txbroker tables from revision a to b"
    assert str(UpgradeResult("b", "b")) == "the txbroker tables are already at revision b"


async def test_postgresql_created_then_already_current() -> None:
    try:
        scratch = scratch_database(PG_URL, "txb_cli_db")
        url = await scratch.__aenter__()
    except (OSError, SQLAlchemyError) as e:
        if IN_CI:
            raise
        pytest.skip(f"PostgreSQL not available at {PG_URL}: {e}")
    try:
        first = await asyncio.to_thread(_upgrade, url, "--json")
        assert json.loads(first) == {
            "before": None,
            "after": HEAD,
            "created": True,
            "changed": True,
        }
        again = await asyncio.to_thread(_upgrade, url)
        assert again == f"the txbroker tables are already at revision {HEAD}"
    finally:
        await scratch.__aexit__(None, None, None)


def test_a_database_it_cannot_reach_is_a_clear_error(tmp_path: Path) -> None:
    out = run_cli("db", "upgrade", "--url", "postgresql://nobody@127.0.0.1:1/x", timeout=60)
    assert out.returncode == 2 and "txbroker: error" in out.stderr
    assert "Traceback" not in out.stderr
