"""The hot path's statements, built once.

Building a Core statement and computing its cache key costs more Python time
than SQLite spends running it, so every statement a claim, an outcome, a
heartbeat, an append or an enqueue runs is constructed here at import, with
named parameters, and executed with a dict of values. SQLAlchemy compiles each
one once per dialect and reuses the compiled form.

Parameter names never repeat a column name (SQLAlchemy reserves those for SET
and VALUES clauses): `now`, `job_id`, `token`, `worker`, `expires_at`, `error`,
`retry_at`, `retryable`, `limit`, `owner`, `after`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from sqlalchemy import (
    Boolean,
    Integer,
    String,
    and_,
    bindparam,
    case,
    func,
    insert,
    null,
    or_,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from leasehold._server.jobs import state_machine
from leasehold._server.jobs.records import JobStatus
from leasehold._server.jobs.sql.bulk import BulkInsert
from leasehold._server.jobs.sql.tables import RESOURCE_ROOT_CONDITION, UtcTimestamp, job_events, jobs

QUEUED, RUNNING = JobStatus.QUEUED.value, JobStatus.RUNNING.value
SUCCEEDED, FAILED, CANCELLED = JobStatus.SUCCEEDED.value, JobStatus.FAILED.value, JobStatus.CANCELLED.value

JOB_COLUMNS = (
    jobs.c.id,
    jobs.c.owner_id,
    jobs.c.kind,
    jobs.c.resource_type,
    jobs.c.resource_id,
    jobs.c.status,
    jobs.c.attempt,
    jobs.c.max_attempts,
    jobs.c.timeout_seconds,
    jobs.c.available_at,
    jobs.c.cancel_requested_at,
    jobs.c.retry_of_job_id,
    jobs.c.error_message,
    jobs.c.error_type,
    jobs.c.created_at,
    jobs.c.updated_at,
    jobs.c.started_at,
    jobs.c.completed_at,
)
RETURNING = (*JOB_COLUMNS, jobs.c.last_event_sequence)
CLEARED_LEASE = {"lease_owner": None, "lease_token": None, "lease_expires_at": None}

NOW = bindparam("now", type_=UtcTimestamp())
_NEXT_SEQUENCE = jobs.c.last_event_sequence + 1
_CANCEL_WINS = jobs.c.cancel_requested_at.is_not(None)

# The fence of every worker write: this attempt's lease, still running, not expired.
FENCED = and_(
    jobs.c.id == bindparam("job_id"),
    jobs.c.status == RUNNING,
    jobs.c.lease_token == bindparam("token"),
    jobs.c.lease_expires_at > NOW,
)
# The same for many leases at once. SQLite: `fences` holds (id, token, 'running')
# rows, `job_ids` their ids: that first condition is what makes SQLite look the
# rows up by id (a plain `status = ...` here would send it down the status index).
_SQLITE_FENCED_MANY = and_(
    jobs.c.id.in_(bindparam("job_ids", expanding=True)),
    tuple_(jobs.c.id, jobs.c.lease_token, jobs.c.status).in_(bindparam("fences", expanding=True)),
    jobs.c.lease_expires_at > NOW,
)
# PostgreSQL: the leases arrive as two arrays (`job_ids`, `tokens`) unnested
# into rows: one parameter each however many leases (psycopg adapts every
# parameter in Python), and one statement text for every batch size, which the
# server then prepares once instead of planning each distinct list length.
_lease_rows = (
    func.unnest(
        bindparam("job_ids", type_=postgresql.ARRAY(String())),
        bindparam("tokens", type_=postgresql.ARRAY(String())),
    )
    .table_valued("job_id", "token")
    .render_derived(name="lease")
)
_POSTGRES_FENCED_MANY = and_(
    jobs.c.id == _lease_rows.c.job_id,
    jobs.c.lease_token == _lease_rows.c.token,
    jobs.c.status == RUNNING,
    jobs.c.lease_expires_at > NOW,
)
FENCED_MANY = {"sqlite": _SQLITE_FENCED_MANY, "postgresql": _POSTGRES_FENCED_MANY}

# ----- enqueue ------------------------------------------------------------------------

INSERT_JOB = insert(jobs).returning(*JOB_COLUMNS)
# Every new job of a batch, and every event, each in one statement (see bulk.py).
INSERT_JOBS = BulkInsert(
    jobs,
    [
        "id",
        "owner_id",
        "kind",
        "resource_type",
        "resource_id",
        "payload",
        "max_attempts",
        "timeout_seconds",
        "status",
        "attempt",
        "available_at",
        "last_event_sequence",
        "created_at",
        "updated_at",
    ],
)
INSERT_EVENTS = BulkInsert(job_events, ["job_id", "sequence", "type", "payload", "created_at"])


@cache
def insert_job_if_new(dialect_name: str) -> Any:
    """INSERT that yields no row when the resource's root job already exists."""
    dialect_insert = postgresql.insert if dialect_name == "postgresql" else sqlite.insert
    return (
        dialect_insert(jobs)
        .on_conflict_do_nothing(
            index_elements=[jobs.c.owner_id, jobs.c.resource_type, jobs.c.resource_id],
            index_where=text(RESOURCE_ROOT_CONDITION),
        )
        .returning(*JOB_COLUMNS)
    )


