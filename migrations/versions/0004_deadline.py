"""When a running attempt must have ended (DESIGN §10: server-side timeouts and
cancel grace).

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from leasehold._server.jobs.sql.tables import UtcTimestamp

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("deadline_at", UtcTimestamp(), nullable=True))
        batch.create_index("ix_jobs_status_deadline_at", ["status", "deadline_at"])
    # Attempts running across the upgrade get the deadline a claim would have
    # given them, counted from their last write (timestamps are microseconds):
    # late rather than early, and never none.
    op.execute(
        "UPDATE jobs SET deadline_at = updated_at + timeout_seconds * 1000000 WHERE status = 'running'"
    )


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_status_deadline_at")
        batch.drop_column("deadline_at")
