"""A failed attempt's exception type beside its message.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable with no default: adding it rewrites no rows on either engine.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("error_type", sa.String(128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("error_type")
