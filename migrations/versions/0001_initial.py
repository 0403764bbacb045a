"""Jobs and their event logs.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from leasehold._server.jobs.sql.tables import UtcTimestamp

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ROOT_ONLY = "resource_id != '' AND retry_of_job_id IS NULL"


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("id", sa.String(64), nullable=False),
        sa.Column("owner_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(128), nullable=False),
        sa.Column("resource_type", sa.String(256), nullable=False, server_default=""),
        sa.Column("resource_id", sa.String(256), nullable=False, server_default=""),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False, server_default="0"),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("timeout_seconds", sa.Integer(), nullable=False),
        sa.Column("available_at", UtcTimestamp(), nullable=False),
        sa.Column("cancel_requested_at", UtcTimestamp(), nullable=True),
        sa.Column("retry_of_job_id", sa.String(64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.String(256), nullable=True),
        sa.Column("lease_token", sa.String(64), nullable=True),
        sa.Column("lease_expires_at", UtcTimestamp(), nullable=True),
        sa.Column("last_event_sequence", sa.BigInteger(), nullable=False, server_default="0"),
        sa.Column("created_at", UtcTimestamp(), nullable=False),
        sa.Column("updated_at", UtcTimestamp(), nullable=False),
        sa.Column("started_at", UtcTimestamp(), nullable=True),
        sa.Column("completed_at", UtcTimestamp(), nullable=True),
        sa.CheckConstraint(
            "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
            name="ck_jobs_status_known",
        ),
        sa.PrimaryKeyConstraint("seq", name="pk_jobs"),
        sa.UniqueConstraint("id", name="uq_jobs_id"),
    )
    op.create_index("ix_jobs_status_available_at", "jobs", ["status", "available_at", "seq"])
    op.create_index("ix_jobs_status_lease_expires_at", "jobs", ["status", "lease_expires_at"])
    op.create_index("ix_jobs_owner_id_seq", "jobs", ["owner_id", "seq"])
    op.create_index("ix_jobs_owner_id_resource", "jobs", ["owner_id", "resource_type", "resource_id", "seq"])
    op.create_index("ix_jobs_retry_of_job_id", "jobs", ["retry_of_job_id"])
    op.create_index(
        "uq_jobs_resource_root",
        "jobs",
        ["owner_id", "resource_type", "resource_id"],
        unique=True,
        sqlite_where=sa.text(_ROOT_ONLY),
        postgresql_where=sa.text(_ROOT_ONLY),
    )
    op.create_table(
        "job_events",
        sa.Column("job_id", sa.String(64), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(128), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("created_at", UtcTimestamp(), nullable=False),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name="fk_job_events_job_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("job_id", "sequence", name="pk_job_events"),
    )


def downgrade() -> None:
    op.drop_table("job_events")
    op.drop_index("uq_jobs_resource_root", table_name="jobs")
    op.drop_index("ix_jobs_retry_of_job_id", table_name="jobs")
    op.drop_index("ix_jobs_owner_id_resource", table_name="jobs")
    op.drop_index("ix_jobs_owner_id_seq", table_name="jobs")
    op.drop_index("ix_jobs_status_lease_expires_at", table_name="jobs")
    op.drop_index("ix_jobs_status_available_at", table_name="jobs")
    op.drop_table("jobs")
