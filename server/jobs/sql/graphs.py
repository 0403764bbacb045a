"""The statements of job graphs (`operations.graphs`): each an index seek on
the edges' primary key (parent id first) or on the jobs' id, never a scan."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, bindparam, insert, select, update

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.sql.tables import UtcTimestamp, job_dependencies, jobs

_IDS: Any = bindparam("ids", expanding=True)

# Locks each of the owner's named jobs (the row lock a parent's own ending
# takes too) and marks it as waited on; another owner's ids match nothing.
LOCK_PARENTS = (
    update(jobs)
    .where(jobs.c.owner_id == bindparam("owner"), jobs.c.id.in_(_IDS))
    .values(has_dependents=True)
    .returning(jobs.c.id, jobs.c.status)
)

INSERT_EDGES = insert(job_dependencies)

# What settling a child reads of it (`Rows.waiting_children`).
CHILD_COLUMNS = (
    jobs.c.id,
    jobs.c.status,
    jobs.c.run_at,
    jobs.c.available_at,
    jobs.c.completed_at,
    jobs.c.error_message,
    jobs.c.error_type,
    jobs.c.pending_dependencies,
    jobs.c.on_parent_failure,
    jobs.c.has_dependents,
    jobs.c.last_event_sequence,
)
_WAITING_CHILDREN = (
    select(*CHILD_COLUMNS, job_dependencies.c.parent_id)
    .select_from(job_dependencies.join(jobs, jobs.c.id == job_dependencies.c.child_id))
    .where(
        job_dependencies.c.parent_id.in_(_IDS),
        jobs.c.status == sm.QUEUED.value,
        jobs.c.pending_dependencies > 0,
    )
    # One order for every settling transaction: two parents' endings lock a
    # shared child in the same order, so they cannot deadlock on children.
    .order_by(jobs.c.id)
)
# By whether the database locks rows (SQLite's one writer needs no lock).
WAITING_CHILDREN: dict[bool, Any] = {
    False: _WAITING_CHILDREN,
    True: _WAITING_CHILDREN.with_for_update(of=jobs),
}

WRITE_CHILD = (
    update(jobs)
    .where(jobs.c.id == bindparam("b_id"))
    .values(
        status=bindparam("b_status"),
        available_at=bindparam("b_available_at", type_=UtcTimestamp()),
        completed_at=bindparam("b_completed_at", type_=UtcTimestamp()),
        error_message=bindparam("b_error_message"),
        error_type=bindparam("b_error_type"),
        pending_dependencies=bindparam("b_pending", type_=Integer()),
        last_event_sequence=bindparam("b_sequence"),
        updated_at=bindparam("b_updated_at", type_=UtcTimestamp()),
    )
)

PARENT_RESULTS = select(jobs.c.id, jobs.c.result).where(
    jobs.c.id.in_(_IDS), jobs.c.status == sm.SUCCEEDED.value, jobs.c.result.is_not(None)
)

# A job's children, for List's depends_on filter.
CHILD_IDS = select(job_dependencies.c.child_id).where(job_dependencies.c.parent_id == bindparam("parent"))


def child_parameters(child: Any) -> dict[str, Any]:
    return {
        "b_id": child["id"],
        "b_status": child["status"],
        "b_available_at": child["available_at"],
        "b_completed_at": child["completed_at"],
        "b_error_message": child["error_message"],
        "b_error_type": child["error_type"],
        "b_pending": child["pending_dependencies"],
        "b_sequence": child["last_event_sequence"],
        "b_updated_at": child["updated_at"],
    }
