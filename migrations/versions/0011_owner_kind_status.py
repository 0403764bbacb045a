"""An owner's jobs by kind and status (JobService.GetStats): the counts of
every job an owner has are grouped from this index alone, a range of the
owner's own entries, instead of reading their rows or anyone else's.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_jobs_owner_id_kind_status", "jobs", ["owner_id", "kind", "status"])


def downgrade() -> None:
    op.drop_index("ix_jobs_owner_id_kind_status", table_name="jobs")
