"""The owners' feeds: every event carries its job's owner and its place in
that owner's feed, and each owner has a head (its newest position, and how far
retention has deleted).

The events already kept are numbered here, per owner, in the order they were
made (by time, then job, then sequence), so a subscriber starting from the
oldest kept event sees them too.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("job_events", sa.Column("owner_id", sa.String(128), nullable=True))
    op.add_column("job_events", sa.Column("position", sa.BigInteger(), nullable=True))
    op.create_table(
        "feed_heads",
        sa.Column("owner_id", sa.String(128), nullable=False),
        sa.Column("last_position", sa.BigInteger(), nullable=False),
        sa.Column("expired_through", sa.BigInteger(), nullable=False, server_default="0"),
        sa.PrimaryKeyConstraint("owner_id", name="pk_feed_heads"),
    )
    # UPDATE … FROM: PostgreSQL, and SQLite from 3.33.
    op.execute(
        """
        UPDATE job_events SET owner_id = numbered.owner_id, position = numbered.position
        FROM (
            SELECT e.job_id, e.sequence, j.owner_id,
                   row_number() OVER (
                       PARTITION BY j.owner_id ORDER BY e.created_at, e.job_id, e.sequence
                   ) AS position
            FROM job_events e JOIN jobs j ON j.id = e.job_id
        ) AS numbered
        WHERE job_events.job_id = numbered.job_id AND job_events.sequence = numbered.sequence
        """
    )
    op.execute(
        """
        INSERT INTO feed_heads (owner_id, last_position, expired_through)
        SELECT owner_id, max(position), 0 FROM job_events GROUP BY owner_id
        """
    )
    op.create_index("uq_job_events_owner_id_position", "job_events", ["owner_id", "position"], unique=True)


def downgrade() -> None:
    op.drop_index("uq_job_events_owner_id_position", table_name="job_events")
    op.drop_table("feed_heads")
    with op.batch_alter_table("job_events") as batch:
        batch.drop_column("position")
        batch.drop_column("owner_id")
