"""The statements of idempotent calls (`idempotency`) over the `request_ids` table.

A call with a request id first inserts the key's row, ON CONFLICT DO NOTHING
on the primary key (owner, request id), with an empty answer; the row it
inserted gets the answer in the same transaction once the call has acted. A
call that inserted nothing is a repeat: the key is taken, and the row says by
which request. On PostgreSQL a second call racing the first waits at its
INSERT until the first commits (or rolls back, and then it acts itself), so
the database decides which one acts, as the resource index does for Enqueue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import bindparam, delete, func, select, update
from sqlalchemy.sql.dml import Insert

from leasehold._server.jobs.sql.tables import jobs, request_ids
from leasehold._server.jobs.sql.transitions import JOB_COLUMNS

_KEY = (request_ids.c.owner_id == bindparam("owner"), request_ids.c.request_id == bindparam("rid"))


def insert_if_new(dialect_insert: Callable[[Any], Any]) -> Insert:
    """The key's row (with the database's own `insert`, which knows ON
    CONFLICT); yields no row when the owner's key is already taken."""
    return (
        dialect_insert(request_ids)
        .on_conflict_do_nothing(index_elements=[request_ids.c.owner_id, request_ids.c.request_id])
        .returning(request_ids.c.owner_id, request_ids.c.request_id)
    )


FIND = select(request_ids.c.method, request_ids.c.fingerprint, request_ids.c.response).where(*_KEY)

SET_RESPONSE = update(request_ids).where(*_KEY).values(response=bindparam("response"))

# The owner's jobs a record names (owner-filtered like every read for an owner).
JOBS_NAMED = select(*JOB_COLUMNS).where(
    jobs.c.id.in_(bindparam("ids", expanding=True)), jobs.c.owner_id == bindparam("owner")
)

# The oldest records made before the cutoff: up to the `limit`-th oldest one's
# time (the records made at that same instant go too), an index range on both
# databases. Deleting by the primary keys of a batch looked up first does not
# stay one: SQLite scans the table for a row-value IN list, and PostgreSQL
# hash-joins one against a scan of the table.
_LAST_OF_BATCH = (
    select(request_ids.c.created_at)
    .where(request_ids.c.created_at < bindparam("cutoff"))
    .order_by(request_ids.c.created_at)
    .limit(1)
    .offset(bindparam("last"))
    .scalar_subquery()
)
FORGET = delete(request_ids).where(
    request_ids.c.created_at < bindparam("cutoff"),
    request_ids.c.created_at <= func.coalesce(_LAST_OF_BATCH, bindparam("cutoff")),
)
