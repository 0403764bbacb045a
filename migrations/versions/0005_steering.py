"""Steering the queue (DESIGN §11): run_at, priority, retry policies, the claim
order's index, and the rate limits' token buckets.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from leasehold._server.jobs.sql.tables import UtcTimestamp

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Existing jobs keep the default priority and retry schedule.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("run_at", UtcTimestamp(), nullable=True))
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="3"))
        batch.add_column(sa.Column("retry_initial_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("retry_coefficient", sa.Float(), nullable=True))
        batch.add_column(sa.Column("retry_max_seconds", sa.Float(), nullable=True))
        batch.add_column(sa.Column("non_retryable_error_types", sa.Text(), nullable=True))
        batch.create_check_constraint("ck_jobs_priority_known", "priority BETWEEN 1 AND 5")
        batch.create_index("ix_jobs_claim_order", ["status", "priority", "owner_id", "available_at", "seq"])
    op.create_table(
        "rate_buckets",
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("refilled_at", UtcTimestamp(), nullable=False),
        sa.PrimaryKeyConstraint("kind", name="pk_rate_buckets"),
    )


def downgrade() -> None:
    op.drop_table("rate_buckets")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_index("ix_jobs_claim_order")
        batch.drop_constraint("ck_jobs_priority_known", type_="check")
        for column in (
            "non_retryable_error_types",
            "retry_max_seconds",
            "retry_coefficient",
            "retry_initial_seconds",
            "priority",
            "run_at",
        ):
            batch.drop_column(column)
