"""Checkpoints (worker protocol 2): the last checkpoint a job's attempt saved,
a JSON object the next attempt resumes from; NULL for a job that has none.
Nullable with no default, so adding it rewrites no row on either engine.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("checkpoint", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("checkpoint")
