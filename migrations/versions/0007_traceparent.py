"""Tracing (DESIGN §13): the W3C traceparent an Enqueue carried, kept with the
job so each attempt's span joins the caller's trace.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable with no default: existing jobs have no trace, and adding the
    # column rewrites no row on either engine.
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("traceparent", sa.String(55), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("traceparent")
