"""Recurring schedules and retention (DESIGN §12): the schedules table, and the
index retention deletes finished jobs by.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from leasehold._server.jobs.sql.tables import UtcTimestamp

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("seq", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True),
        sa.Column("owner_id", sa.String(128), nullable=False),
        sa.Column("schedule_id", sa.String(128), nullable=False),
        sa.Column("cron", sa.String(256), nullable=False),
        sa.Column("time_zone", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("retry_initial_seconds", sa.Float(), nullable=True),
        sa.Column("retry_coefficient", sa.Float(), nullable=True),
        sa.Column("retry_max_seconds", sa.Float(), nullable=True),
        sa.Column("non_retryable_error_types", sa.Text(), nullable=True),
        sa.Column("overlap", sa.String(16), nullable=False),
        sa.Column("catchup_window_seconds", sa.BigInteger(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("next_fire_at", UtcTimestamp(), nullable=True),
        sa.Column("last_fire_at", UtcTimestamp(), nullable=True),
        sa.Column("last_job_id", sa.String(64), nullable=True),
        sa.Column("skipped_firings", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("last_skipped_fire_at", UtcTimestamp(), nullable=True),
        sa.Column("last_skip_reason", sa.String(32), nullable=True),
        sa.Column("created_at", UtcTimestamp(), nullable=False),
        sa.Column("updated_at", UtcTimestamp(), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_schedules"),
        sa.CheckConstraint("overlap IN ('skip', 'allow')", name="ck_schedules_overlap_known"),
    )
    op.create_index(
        "uq_schedules_owner_id_schedule_id", "schedules", ["owner_id", "schedule_id"], unique=True
    )
    op.create_index("ix_schedules_next_fire_at", "schedules", ["next_fire_at"])
    op.create_index("ix_jobs_status_completed_at", "jobs", ["status", "completed_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_completed_at", table_name="jobs")
    op.drop_table("schedules")
