"""txbroker tables: the transaction barrier, the consumer inbox, the outbox.

Revision ID: txb_0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "txb_0001"
down_revision = None
branch_labels = ("txbroker",)
depends_on = None


def upgrade() -> None:
    op.create_table(
        "txb_local_tx",
        sa.Column("tx_id", sa.String(64), primary_key=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("topic", sa.String(127), nullable=True),
        sa.Column("key", sa.String(1024), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_txb_local_tx_created", "txb_local_tx", ["created_at"])
    op.create_table(
        "txb_inbox",
        sa.Column("consumer_group", sa.String(127), primary_key=True),
        sa.Column("message_id", sa.String(64), primary_key=True),
        sa.Column(
            "processed_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
    )
    op.create_index("ix_txb_inbox_processed", "txb_inbox", ["processed_at"])
    op.create_table(
        "txb_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("topic", sa.String(127), nullable=False),
        sa.Column("key", sa.String(1024), nullable=True),
        sa.Column("tags", sa.String(1024), nullable=True),
        sa.Column("headers", sa.JSON, nullable=True),
        sa.Column("body", sa.LargeBinary, nullable=False),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()
        ),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("ix_txb_outbox_unpublished", "txb_outbox", ["published_at", "id"])


def downgrade() -> None:
    op.drop_index("ix_txb_outbox_unpublished", "txb_outbox")
    op.drop_table("txb_outbox")
    op.drop_index("ix_txb_inbox_processed", "txb_inbox")
    op.drop_table("txb_inbox")
    op.drop_index("ix_txb_local_tx_created", "txb_local_tx")
    op.drop_table("txb_local_tx")
