"""Idempotent calls (DESIGN §14): the request_id of Enqueue, BatchEnqueue and
Retry, with the first call's result.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from leasehold._server.jobs.sql.tables import UtcTimestamp

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "request_ids",
        sa.Column("owner_id", sa.String(128), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=False),
        sa.Column("method", sa.String(32), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("response", sa.JSON(), nullable=False),
        sa.Column("created_at", UtcTimestamp(), nullable=False),
        sa.PrimaryKeyConstraint("owner_id", "request_id", name="pk_request_ids"),
    )
    op.create_index("ix_request_ids_created_at", "request_ids", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_request_ids_created_at", table_name="request_ids")
    op.drop_table("request_ids")