# ----- claim ----------------------------------------------------------------------------

# A queued job last written in the future was stamped by a wall clock that has
# since stepped back: it keeps its delay, counted from now. Only rows not yet
# due are looked at (an index range).
REANCHOR_AFTER_CLOCK_STEP = (
    update(jobs)
    .where(jobs.c.status == QUEUED, jobs.c.available_at > NOW, jobs.c.updated_at > NOW)
    .values(available_at=NOW + (jobs.c.available_at - jobs.c.updated_at), updated_at=NOW)
)

_EXHAUSTED = and_(jobs.c.cancel_requested_at.is_(None), jobs.c.attempt >= jobs.c.max_attempts)
_EXPIRY_ENDS_JOB = or_(_CANCEL_WINS, _EXHAUSTED)
_RECOVERED = {
    "status": case((_CANCEL_WINS, CANCELLED), (_EXHAUSTED, FAILED), else_=QUEUED),
    "error_message": case((_EXHAUSTED, state_machine.LEASE_EXPIRED_ERROR_TEXT), else_=jobs.c.error_message),
    "error_type": case((_EXHAUSTED, state_machine.LEASE_EXPIRED_ERROR_TYPE), else_=jobs.c.error_type),
    "available_at": case((_EXPIRY_ENDS_JOB, jobs.c.available_at), else_=NOW),
    "completed_at": case((_EXPIRY_ENDS_JOB, NOW), else_=null()),
    "updated_at": NOW,
    "last_event_sequence": jobs.c.last_event_sequence + case((_EXPIRY_ENDS_JOB, 2), else_=1),
    **CLEARED_LEASE,
}
_RECOVERED_COLUMNS = (jobs.c.id, jobs.c.status, jobs.c.attempt, jobs.c.last_event_sequence)
_CLAIMED = {
    "status": RUNNING,
    "attempt": jobs.c.attempt + 1,
    "lease_owner": bindparam("worker"),
    "lease_token": bindparam("token"),
    "lease_expires_at": bindparam("expires_at", type_=UtcTimestamp()),
    "started_at": func.coalesce(jobs.c.started_at, NOW),
    "updated_at": NOW,
    "last_event_sequence": _NEXT_SEQUENCE,
}
_CLAIMED_COLUMNS = (*RETURNING, jobs.c.payload, jobs.c.seq)
_LIMIT = bindparam("limit", type_=Integer())

# SQLite: the writer holds the database's one write lock, so plain statements
# are already atomic. The claim's outer statement filters on `id` alone: with a
# second condition on `status`, SQLite's planner walks every queued job through
# the status index instead of looking up the few ids (the claim then slows down
# with the queue's length). The subquery already chose queued rows inside this
# write transaction.
_SQLITE_RECOVER_EXPIRED_LEASES = (
    update(jobs)
    .where(jobs.c.status == RUNNING, jobs.c.lease_expires_at <= NOW)
    .values(**_RECOVERED)
    .returning(*_RECOVERED_COLUMNS)
)
_SQLITE_LEASE_AVAILABLE = (
    update(jobs)
    .where(
        jobs.c.id.in_(
            select(jobs.c.id)
            .where(jobs.c.status == QUEUED, jobs.c.available_at <= NOW)
            .order_by(jobs.c.available_at, jobs.c.seq)
            .limit(_LIMIT)
            .scalar_subquery()
        )
    )
    .values(**_CLAIMED)
    .returning(*_CLAIMED_COLUMNS)
)

