"""The statements of job graphs (`operations.graphs`): each an index seek on
the edges' primary key (parent id first) or on the jobs' id, never a scan;
`seek_by_key_only` keeps the planners from walking a status's or an owner's
jobs instead (bench/explain_graphs.py prints the plans)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import bindparam, insert, select, update
from sqlalchemy.sql.dml import Update

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.sql.planner_hints import seek_by_key_only
from leasehold._server.jobs.sql.tables import job_dependencies, jobs

_IDS: Any = bindparam("ids", expanding=True)

# Locks each of the owner's named jobs (the row lock a parent's own ending
# takes too) and marks it as waited on; another owner's ids match nothing.
LOCK_PARENTS = (
    update(jobs)
    .where(seek_by_key_only(jobs.c.owner_id) == bindparam("owner"), jobs.c.id.in_(_IDS))
    .values(has_dependents=True)
    .returning(jobs.c.id, jobs.c.status)
)

INSERT_EDGES = insert(job_dependencies)

# What settling a child reads of it (`Rows.waiting_children`).
CHILD_COLUMNS = (
    jobs.c.id,
    jobs.c.run_at,
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
        seek_by_key_only(jobs.c.status) == sm.QUEUED.value,
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


@functools.cache
def write_children(columns: tuple[str, ...]) -> Update:
    """Each child's `columns` set by its id (`Rows.write_children`), one row
    of an executemany per child. Bound names never repeat a column's."""
    return (
        update(jobs)
        .where(jobs.c.id == bindparam("b_id"))
        .values({column: bindparam(f"b_{column}", type_=jobs.c[column].type) for column in columns})
    )


PARENT_RESULTS = select(jobs.c.id, jobs.c.result).where(
    jobs.c.id.in_(_IDS), seek_by_key_only(jobs.c.status) == sm.SUCCEEDED.value, jobs.c.result.is_not(None)
)

# A job's children, for List's depends_on filter.
CHILD_IDS = select(job_dependencies.c.child_id).where(job_dependencies.c.parent_id == bindparam("parent"))


def child_parameters(child: Any, columns: Sequence[str]) -> dict[str, Any]:
    return {"b_id": child["id"], **{f"b_{column}": child[column] for column in columns}}
