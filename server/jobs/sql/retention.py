"""Retention's statements: which finished jobs have expired, and deleting them
with their events. On PostgreSQL the expired scan locks what it takes with
SKIP LOCKED, so replicas sweeping at once split the work."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Integer, and_, bindparam, delete, exists, false, not_, or_, select, text, true

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.records import TERMINAL_STATUSES, JobStatus
from leasehold._server.jobs.sql.planner_hints import not_an_index_bound
from leasehold._server.jobs.sql.tables import PARENT_CONDITION, job_dependencies, job_events, jobs

_TERMINAL = sorted(status.value for status in TERMINAL_STATUSES)
_CUTOFF: Any = bindparam("cutoff")
_sibling = jobs.alias("sibling")
# A job with a resource key goes only with every job of its key: deleting a
# finished root while its retry still runs would free the key for a second
# root job, and Enqueue's "one root per resource" would no longer hold.
_KEY_STILL_IN_USE = exists(
    select(1)
    .select_from(_sibling)
    .where(
        _sibling.c.owner_id == jobs.c.owner_id,
        _sibling.c.resource_type == jobs.c.resource_type,
        _sibling.c.resource_id == jobs.c.resource_id,
        or_(
            _sibling.c.status.not_in(_TERMINAL),
            _sibling.c.completed_at >= _CUTOFF,
            _sibling.c.completed_at.is_(None),
        ),
    )
)
_LIVE_STATUSES = sorted(status.value for status in sm.LIVE_STATUSES)
_EXPIRED_ROWS = and_(jobs.c.status.in_(_TERMINAL), jobs.c.completed_at < _CUTOFF)
_LIMIT = bindparam("limit", type_=Integer())
# Two statements, not one with "resource_id = '' OR NOT EXISTS (...)": under
# the OR, PostgreSQL hashes the whole subquery, a scan of every job per batch;
# alone, the NOT EXISTS is an anti-join probing ix_jobs_owner_id_resource.
# A parent goes only once none of its children is still to run: a child
# reads its parents' results when it starts. Jobs no child ever waited on
# (has_dependents false) skip the question; two more statements ask it, again
# as anti-joins (on the edges' primary key) rather than under an OR.
_child = jobs.alias("child")
_CHILD_STILL_TO_RUN = exists(
    select(1)
    .select_from(job_dependencies.join(_child, _child.c.id == job_dependencies.c.child_id))
    .where(job_dependencies.c.parent_id == jobs.c.id, _child.c.status.in_(_LIVE_STATUSES))
)
_NOT_A_PARENT = jobs.c.has_dependents == false()
# "No resource key" is no index bound: SQLite, once it has statistics, would
# walk ix_jobs_owner_id_resource for every job without a key instead of the
# expired range of (status, completed_at).
_UNKEYED = not_an_index_bound(jobs.c.resource_id) == ""
_EXPIRED_UNKEYED = select(jobs.c.id).where(_EXPIRED_ROWS, _NOT_A_PARENT, _UNKEYED).limit(_LIMIT)
_EXPIRED_KEYED = (
    select(jobs.c.id)
    .where(_EXPIRED_ROWS, _NOT_A_PARENT, jobs.c.resource_id != "", not_(_KEY_STILL_IN_USE))
    .limit(_LIMIT)
)
_A_PARENT = text(PARENT_CONDITION)
# Parents are found through their own partial index (ix_jobs_parents_completed_at),
# never by walking every finished job; keyed and unkeyed apart, for the
# reason above.
_EXPIRED_PARENTS_UNKEYED = (
    select(jobs.c.id).where(_EXPIRED_ROWS, _A_PARENT, not_(_CHILD_STILL_TO_RUN), _UNKEYED).limit(_LIMIT)
)
_EXPIRED_PARENTS_KEYED = (
    select(jobs.c.id)
    .where(
        _EXPIRED_ROWS, _A_PARENT, not_(_CHILD_STILL_TO_RUN), jobs.c.resource_id != "", not_(_KEY_STILL_IN_USE)
    )
    .limit(_LIMIT)
)
_STATEMENTS = (_EXPIRED_UNKEYED, _EXPIRED_KEYED, _EXPIRED_PARENTS_UNKEYED, _EXPIRED_PARENTS_KEYED)
EXPIRED: dict[bool, tuple[Any, ...]] = {
    False: _STATEMENTS,
    True: tuple(statement.with_for_update(of=jobs, skip_locked=True) for statement in _STATEMENTS),
}
_IDS: Any = bindparam("ids", expanding=True)
DELETE_EVENTS = delete(job_events).where(job_events.c.job_id.in_(_IDS))
# The status is checked again, so a row is never deleted unless it is finished,
# as "not live" rather than "terminal": SQLite, with no statistics, would walk
# ix_jobs_status_completed_at across every finished job to serve "status IN
# (terminal)" instead of looking the batch's ids up (a NOT IN uses no index).
_LIVE = sorted(status.value for status in JobStatus if status not in TERMINAL_STATUSES)
# Which of a batch may go, asked again in the deleting transaction: still
# finished, and for a parent, no child still to run (on PostgreSQL a child
# enqueued between the expired read's snapshot and its row lock is invisible
# to that read's re-check, but not to this statement's own snapshot; once
# asked, the row lock keeps new children out until the delete commits). Two
# statements: under an OR the NOT EXISTS becomes a hashed scan of every live
# job, alone it is an anti-join.
_DELETABLE = and_(jobs.c.id.in_(_IDS), jobs.c.status.not_in(_LIVE))
STILL_EXPIRED = (
    select(jobs.c.id).where(_DELETABLE, _NOT_A_PARENT),
    select(jobs.c.id).where(_DELETABLE, jobs.c.has_dependents == true(), not_(_CHILD_STILL_TO_RUN)),
)
DELETE_JOBS = delete(jobs).where(_DELETABLE)
