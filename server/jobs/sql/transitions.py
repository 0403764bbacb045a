"""The state machine's transitions as SQL: each `state_machine.Transition` compiled
once into the SET clause of the one UPDATE that executes it.

A column whose effect differs between branches becomes a CASE over the branch
conditions, in the transition's order, so one statement applies the right
branch to every row it touches (a batch of successes, every expired lease),
and `last_event_sequence` grows by the number of events the chosen branch
writes. Nothing here decides anything: it translates.

Bound parameter names never repeat a column name (SQLAlchemy reserves those for
SET and VALUES clauses): `now`, `job_id`, `token`, `worker`, `expires_at`,
`error`, `error_class`, `retry_at`, `retryable`, `result_value`, `grace_until`,
`jitter`, `error_type_needle`, `checkpoint_value`.

Two functions are not SQL's own on every database: `power` and `strpos`
(PostgreSQL has both; the SQLite engine registers them on its writer's
connection).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    ColumnElement,
    Float,
    String,
    and_,
    bindparam,
    case,
    cast,
    func,
    literal,
    not_,
    null,
    update,
)
from sqlalchemy.sql.dml import Update

from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.sql.tables import UtcTimestamp, jobs

NOW = bindparam("now", type_=UtcTimestamp())
_RETRY_AT = bindparam("retry_at", type_=UtcTimestamp())
_EXPIRES_AT = bindparam("expires_at", type_=UtcTimestamp())
_GRACE_UNTIL = bindparam("grace_until", type_=UtcTimestamp())
MICROSECONDS = 1_000_000  # timestamps are stored as microseconds (tables.UtcTimestamp)
# Durations in microseconds pass PostgreSQL's 32-bit INTEGER after 2,147 s, so
# every product with one is computed as BIGINT (SQLite's integers are 64-bit).
_MICROSECONDS = literal(MICROSECONDS, BigInteger())
# None is SQL NULL (no result), not the JSON value null.
_RESULT = bindparam("result_value", type_=JSON(none_as_null=True))
_CHECKPOINT = bindparam("checkpoint_value", type_=JSON(none_as_null=True))

_JITTER = bindparam("jitter", type_=Float())

_GUARDS: dict[sm.Guard, ColumnElement[bool]] = {
    sm.Guard.CANCEL_REQUESTED: jobs.c.cancel_requested_at.is_not(None),
    sm.Guard.ATTEMPTS_LEFT: jobs.c.attempt < jobs.c.max_attempts,
    sm.Guard.RETRYABLE: bindparam("retryable", type_=Boolean()),
    # Never NULL (a NOT of it must be true for a job without such types).
    sm.Guard.NON_RETRYABLE_TYPE: func.strpos(
        func.coalesce(jobs.c.non_retryable_error_types, ""),
        bindparam("error_type_needle", type_=String()),
    )
    > 0,
}

# The job columns every worker-side UPDATE returns, and what a `Job` is built from.
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
    jobs.c.run_at,
    jobs.c.priority,
    *(jobs.c[column] for column in sm.POLICY_COLUMNS),
    jobs.c.traceparent,
    *(jobs.c[column] for column in sm.DEPENDENCY_COLUMNS),
)
# A success's answer carries what the job produced; a List page does not.
RETURNING = (*JOB_COLUMNS, jobs.c.result, jobs.c.last_event_sequence)


def _backoff() -> Any:
    """`Stamp.BACKOFF` in SQL: the caller's `retry_at`, else
    `state_machine.next_retry_at` for each row's own attempt: by its retry
    policy, or the default schedule's growing steps, then its cap."""
    steps = [(jobs.c.attempt == attempt, _microseconds(seconds)) for attempt, seconds in sm.BACKOFF_STEPS]
    default = case(*steps, else_=_microseconds(sm.MAX_BACKOFF_SECONDS))
    grown = jobs.c.retry_initial_seconds * func.power(
        jobs.c.retry_coefficient, case((jobs.c.attempt > 1, jobs.c.attempt - 1), else_=0)
    )
    capped = case((grown < jobs.c.retry_max_seconds, grown), else_=jobs.c.retry_max_seconds)
    jittered = capped * (1 - sm.RETRY_JITTER * _JITTER) * MICROSECONDS
    by_policy = cast(jittered, BigInteger())
    wait = case((jobs.c.retry_initial_seconds.is_(None), default), else_=by_policy)
    return func.coalesce(_RETRY_AT, NOW + wait)


def _microseconds(seconds: int) -> Any:
    return literal(seconds * MICROSECONDS, BigInteger())


def _stamp(stamp: sm.Stamp, column: Any) -> Any:
    if stamp is sm.Stamp.BACKOFF:
        return _backoff()
    if stamp is sm.Stamp.TIMEOUT:
        return NOW + jobs.c.timeout_seconds * _MICROSECONDS
    if stamp is sm.Stamp.GRACE:
        return case((column < _GRACE_UNTIL, column), else_=_GRACE_UNTIL)
    return {
        sm.Stamp.KEEP: column,
        sm.Stamp.NOW: NOW,
        sm.Stamp.CLEAR: null(),
        sm.Stamp.RETRY_AT: _RETRY_AT,
        sm.Stamp.FIRST: func.coalesce(column, NOW),
    }[stamp]


