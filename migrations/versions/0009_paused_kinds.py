"""Pausing a kind (DESIGN §14, AdminService.PauseKind), shared by every replica.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from leasehold._server.jobs.sql.tables import UtcTimestamp

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "paused_kinds",
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("paused_at", UtcTimestamp(), nullable=False),
        sa.PrimaryKeyConstraint("kind", name="pk_paused_kinds"),
    )


def downgrade() -> None:
    op.drop_table("paused_kinds")
