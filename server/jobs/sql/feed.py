"""The statements of the owners' feeds: numbering (`operations.feed`),
retention's mark, and the subscriber's reads."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Insert, bindparam, func, select, update

from leasehold._server.jobs.sql.tables import feed_heads, job_events, jobs

_IDS: Any = bindparam("ids", expanding=True)
_OWNER: Any = bindparam("owner")

# The jobs of a batch's events whose operations did not know them (an append's).
SUBJECTS = select(jobs.c.id, jobs.c.owner_id, jobs.c.kind, jobs.c.resource_type, jobs.c.resource_id).where(
    jobs.c.id.in_(_IDS)
)


def advance_heads(dialect_insert: Callable[[Any], Any]) -> Insert:
    """Each owner's head moved on by `last_position` (a count), created at
    that count if new; with the database's own `insert`, which knows ON CONFLICT.
    The update holds the row's lock until the transaction commits."""
    statement = dialect_insert(feed_heads)
    return statement.on_conflict_do_update(  # type: ignore[no-any-return]
        index_elements=[feed_heads.c.owner_id],
        set_={"last_position": feed_heads.c.last_position + statement.excluded.last_position},
    ).returning(feed_heads.c.owner_id, feed_heads.c.last_position)


# The newest position of each owner among a batch of doomed jobs' events.
EXPIRING = (
    select(job_events.c.owner_id, func.max(job_events.c.position))
    .where(job_events.c.job_id.in_(_IDS))
    .group_by(job_events.c.owner_id)
    .order_by(job_events.c.owner_id)
)
MARK_EXPIRED = (
    update(feed_heads)
    .where(feed_heads.c.owner_id == bindparam("owner"), feed_heads.c.expired_through < bindparam("through"))
    .values(expired_through=bindparam("through"))
)

HEAD = select(feed_heads.c.last_position, feed_heads.c.expired_through).where(feed_heads.c.owner_id == _OWNER)
# A page of one owner's feed, each event with its job's kind and resource and
# with retention's mark read in the same statement (one snapshot: a page that
# retention's delete overtook says so).
PAGE = (
    select(
        job_events.c.job_id,
        job_events.c.sequence,
        job_events.c.type,
        job_events.c.payload,
        job_events.c.created_at,
        job_events.c.position,
        jobs.c.kind,
        jobs.c.resource_type,
        jobs.c.resource_id,
        func.coalesce(
            select(feed_heads.c.expired_through).where(feed_heads.c.owner_id == _OWNER).scalar_subquery(), 0
        ).label("expired_through"),
    )
    .join(jobs, jobs.c.id == job_events.c.job_id)
    .where(job_events.c.owner_id == _OWNER, job_events.c.position > bindparam("after"))
    .order_by(job_events.c.position)
    .limit(bindparam("limit"))
)