# PostgreSQL: many replicas claim and recover at once, each in its own
# transaction. Each statement first locks the rows it will change with
# FOR UPDATE SKIP LOCKED, in a FROM subquery, which PostgreSQL runs exactly
# once: a row another replica is changing is skipped, not waited for (so
# replicas never queue behind, or deadlock with, each other here), and a row
# that another replica changed since this statement began is checked against
# the conditions again before it is locked (READ COMMITTED re-checks a row
# whose newer version it locks). Then the UPDATE changes just the locked rows.
# No job can be claimed twice, and every replica may recover expired leases at
# the same moment: each expired lease is recovered once.
_candidate = jobs.alias("candidate")
_expired = (
    select(_candidate.c.id)
    .where(_candidate.c.status == RUNNING, _candidate.c.lease_expires_at <= NOW)
    .with_for_update(skip_locked=True)
    .subquery("expired")
)
_POSTGRES_RECOVER_EXPIRED_LEASES = (
    update(jobs).where(jobs.c.id == _expired.c.id).values(**_RECOVERED).returning(*_RECOVERED_COLUMNS)
)
_claimable = (
    select(_candidate.c.id)
    .where(_candidate.c.status == QUEUED, _candidate.c.available_at <= NOW)
    .order_by(_candidate.c.available_at, _candidate.c.seq)
    .limit(_LIMIT)
    .with_for_update(skip_locked=True)
    .subquery("claimable")
)
_POSTGRES_LEASE_AVAILABLE = (
    update(jobs).where(jobs.c.id == _claimable.c.id).values(**_CLAIMED).returning(*_CLAIMED_COLUMNS)
)

# Expired leases back to the queue (or to their end): returns the changed rows.
RECOVER_EXPIRED_LEASES = {
    "sqlite": _SQLITE_RECOVER_EXPIRED_LEASES,
    "postgresql": _POSTGRES_RECOVER_EXPIRED_LEASES,
}
# Up to `limit` due jobs, oldest first, leased to `worker` under `token`.
LEASE_AVAILABLE = {"sqlite": _SQLITE_LEASE_AVAILABLE, "postgresql": _POSTGRES_LEASE_AVAILABLE}

NEXT_WAKEUP = select(
    select(func.min(jobs.c.available_at)).where(jobs.c.status == QUEUED).scalar_subquery().label("available"),
    select(func.min(jobs.c.lease_expires_at))
    .where(jobs.c.status == RUNNING)
    .scalar_subquery()
    .label("expiry"),
)

# ----- attempts ---------------------------------------------------------------------------

# Renews every lease named (see FENCED_MANY); returns the renewed (id, token)s.
RENEW_MANY = {
    flavour: update(jobs)
    .where(fence)
    .values(lease_expires_at=bindparam("expires_at", type_=UtcTimestamp()))
    .returning(jobs.c.id, jobs.c.lease_token)
    for flavour, fence in FENCED_MANY.items()
}

APPEND_EVENT = (
    update(jobs)
    .where(FENCED)
    .values(last_event_sequence=_NEXT_SEQUENCE)
    .returning(jobs.c.last_event_sequence)
)


def _ending(fence: Any = FENCED, **values: Any) -> Any:
    """A fenced UPDATE that ends the attempt and reserves the sequence of the
    event that says how."""
    return (
        update(jobs)
        .where(fence)
        .values(**values, updated_at=NOW, last_event_sequence=_NEXT_SEQUENCE, **CLEARED_LEASE)
        .returning(*RETURNING)
    )


# A pending cancel request wins over a success; a success clears the error of an
# earlier attempt (the event log keeps it). Each job id at most once per call.
SUCCEED_MANY = {
    flavour: _ending(
        fence,
        status=case((_CANCEL_WINS, CANCELLED), else_=SUCCEEDED),
        completed_at=NOW,
        error_message=case((_CANCEL_WINS, jobs.c.error_message), else_=null()),
        error_type=case((_CANCEL_WINS, jobs.c.error_type), else_=null()),
    )
    for flavour, fence in FENCED_MANY.items()
}
MARK_CANCELLED = _ending(status=CANCELLED, completed_at=NOW)

_RETRY = and_(
    bindparam("retryable", type_=Boolean()),
    jobs.c.attempt < jobs.c.max_attempts,
    jobs.c.cancel_requested_at.is_(None),
)
FAIL = _ending(
    status=case((_RETRY, QUEUED), else_=FAILED),
    available_at=case((_RETRY, bindparam("retry_at", type_=UtcTimestamp())), else_=jobs.c.available_at),
    completed_at=case((_RETRY, null()), else_=NOW),
    error_message=bindparam("error"),
    error_type=bindparam("error_type", type_=String()),
)
# Handed back unfinished: claimable again at once, the attempt not counted.
RELEASE = _ending(status=QUEUED, attempt=jobs.c.attempt - 1, available_at=NOW)

# ----- reads --------------------------------------------------------------------------------

GET_JOB = select(*JOB_COLUMNS).where(jobs.c.id == bindparam("job_id"), jobs.c.owner_id == bindparam("owner"))

LIST_EVENTS = (
    select(job_events)
    .join(jobs, and_(jobs.c.id == job_events.c.job_id, jobs.c.owner_id == bindparam("owner")))
    .where(job_events.c.job_id == bindparam("job_id"), job_events.c.sequence > bindparam("after"))
    .order_by(job_events.c.sequence)
    .limit(bindparam("limit", type_=Integer()))
)

CANCEL_REQUESTED = select(jobs.c.cancel_requested_at).where(FENCED)
