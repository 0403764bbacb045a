"""Jobs of one status newest first (AdminService): ListAllJobs filtered by
status, and the keyset batches of BulkCancel / BulkRetry, read an index range
instead of walking every job kept.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_status_seq", "jobs", ["status", "seq"])


def downgrade() -> None:
    op.drop_index("ix_jobs_status_seq", table_name="jobs")
