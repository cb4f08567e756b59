"""A service with its own Alembic history includes txbroker's migrations as a branch."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config

import txbroker_migrations

ENV = """
from alembic import context
from sqlalchemy import create_engine

engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as conn:
    context.configure(connection=conn, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
"""

SERVICE_REVISION = """
import sqlalchemy as sa
from alembic import op

revision = "svc_0001"
down_revision = None
branch_labels = ("service",)
depends_on = None


def upgrade() -> None:
    op.create_table("widgets", sa.Column("id", sa.Integer, primary_key=True))


def downgrade() -> None:
    op.drop_table("widgets")
"""


def test_service_history_includes_the_txbroker_branch(tmp_path: Path) -> None:
    scripts = tmp_path / "alembic"
    (scripts / "versions").mkdir(parents=True)
    (scripts / "env.py").write_text(ENV)
    (scripts / "versions" / "svc_0001.py").write_text(SERVICE_REVISION)
    ours = Path(txbroker_migrations.__file__).resolve().parent / "versions"
    db = tmp_path / "svc.db"
    cfg = Config()
    cfg.set_main_option("script_location", str(scripts))
    cfg.set_main_option("path_separator", "os")
    cfg.set_main_option("version_locations", f"{scripts / 'versions'}:{ours}")
    cfg.set_main_option("sqlalchemy.url", f"sqlite:///{db}")
    command.upgrade(cfg, "heads")
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("select name from sqlite_master where type='table'")}
        versions = {r[0] for r in conn.execute("select version_num from alembic_version")}
    assert {"widgets", "txb_local_tx", "txb_inbox", "txb_outbox"} <= tables
    assert "txb_0002" in versions and "svc_0001" in versions  # two branches, one history
