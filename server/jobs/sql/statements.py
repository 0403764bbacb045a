"""The statements every SQL engine shares, built once at import.

Building a Core statement and computing its cache key costs more Python time
than SQLite spends running it, so every statement on the hot path is
constructed once, with named parameters, and executed with a dict of values;
SQLAlchemy compiles each one once per dialect and reuses the compiled form.
What differs between engines (claiming, lease recovery, statements over many
leases at once, insert-if-new) is built by each engine's module from the
pieces here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Integer,
    Table,
    and_,
    bindparam,
    false,
    func,
    insert,
    literal,
    not_,
    or_,
    select,
    text,
    true,
    update,
)
from sqlalchemy.sql.dml import Insert, Update
from sqlalchemy.sql.selectable import Select

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.jobs.sql.tables import (
    RESOURCE_ROOT_CONDITION,
    UtcTimestamp,
    job_events,
    jobs,
    paused_kinds,
)
from leasehold._server.jobs.sql.transitions import JOB_COLUMNS, NOW, update_for

QUEUED, RUNNING = sm.QUEUED.value, sm.RUNNING.value

LIMIT = bindparam("limit", type_=Integer())

# The fence of every worker write: this attempt's lease, still running, not expired.
FENCED = and_(
    jobs.c.id == bindparam("job_id"),
    jobs.c.status == RUNNING,
    jobs.c.lease_token == bindparam("token"),
    jobs.c.lease_expires_at > NOW,
)
EXPIRED = and_(jobs.c.status == RUNNING, jobs.c.lease_expires_at <= NOW)
DUE = and_(jobs.c.status == QUEUED, jobs.c.available_at <= NOW)
OVERDUE = and_(jobs.c.status == RUNNING, jobs.c.deadline_at <= NOW)
# The metrics' view of the queue: an index range of the queued jobs (SQLite
# walks ix_jobs_status_available_at; PostgreSQL may take another index led by
# status), grouped by kind, however many finished jobs are kept.
QUEUED_BY_KIND = (
    select(jobs.c.kind, func.count().label("depth"), func.min(jobs.c.available_at).label("oldest"))
    .where(DUE)
    .group_by(jobs.c.kind)
    .order_by(jobs.c.kind)
)
# A heartbeat renews only an attempt still inside its deadline: past it (a
# timeout, a cancel's grace) the lease is as good as lost, and the rescuer ends
# the attempt. A row migrated without a deadline has none to pass.
WITHIN_DEADLINE = or_(jobs.c.deadline_at.is_(None), jobs.c.deadline_at > NOW)


def fence_for(transition: sm.Transition, fence: ColumnElement[bool]) -> ColumnElement[bool]:
    """`fence`, and not past the attempt's deadline when the state machine says
    the transition is refused there (`Transition.within_deadline`)."""
    return and_(fence, WITHIN_DEADLINE) if transition.within_deadline else fence


def claim_order(table: Any = jobs) -> list[ColumnElement[Any]]:
    """`state_machine.CLAIM_ORDER` as ORDER BY columns of `table` (or an alias)."""
    return [table.c[name] for name in sm.CLAIM_ORDER]


def kind_condition(kinds: KindFilter, table: Any = jobs) -> ColumnElement[bool]:
    """`kinds`, less the paused kinds, as a condition on `table` (or an
    alias). The names a remote worker claims arrive as the `kinds`
    parameter; the excluded patterns are fixed for a server's life and
    written into the statement."""
    # A paused kind (AdminService.PauseKind) is read in the statement itself,
    # so a pause committed by any replica holds from the next claim on.
    conditions: list[ColumnElement[bool]] = [table.c.kind.not_in(select(paused_kinds.c.kind))]
    if kinds.only is not None:
        conditions.append(table.c.kind.in_(bindparam("kinds", expanding=True)))
    excluded = kinds.excluding
    if excluded:
        matched = [table.c.kind.startswith(prefix, autoescape=True) for prefix in excluded.prefixes]
        if excluded.exact:
            matched.append(table.c.kind.in_(sorted(excluded.exact)))
        conditions.append(not_(or_(false(), *matched)))
    return and_(true(), *conditions)


def for_owner(source: sm.JobStatus) -> ColumnElement[bool]:
    return and_(
        jobs.c.id == bindparam("job_id"), jobs.c.owner_id == bindparam("owner"), jobs.c.status == source.value
    )


# ----- enqueue ------------------------------------------------------------------------

INSERT_JOB = insert(jobs).returning(*JOB_COLUMNS)
NEW_JOB_COLUMNS = (
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
    "run_at",
    "priority",
    *sm.POLICY_COLUMNS,
    "traceparent",
)
EVENT_COLUMNS = ("job_id", "sequence", "type", "payload", "created_at", "owner_id", "position")
LATEST_FOR_RESOURCE = (
    select(*JOB_COLUMNS)
    .where(
        jobs.c.owner_id == bindparam("owner"),
        jobs.c.resource_type == bindparam("rtype"),
        jobs.c.resource_id == bindparam("rid"),
    )
    .order_by(jobs.c.seq.desc())
    .limit(1)
)


def insert_if_new(dialect_insert: Callable[[Table], Any]) -> Insert:
    """A job insert (with the database's own `insert`, which knows ON CONFLICT)
    that yields no row when the resource's root job already exists. The index
    condition is a literal: PostgreSQL matches an ON CONFLICT's condition to a
    partial index only when it reads the same."""
    return (
        dialect_insert(jobs)
        .on_conflict_do_nothing(
            index_elements=[jobs.c.owner_id, jobs.c.resource_type, jobs.c.resource_id],
            index_where=text(RESOURCE_ROOT_CONDITION),
        )
        .returning(*JOB_COLUMNS)
    )


# ----- claim ----------------------------------------------------------------------------

# A job waiting on its parents is not due at any time the clock can name.
AWAITING_PARENTS = literal(sm.AWAITING_PARENTS, UtcTimestamp())

# A queued job last written in the future was stamped by a wall clock that has
# since stepped back: it keeps its delay, counted from now. Only rows not yet
# due are looked at (an index range).
REANCHOR_AFTER_CLOCK_STEP = (
    update(jobs)
    .where(
        jobs.c.status == QUEUED,
        jobs.c.available_at > NOW,
        jobs.c.available_at < AWAITING_PARENTS,
        jobs.c.updated_at > NOW,
    )
    .values(available_at=NOW + (jobs.c.available_at - jobs.c.updated_at), updated_at=NOW)
)


@functools.cache
def next_wakeup(kinds: KindFilter) -> Select[Any]:
    """The earliest moment something may become claimable for a claimer that
    takes `kinds`: one of its kinds falls due, or any lease expires (a claim
    recovers every expired lease). Only later moments count: a job due already
    that this claim left was held back by a limit (it comes free when a job
    ends, which wakes claimers, or a lease expires), and a queued job of a kind
    the claimer never takes is due now and forever; either would have the
    claimer look again at once, in a loop."""
    return select(
        select(func.min(jobs.c.available_at))
        .where(
            jobs.c.status == QUEUED,
            jobs.c.available_at > NOW,
            jobs.c.available_at < AWAITING_PARENTS,
            kind_condition(kinds),
        )
        .scalar_subquery()
        .label("available"),
        select(func.min(jobs.c.lease_expires_at))
        .where(jobs.c.status == RUNNING)
        .scalar_subquery()
        .label("expiry"),
    )


# What a claim returns beyond the job: its payload, the checkpoint its earlier
# attempts left, and its place in the claim order.
CLAIMED_EXTRA = (jobs.c.payload, jobs.c.checkpoint, jobs.c.seq)

# ----- attempts ---------------------------------------------------------------------------

# One lease's transitions (a success with a result among them); those that run
# for many leases at once (heartbeats, successes without a result) are built by
# each engine over its own many-lease fence.
SINGLE_LEASE: dict[str, Update] = {
    transition.name: update_for(transition, FENCED)
    for transition in (sm.SUCCEED, sm.FAIL, sm.CONFIRM_CANCEL, sm.RELEASE, sm.SNOOZE)
}


# A checkpoint renews the lease as a heartbeat does, so it is fenced alike: not
# past the attempt's deadline either.
SAVE_CHECKPOINT = update_for(
    sm.CHECKPOINT,
    fence_for(sm.CHECKPOINT, FENCED),
    returning=(jobs.c.id, jobs.c.lease_token, jobs.c.cancel_requested_at),
)


# Whose a job is, returned by the statements that write its events, so that
# numbering them in the owner's feed (operations.feed.seal) looks nothing up.
SUBJECT_COLUMNS = (jobs.c.owner_id, jobs.c.kind, jobs.c.resource_type, jobs.c.resource_id)


@dataclass(frozen=True)
class ManyLeaseStatements:
    """What runs for many leases in one statement, over a database's own
    many-lease fence: heartbeats, successes and handler events that queued
    together, and the cancel checks of handlers that reached a safe point in the
    same turn of the loop."""

    heartbeat: Update
    succeed: Update
    # The same success, returning only what its events and its caller's answer
    # need: the runtime asks only which status the job ended in.
    succeed_status: Update
    # Takes each lease's job's next event sequence.
    append_event: Update
    cancel_requested: Select[Any]


def many_leases(fence: ColumnElement[bool]) -> ManyLeaseStatements:
    return ManyLeaseStatements(
        heartbeat=update_for(
            sm.HEARTBEAT,
            fence_for(sm.HEARTBEAT, fence),
            returning=(jobs.c.id, jobs.c.lease_token, jobs.c.cancel_requested_at),
        ),
        succeed=update_for(sm.SUCCEED, fence),
        succeed_status=update_for(
            sm.SUCCEED,
            fence,
            returning=(
                jobs.c.id,
                jobs.c.status,
                jobs.c.attempt,
                jobs.c.last_event_sequence,
                jobs.c.has_dependents,
                *SUBJECT_COLUMNS,
            ),
        ),
        # No row for a lease whose job's log is full (`max_events`) as for a lost one;
        # the repository tells the two apart only when a lease gets no row.
        append_event=update(jobs)
        .where(fence, jobs.c.last_event_sequence < bindparam("max_events"))
        .values(last_event_sequence=jobs.c.last_event_sequence + 1)
        .returning(jobs.c.id, jobs.c.lease_token, jobs.c.last_event_sequence, *SUBJECT_COLUMNS),
        cancel_requested=select(jobs.c.id, jobs.c.lease_token, jobs.c.cancel_requested_at).where(fence),
    )


OWNER_CANCEL: dict[str, Update] = {
    transition.name: update_for(transition, for_owner(transition.source))
    for transition in (sm.CANCEL_QUEUED, sm.REQUEST_CANCEL)
}

# ----- reads --------------------------------------------------------------------------------

_OWNED = and_(jobs.c.id == bindparam("job_id"), jobs.c.owner_id == bindparam("owner"))
# Get shows what a job produced; the owner-side writes read the job without it.
GET_JOB = select(*JOB_COLUMNS, jobs.c.result).where(_OWNED)
GET_JOB_FOR_UPDATE = select(*JOB_COLUMNS).where(_OWNED).with_for_update()
# Locked so a retention sweep on another replica cannot delete the source
# between this read and the retry's insert (which would make a retry of a job
# that is gone); SQLite's single writer needs no lock.
GET_SOURCE_FOR_RETRY = (
    select(jobs)
    .where(jobs.c.id == bindparam("job_id"), jobs.c.owner_id == bindparam("owner"))
    .with_for_update()
)

# GetStats: the owner's jobs per status, and per (kind, status) in kind order,
# both grouped from ix_jobs_owner_id_kind_status alone (migration 0011): a
# range of the owner's own index entries, never the table. The per-kind rows
# stop at `owner_stats.KIND_ROWS`, enough for the kinds the answer lists.
_OWNER = jobs.c.owner_id == bindparam("owner")
OWNER_BY_STATUS = select(jobs.c.status, func.count().label("jobs")).where(_OWNER).group_by(jobs.c.status)
OWNER_BY_KIND = (
    select(jobs.c.kind, jobs.c.status, func.count().label("jobs"))
    .where(_OWNER)
    .group_by(jobs.c.kind, jobs.c.status)
    .order_by(jobs.c.kind, jobs.c.status)
    .limit(LIMIT)
)

LIST_EVENTS = (
    select(job_events)
    .join(jobs, and_(jobs.c.id == job_events.c.job_id, jobs.c.owner_id == bindparam("owner")))
    .where(job_events.c.job_id == bindparam("job_id"), job_events.c.sequence > bindparam("after"))
    .order_by(job_events.c.sequence)
    .limit(bindparam("limit", type_=Integer()))
)
