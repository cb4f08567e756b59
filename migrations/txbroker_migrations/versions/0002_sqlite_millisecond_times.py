"""SQLite: the time columns default to the current time in milliseconds, not whole seconds.

SQLite's ``CURRENT_TIMESTAMP`` has whole seconds, so every latency the reconciliation measured
from these columns was a multiple of 1,000 ms. SQLite cannot change a column's default in
place: each table is rebuilt (copied into a new table, which takes the old one's name), rows
and indexes kept. Rows written before keep their whole seconds. PostgreSQL's ``now()`` already
keeps microseconds: nothing to do there.

Revision ID: txb_0002
Revises: txb_0001
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "txb_0002"
down_revision = "txb_0001"
branch_labels = None
depends_on = None

# Written out rather than imported from the SDK's tables: a revision must keep doing what it
# did when it was written, whatever the tables module says later.
_MILLISECONDS = "(strftime('%Y-%m-%d %H:%M:%f', 'now'))"
_SECONDS = "CURRENT_TIMESTAMP"
_COLUMNS = {
    "txb_local_tx": ("created_at",),
    "txb_inbox": ("processed_at",),
    "txb_outbox": ("created_at",),
}


def _set_defaults(default: str) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table, columns in _COLUMNS.items():
        with op.batch_alter_table(table, recreate="always") as batch:
            for column in columns:
                batch.alter_column(
                    column,
                    existing_type=sa.DateTime(timezone=True),
                    existing_nullable=False,
                    server_default=sa.text(default),
                )


def upgrade() -> None:
    _set_defaults(_MILLISECONDS)


def downgrade() -> None:
    _set_defaults(_SECONDS)