def _error_message(error: sm.Error) -> Any:
    return {
        sm.Error.KEEP: jobs.c.error_message,
        sm.Error.CLEAR: null(),
        sm.Error.FROM_CALLER: bindparam("error", type_=String()),
        sm.Error.LEASE_EXPIRED: literal(sm.LEASE_EXPIRED_ERROR_TEXT),
        sm.Error.TIMED_OUT: literal(sm.TIMEOUT_ERROR_TEXT),
    }[error]


def _error_type(error: sm.Error) -> Any:
    return {
        sm.Error.KEEP: jobs.c.error_type,
        sm.Error.CLEAR: null(),
        sm.Error.FROM_CALLER: bindparam("error_class", type_=String()),
        sm.Error.LEASE_EXPIRED: literal(sm.LEASE_EXPIRED_ERROR_TYPE),
        sm.Error.TIMED_OUT: literal(sm.TIMEOUT_ERROR_TYPE),
    }[error]


def _lease(column: str) -> Callable[[sm.LeaseChange], Any]:
    taken = {
        "lease_owner": bindparam("worker"),
        "lease_token": bindparam("token"),
        "lease_expires_at": _EXPIRES_AT,
    }

    def effect(change: sm.LeaseChange) -> Any:
        if change is sm.LeaseChange.TAKE:
            return taken[column]
        if change is sm.LeaseChange.EXTEND and column == "lease_expires_at":
            return _EXPIRES_AT
        if change is sm.LeaseChange.CLEAR:
            return null()
        return jobs.c[column]

    return effect


# Each column's effect in a branch, as (what distinguishes it, its SQL).
_EFFECTS: dict[str, Callable[[sm.Branch], tuple[object, Any]]] = {
    "status": lambda b: (b.status, literal(b.status.value)),
    "attempt": lambda b: (b.attempt, jobs.c.attempt + b.attempt if b.attempt else jobs.c.attempt),
    "last_event_sequence": lambda b: (
        len(b.events),
        jobs.c.last_event_sequence + len(b.events) if b.events else jobs.c.last_event_sequence,
    ),
    "updated_at": lambda b: (b.touches, NOW if b.touches else jobs.c.updated_at),
    "error_message": lambda b: (b.error, _error_message(b.error)),
    "error_type": lambda b: (b.error, _error_type(b.error)),
    "result": lambda b: (
        b.result,
        _RESULT if b.result is sm.Result.FROM_CALLER else jobs.c.result,
    ),
    "checkpoint": lambda b: (
        b.checkpoint,
        _CHECKPOINT if b.checkpoint is sm.Checkpoint.FROM_CALLER else jobs.c.checkpoint,
    ),
    **{
        column: (lambda c: lambda b: (getattr(b, c), _stamp(getattr(b, c), jobs.c[c])))(column)
        for column in sm.STAMPED_COLUMNS
    },
    **{
        column: (lambda c: lambda b: (b.lease, _lease(c)(b.lease)))(column)
        for column in ("lease_owner", "lease_token", "lease_expires_at")
    },
}


def _condition(branch: sm.Branch) -> ColumnElement[bool]:
    parts = [_GUARDS[guard] if wanted else not_(_GUARDS[guard]) for guard, wanted in branch.when]
    return and_(*parts)


def set_values(transition: sm.Transition) -> dict[str, Any]:
    """The SET clause executing `transition`: only the columns some branch changes."""
    values: dict[str, Any] = {}
    for column, effect in _EFFECTS.items():
        per_branch = [effect(branch) for branch in transition.branches]
        sql_values = [sql for _, sql in per_branch]
        if all(sql is jobs.c[column] for sql in sql_values):
            continue  # every branch keeps it
        if column == "status" and {b.status for b in transition.branches} == {transition.source}:
            continue  # a transition that stays where it started (a heartbeat)
        if len({key for key, _ in per_branch}) == 1:
            values[column] = sql_values[0]
            continue
        whens = [(_condition(b), sql) for b, sql in zip(transition.branches[:-1], sql_values, strict=False)]
        values[column] = case(*whens, else_=sql_values[-1])
    return values


def update_for(
    transition: sm.Transition, where: ColumnElement[bool], returning: tuple[Any, ...] = RETURNING
) -> Update:
    """`transition` as one UPDATE of the rows `where` selects (which must include
    the transition's source status), returning by default what a `Job` and its
    events are built from."""
    return update(jobs).where(where).values(**set_values(transition)).returning(*returning)


def parameters(inputs: sm.Inputs) -> dict[str, Any]:
    """The statement parameters for `inputs` (a statement ignores those it does not use)."""
    return {
        "now": inputs.now,
        "retryable": inputs.retryable,
        "error": inputs.error,
        "error_class": inputs.error_type,
        "retry_at": inputs.retry_at,
        "worker": inputs.worker,
        "token": inputs.token,
        "expires_at": inputs.expires_at,
        "result_value": inputs.result,
        "grace_until": inputs.grace_until,
        "jitter": inputs.jitter,
        "checkpoint_value": inputs.checkpoint,
        "error_type_needle": sm.error_type_needle(inputs.error_type),
    }
