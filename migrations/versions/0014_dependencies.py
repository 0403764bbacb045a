"""Job dependencies (graphs of jobs): what each job waits for, how many of its
parents are still pending, what a parent's failure does to it, whether any job
waits on it, and one row per (parent, child) edge, so that a parent's ending
finds its children by index.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Each ADD COLUMN has a constant default (or none): an instant change of the
    # catalogue on both databases, however many jobs there are.
    op.add_column("jobs", sa.Column("depends_on", sa.JSON(), nullable=True))
    op.add_column("jobs", sa.Column("pending_dependencies", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("jobs", sa.Column("on_parent_failure", sa.String(8), nullable=True))
    op.add_column(
        "jobs", sa.Column("has_dependents", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.create_table(
        "job_dependencies",
        sa.Column("parent_id", sa.String(64), nullable=False),
        sa.Column("child_id", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["child_id"], ["jobs.id"], name="fk_job_dependencies_child_id_jobs", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("parent_id", "child_id", name="pk_job_dependencies"),
    )
    op.create_index("ix_job_dependencies_child_id", "job_dependencies", ["child_id"])
    # Retention's walk over finished parents; no job is one yet, so it is empty.
    op.create_index(
        "ix_jobs_parents_completed_at",
        "jobs",
        ["status", "completed_at"],
        sqlite_where=sa.text("has_dependents = true"),
        postgresql_where=sa.text("has_dependents = true"),
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_parents_completed_at", table_name="jobs")
    op.drop_index("ix_job_dependencies_child_id", table_name="job_dependencies")
    op.drop_table("job_dependencies")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("has_dependents")
        batch.drop_column("on_parent_failure")
        batch.drop_column("pending_dependencies")
        batch.drop_column("depends_on")
