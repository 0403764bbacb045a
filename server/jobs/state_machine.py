"""The job state machine: every transition, what it changes, and the lifecycle
events written with it.

This module decides; storage engines only execute. A transition is data: the
status a job must be in, how the engine must find it (by its lease, by an
expired lease, by being due, or for its owner), and a list of branches, each
with the conditions under which it applies, the new status, what happens to
each counter and timestamp, and the events it writes. The SQL engines compile
each transition once into one UPDATE whose SET clauses are CASE expressions over
the branches (so a batch of many jobs is still one statement), and the
in-memory engine applies it in Python with `Transition.apply`. Both read the
same table below, and the repository contract suite holds them to it.

Within a transition every branch ends in a different status, so an engine that
gets the changed row back knows which branch was taken (`branch_for`) and so
which events to write and with which sequences.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from leasehold._server.jobs.ids import new_job_id
from leasehold._server.jobs.records import (
    Job,
    JobStatus,
    JsonObject,
    NewJob,
    ParentFailurePolicy,
    RetryPolicy,
)

QUEUED, RUNNING = JobStatus.QUEUED, JobStatus.RUNNING
SUCCEEDED, FAILED, CANCELLED = JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED

MAX_BACKOFF_SECONDS = 30
TIMEOUT_ERROR_TEXT = "Background job timed out."
TIMEOUT_ERROR_TYPE = "TimeoutError"
LEASE_EXPIRED_ERROR_TEXT = "Background job lease expired."
LEASE_EXPIRED_ERROR_TYPE = "LeaseExpired"
# How long a running attempt may go on after its owner asked it to stop, unless
# the service is told otherwise (serve --cancel-grace-seconds): one default lease.
DEFAULT_CANCEL_GRACE_SECONDS = 30.0

# Within one owner and priority, what is claimed first: the earliest due, then
# the earliest enqueued. `seq` is insertion order (timestamps come from a clock
# that can repeat or step back). Which owner and priority go first is
# `fair_share`'s to decide.
CLAIM_ORDER = ("available_at", "seq")

# The available_at of a queued job whose parents have not all ended as it
# waits for (`pending_dependencies` above 0): later than any time a job falls
# due, so the claim's walk, the due counts and the next wake-up pass it by in
# the indexes they already use; its release (`dependencies_met`) sets the real
# one. Far below the integer microseconds a timestamp is stored in.
AWAITING_PARENTS = datetime(9999, 1, 1, tzinfo=UTC)

TERMINAL_EVENT_TYPES = frozenset({"job.succeeded", "job.failed", "job.cancelled"})


# A retry policy's waits are shortened by up to this share, at random, so that
# jobs failing together (a dependency went down) do not all come back together;
# a wait never exceeds the policy's own schedule.
RETRY_JITTER = 0.2


def backoff_seconds(attempt: int) -> int:
    """Seconds to wait before the attempt after `attempt` (1-based) may start,
    for a job without a retry policy."""
    return min(MAX_BACKOFF_SECONDS, 2 ** min(attempt, 16))


def policy_backoff_seconds(policy: RetryPolicy, attempt: int, jitter: float) -> float:
    """The wait after failed attempt `attempt` (1-based) under `policy`;
    `jitter` in [0, 1) is the random draw that shortens it."""
    exponent = max(attempt - 1, 0)
    grown = policy.initial_interval_seconds * math.pow(policy.backoff_coefficient, exponent)
    capped = grown if grown < policy.max_interval_seconds else policy.max_interval_seconds
    return capped * (1 - RETRY_JITTER * jitter)


def next_retry_at(now: datetime, job: Mapping[str, Any], jitter: float) -> datetime:
    """When the attempt after the job's current one may start, by its own policy
    (read from its columns) or else the default schedule."""
    policy = retry_policy_of(job)
    if policy is None:
        return now + timedelta(seconds=backoff_seconds(job["attempt"]))
    # Whole microseconds, cut as the SQL engines cut them.
    wait = policy_backoff_seconds(policy, job["attempt"], jitter) * 1_000_000
    return now + timedelta(microseconds=int(wait))


# ----- a retry policy in a job's columns ------------------------------------------------

# The columns a job keeps its retry policy in (all NULL: no policy). The error
# types are one text with a separator before, between and after the names, so a
# name is found whole by looking for it with a separator on each side.
POLICY_COLUMNS = (
    "retry_initial_seconds",
    "retry_coefficient",
    "retry_max_seconds",
    "non_retryable_error_types",
)
ERROR_TYPE_SEPARATOR = "\x1f"

# What a retry copies from its source job, whoever makes it (Retry, BulkRetry,
# on any engine); a retry continues its source's trace too.
RETRY_COPIES = (
    "owner_id",
    "kind",
    "resource_type",
    "resource_id",
    "payload",
    "max_attempts",
    "timeout_seconds",
    "run_at",
    "priority",
    *POLICY_COLUMNS,
    "traceparent",
    "depends_on",
    "on_parent_failure",
)


def retry_values(source: Mapping[Any, Any]) -> dict[str, Any]:
    """A retry's columns, from its source job's, less the new job's id."""
    return {**{column: source[column] for column in RETRY_COPIES}, "retry_of_job_id": source["id"]}


def policy_columns(policy: RetryPolicy | None) -> dict[str, Any]:
    if policy is None:
        return dict.fromkeys(POLICY_COLUMNS)
    names = policy.non_retryable_error_types
    return {
        "retry_initial_seconds": policy.initial_interval_seconds,
        "retry_coefficient": policy.backoff_coefficient,
        "retry_max_seconds": policy.max_interval_seconds,
        "non_retryable_error_types": _joined(names) if names else None,
    }


def retry_policy_of(job: Mapping[str, Any]) -> RetryPolicy | None:
    if job["retry_initial_seconds"] is None:
        return None
    stored = job["non_retryable_error_types"]
    return RetryPolicy(
        initial_interval_seconds=job["retry_initial_seconds"],
        backoff_coefficient=job["retry_coefficient"],
        max_interval_seconds=job["retry_max_seconds"],
        non_retryable_error_types=tuple(filter(None, (stored or "").split(ERROR_TYPE_SEPARATOR))),
    )


def _joined(names: tuple[str, ...]) -> str:
    return ERROR_TYPE_SEPARATOR + ERROR_TYPE_SEPARATOR.join(names) + ERROR_TYPE_SEPARATOR


def error_type_needle(error_type: str | None) -> str:
    """What to look for in a job's stored error types to tell whether
    `error_type` is one of them: the name between separators. With no error
    type, two separators in a row, which no stored list holds."""
    return _joined((error_type,)) if error_type else ERROR_TYPE_SEPARATOR * 2


def requested_retry_at(now: datetime, retry_after_seconds: float | None) -> datetime | None:
    """The retry time a failing worker asked for, if it did (else the job's
    backoff applies: `Stamp.BACKOFF`)."""
    return None if retry_after_seconds is None else now + timedelta(seconds=retry_after_seconds)


# Attempts whose backoff is still growing; every later one waits MAX_BACKOFF_SECONDS.
BACKOFF_STEPS = tuple(
    (attempt, backoff_seconds(attempt))
    for attempt in range(1, 17)
    if backoff_seconds(attempt) < MAX_BACKOFF_SECONDS
)


def rfc3339(moment: datetime) -> str:
    """A UTC instant as RFC 3339 text ending in Z, as protobuf's JSON prints
    timestamps, for times carried inside event payloads."""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


class Find(StrEnum):
    """How an engine finds the rows a transition applies to, besides their status."""

    LEASE = "lease"  # the caller's lease: this id and token, lease not yet expired
    EXPIRED = "expired"  # every job whose lease has expired
    DUE = "due"  # queued jobs whose available_at has come, in CLAIM_ORDER
    OWNER = "owner"  # one job of the calling owner
    # every running job past its deadline_at (its timeout, or a cancel's grace)
    OVERDUE = "overdue"


class Guard(StrEnum):
    """A condition a branch may require, over the job and the caller's input."""

    CANCEL_REQUESTED = "cancel_requested"  # the job's cancel_requested_at is set
    ATTEMPTS_LEFT = "attempts_left"  # attempt < max_attempts
    RETRYABLE = "retryable"  # the caller's `retryable` input
    # The caller's `error_type` is one of the job's non-retryable error types.
    NON_RETRYABLE_TYPE = "non_retryable_type"


class Stamp(StrEnum):
    """What happens to a timestamp column."""

    KEEP = "keep"
    NOW = "now"
    CLEAR = "clear"
    RETRY_AT = "retry_at"  # the caller's `retry_at` input
    FIRST = "first"  # now, unless already set
    # The caller's `retry_at` if it gave one (a worker said how long to wait), else
    # now plus the backoff after the job's current attempt, by the job's retry
    # policy (its columns) shortened by the caller's `jitter`, or the default.
    BACKOFF = "backoff"
    TIMEOUT = "timeout"  # now plus the job's timeout_seconds
    GRACE = "grace"  # the caller's `grace_until`, unless the column is already earlier


class Error(StrEnum):
    """What happens to error_message and error_type."""

    KEEP = "keep"
    CLEAR = "clear"
    FROM_CALLER = "from_caller"  # the caller's `error` and `error_type` inputs
    LEASE_EXPIRED = "lease_expired"
    TIMED_OUT = "timed_out"


class Result(StrEnum):
    """What happens to the job's result."""

    KEEP = "keep"
    FROM_CALLER = "from_caller"  # the caller's `result` input (None: the job produced none)


class Checkpoint(StrEnum):
    """What happens to the job's checkpoint: what its last attempt saved of its
    progress, so the next one resumes there. No transition clears it (a retry
    after a failure, a recovered lease and a snooze all keep it); it goes with
    the job, and a manual Retry's new job starts without one."""

    KEEP = "keep"
    FROM_CALLER = "from_caller"  # the caller's `checkpoint` input


class LeaseChange(StrEnum):
    KEEP = "keep"
    TAKE = "take"  # the caller's `worker`, `token` and `expires_at` inputs
    EXTEND = "extend"  # the caller's `expires_at` input
    CLEAR = "clear"


@dataclass(frozen=True)
class Branch:
    status: JobStatus
    # Every condition must hold (True) or not hold (False) for the branch to apply.
    when: tuple[tuple[Guard, bool], ...] = ()
    events: tuple[str, ...] = ()
    attempt: int = 0  # added to the attempt counter
    lease: LeaseChange = LeaseChange.CLEAR
    available_at: Stamp = Stamp.KEEP
    started_at: Stamp = Stamp.KEEP
    completed_at: Stamp = Stamp.KEEP
    cancel_requested_at: Stamp = Stamp.KEEP
    # When the running attempt must have ended: set by a claim, brought forward
    # by a cancel request (its grace), enforced by the rescuer (Find.OVERDUE).
    deadline_at: Stamp = Stamp.KEEP
    error: Error = Error.KEEP
    result: Result = Result.KEEP
    checkpoint: Checkpoint = Checkpoint.KEEP
    touches: bool = True  # updated_at = now

    def applies(self, job: Mapping[str, Any], inputs: Inputs) -> bool:
        return all(_guard(guard, job, inputs) is wanted for guard, wanted in self.when)


@dataclass(frozen=True)
class Transition:
    name: str
    source: JobStatus
    find: Find
    # The first branch that applies is taken; the last one applies always.
    branches: tuple[Branch, ...]
    # Refused for an attempt past its deadline (a timeout, a cancel's grace),
    # however live its lease: a renewal must not outlast what the rescuer ends.
    within_deadline: bool = False
    _by_status: dict[JobStatus, Branch] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.branches[-1].when:
            raise ValueError(f"{self.name}: the last branch must apply unconditionally")
        by_status = {branch.status: branch for branch in self.branches}
        if len(by_status) != len(self.branches):
            raise ValueError(f"{self.name}: every branch must end in its own status")
        object.__setattr__(self, "_by_status", by_status)

    @property
    def backs_off(self) -> bool:
        """Whether a branch waits out a backoff (and so reads the caller's `jitter`)."""
        return any(branch.available_at is Stamp.BACKOFF for branch in self.branches)

    def choose(self, job: Mapping[str, Any], inputs: Inputs) -> Branch:
        return next(branch for branch in self.branches if branch.applies(job, inputs))

    def branch_for(self, status: JobStatus | str) -> Branch:
        """The branch that left a job in `status` (read back from the changed row;
        a StrEnum member and its text are the same key)."""
        return self._by_status[status]  # type: ignore[index]

    def apply(self, job: Mapping[str, Any], inputs: Inputs) -> tuple[dict[str, Any], Branch]:
        """The job's columns after this transition, and the branch taken: the
        in-memory engine's execution of what the SQL engines compile."""
        branch = self.choose(job, inputs)
        now = inputs.now
        new = dict(job)
        new["status"] = branch.status.value
        new["attempt"] = job["attempt"] + branch.attempt
        for column in STAMPED_COLUMNS:
            new[column] = _stamp(getattr(branch, column), job, column, inputs)
        if branch.error is not Error.KEEP:
            new["error_message"], new["error_type"] = _error(branch.error, inputs)
        if branch.result is Result.FROM_CALLER:
            new["result"] = inputs.result
        if branch.checkpoint is Checkpoint.FROM_CALLER:
            new["checkpoint"] = inputs.checkpoint
        if branch.lease is LeaseChange.TAKE:
            new.update(
                lease_owner=inputs.worker, lease_token=inputs.token, lease_expires_at=inputs.expires_at
            )
        elif branch.lease is LeaseChange.EXTEND:
            new["lease_expires_at"] = inputs.expires_at
        elif branch.lease is LeaseChange.CLEAR:
            new.update(lease_owner=None, lease_token=None, lease_expires_at=None)
        if branch.touches:
            new["updated_at"] = now
        new["last_event_sequence"] = job["last_event_sequence"] + len(branch.events)
        return new, branch


@dataclass(frozen=True)
class Inputs:
    """What the caller of a transition supplies. Engines pass these as the
    statement's parameters; a transition reads only those its branches name."""

    now: datetime
    retryable: bool = True
    error: str | None = None
    error_type: str | None = None
    retry_at: datetime | None = None
    worker: str | None = None
    token: str | None = None
    expires_at: datetime | None = None
    result: Any = None  # what a success produced (as the engine stores it), or None
    grace_until: datetime | None = None  # the end of a cancel request's grace
    jitter: float = 0.0  # in [0, 1): a random draw shortening a retry policy's wait
    checkpoint: Any = None  # what the attempt saved of its progress (as the engine stores it)


def _guard(guard: Guard, job: Mapping[str, Any], inputs: Inputs) -> bool:
    if guard is Guard.CANCEL_REQUESTED:
        return job["cancel_requested_at"] is not None
    if guard is Guard.ATTEMPTS_LEFT:
        return bool(job["attempt"] < job["max_attempts"])
    if guard is Guard.NON_RETRYABLE_TYPE:
        return error_type_needle(inputs.error_type) in (job["non_retryable_error_types"] or "")
    return inputs.retryable


STAMPED_COLUMNS = ("available_at", "started_at", "completed_at", "cancel_requested_at", "deadline_at")


def _stamp(stamp: Stamp, job: Mapping[str, Any], column: str, inputs: Inputs) -> datetime | None:
    current: datetime | None = job[column]
    if stamp is Stamp.KEEP:
        return current
    if stamp is Stamp.NOW:
        return inputs.now
    if stamp is Stamp.FIRST:
        return current if current is not None else inputs.now
    if stamp is Stamp.RETRY_AT:
        return inputs.retry_at
    if stamp is Stamp.BACKOFF:
        return inputs.retry_at or next_retry_at(inputs.now, job, inputs.jitter)
    if stamp is Stamp.TIMEOUT:
        return inputs.now + timedelta(seconds=job["timeout_seconds"])
    if stamp is Stamp.GRACE:
        assert inputs.grace_until is not None, "a cancel request names the end of its grace"
        return current if current is not None and current < inputs.grace_until else inputs.grace_until
    return None


def _error(error: Error, inputs: Inputs) -> tuple[str | None, str | None]:
    if error is Error.FROM_CALLER:
        return inputs.error, inputs.error_type
    if error is Error.LEASE_EXPIRED:
        return LEASE_EXPIRED_ERROR_TEXT, LEASE_EXPIRED_ERROR_TYPE
    if error is Error.TIMED_OUT:
        return TIMEOUT_ERROR_TEXT, TIMEOUT_ERROR_TYPE
    return None, None


# ----- the transitions ---------------------------------------------------------------

CLAIM = Transition(
    "claim",
    QUEUED,
    Find.DUE,
    (
        Branch(
            RUNNING,
            events=("job.started",),
            attempt=1,
            lease=LeaseChange.TAKE,
            started_at=Stamp.FIRST,
            deadline_at=Stamp.TIMEOUT,
        ),
    ),
)

HEARTBEAT = Transition(
    "heartbeat",
    RUNNING,
    Find.LEASE,
    (Branch(RUNNING, lease=LeaseChange.EXTEND, touches=False),),
    within_deadline=True,
)

# The lease holder saves how far it got (and, being alive, renews its lease in
# the same write): fenced like a heartbeat, so a stale attempt's checkpoint is
# never stored, and kept by every later transition for the next attempt.
CHECKPOINT = Transition(
    "checkpoint",
    RUNNING,
    Find.LEASE,
    (Branch(RUNNING, lease=LeaseChange.EXTEND, checkpoint=Checkpoint.FROM_CALLER, touches=False),),
    within_deadline=True,
)

# A pending cancel request wins over a success (and its result is dropped); a
# success clears the error of an earlier attempt (the event log keeps it) and
# keeps what the job produced.
SUCCEED = Transition(
    "succeed",
    RUNNING,
    Find.LEASE,
    (
        Branch(
            CANCELLED,
            when=((Guard.CANCEL_REQUESTED, True),),
            events=("job.cancelled",),
            completed_at=Stamp.NOW,
        ),
        Branch(
            SUCCEEDED,
            events=("job.succeeded",),
            completed_at=Stamp.NOW,
            error=Error.CLEAR,
            result=Result.FROM_CALLER,
        ),
    ),
)

FAIL = Transition(
    "fail",
    RUNNING,
    Find.LEASE,
    (
        Branch(
            QUEUED,
            when=(
                (Guard.RETRYABLE, True),
                (Guard.ATTEMPTS_LEFT, True),
                (Guard.CANCEL_REQUESTED, False),
                (Guard.NON_RETRYABLE_TYPE, False),
            ),
            events=("job.retry_scheduled",),
            available_at=Stamp.BACKOFF,
            completed_at=Stamp.CLEAR,
            error=Error.FROM_CALLER,
        ),
        Branch(FAILED, events=("job.failed",), completed_at=Stamp.NOW, error=Error.FROM_CALLER),
    ),
)

# The handler saw the cancel request and stopped.
CONFIRM_CANCEL = Transition(
    "confirm_cancel",
    RUNNING,
    Find.LEASE,
    (Branch(CANCELLED, events=("job.cancelled",), completed_at=Stamp.NOW),),
)

# Handed back unfinished (the worker is stopping): claimable again at once, and
# the interrupted attempt is not counted.
RELEASE = Transition(
    "release",
    RUNNING,
    Find.LEASE,
    (Branch(QUEUED, events=("job.released",), attempt=-1, available_at=Stamp.NOW),),
)

# An expired lease counts as a failed attempt: a pending cancel ends the job
# cancelled, no attempts left end it failed, otherwise it is queued at once.
RECOVER_EXPIRED_LEASE = Transition(
    "recover_expired_lease",
    RUNNING,
    Find.EXPIRED,
    (
        Branch(
            CANCELLED,
            when=((Guard.CANCEL_REQUESTED, True),),
            events=("job.lease_expired", "job.cancelled"),
            completed_at=Stamp.NOW,
        ),
        Branch(
            FAILED,
            when=((Guard.ATTEMPTS_LEFT, False),),
            events=("job.lease_expired", "job.failed"),
            completed_at=Stamp.NOW,
            error=Error.LEASE_EXPIRED,
        ),
        Branch(QUEUED, events=("job.lease_expired",), available_at=Stamp.NOW),
    ),
)

# A worker puts the job back for a while (it is rate-limited, or waits on
# something): queued until the caller's `retry_at`, the attempt not counted. A
# pending cancel wins, as it does over a success.
SNOOZE = Transition(
    "snooze",
    RUNNING,
    Find.LEASE,
    (
        Branch(
            CANCELLED,
            when=((Guard.CANCEL_REQUESTED, True),),
            events=("job.cancelled",),
            completed_at=Stamp.NOW,
        ),
        Branch(QUEUED, events=("job.snoozed",), attempt=-1, available_at=Stamp.RETRY_AT),
    ),
)

# The server ends an attempt that outlived its deadline, whatever its worker
# says (a worker may keep heartbeating while its code hangs): past the cancel
# grace it ends cancelled; past its timeout it is a failed attempt, retried
# after the backoff while attempts remain. Its lease is cleared, so every later
# write of that worker is refused.
END_OVERDUE = Transition(
    "end_overdue",
    RUNNING,
    Find.OVERDUE,
    (
        Branch(
            CANCELLED,
            when=((Guard.CANCEL_REQUESTED, True),),
            events=("job.cancelled",),
            completed_at=Stamp.NOW,
        ),
        Branch(
            QUEUED,
            when=((Guard.ATTEMPTS_LEFT, True),),
            events=("job.retry_scheduled",),
            available_at=Stamp.BACKOFF,
            completed_at=Stamp.CLEAR,
            error=Error.TIMED_OUT,
        ),
        Branch(FAILED, events=("job.failed",), completed_at=Stamp.NOW, error=Error.TIMED_OUT),
    ),
)

CANCEL_QUEUED = Transition(
    "cancel_queued",
    QUEUED,
    Find.OWNER,
    (Branch(CANCELLED, events=("job.cancelled",), completed_at=Stamp.NOW, lease=LeaseChange.KEEP),),
)

REQUEST_CANCEL = Transition(
    "request_cancel",
    RUNNING,
    Find.OWNER,
    (
        Branch(
            RUNNING,
            events=("job.cancel_requested",),
            cancel_requested_at=Stamp.NOW,
            deadline_at=Stamp.GRACE,
            lease=LeaseChange.KEEP,
        ),
    ),
)

TRANSITIONS = (
    CLAIM,
    HEARTBEAT,
    CHECKPOINT,
    SUCCEED,
    FAIL,
    CONFIRM_CANCEL,
    RELEASE,
    RECOVER_EXPIRED_LEASE,
    SNOOZE,
    END_OVERDUE,
    CANCEL_QUEUED,
    REQUEST_CANCEL,
)


def owner_cancel(status: JobStatus, cancel_requested: bool) -> Transition | None:
    """What an owner's Cancel does to a job in `status`: cancel a queued job now,
    ask a running one to stop (once), and leave a finished one as it is."""
    if status is QUEUED:
        return CANCEL_QUEUED
    if status is RUNNING and not cancel_requested:
        return REQUEST_CANCEL
    return None


# What an owner's or an operator's Cancel acts on (`owner_cancel`).
CANCELLABLE_STATUSES = frozenset({QUEUED, RUNNING})
RETRYABLE_STATUSES = frozenset({FAILED, CANCELLED})


def can_retry(status: JobStatus) -> bool:
    """Whether an owner may Retry (copy into a new job) a job in `status`."""
    return status in RETRYABLE_STATUSES


ENQUEUE_EVENTS = ("job.queued",)
# A new job's insert is no transition of an existing row, but its events are
# described like a branch's, for an engine that builds every event the same way.
ENQUEUE = Branch(QUEUED, events=ENQUEUE_EVENTS)


def queued_row(values: Mapping[str, Any], now: datetime) -> dict[str, Any]:
    """The columns of a new job, queued and available at its `run_at` (now when
    it has none or it has passed), with its `job.queued` event's sequence taken."""
    run_at = values.get("run_at")
    return {
        **values,
        "status": QUEUED.value,
        "attempt": 0,
        "available_at": AWAITING_PARENTS if values.get("pending_dependencies") else due_at(run_at, now),
        "last_event_sequence": len(ENQUEUE_EVENTS),
        "created_at": now,
        "updated_at": now,
    }


def due_at(run_at: datetime | None, now: datetime) -> datetime:
    """When a job free to run falls due: its `run_at`, unless that has passed."""
    return run_at if run_at is not None and run_at > now else now


# A waiting job's parents have all ended as it waits for: it falls due now (or
# at its run_at), and its log says why it moved.
DEPENDENCIES_MET = Branch(QUEUED, events=("job.dependencies_met",))
# A parent it waits for (under `ParentFailurePolicy.CANCEL`) ended failed or
# cancelled: so does the child, naming the parent.
DEPENDENCY_FAILED = Branch(CANCELLED, events=("job.dependency_failed", "job.cancelled"))
DEPENDENCY_FAILED_ERROR_TYPE = "DependencyFailed"


def dependency_failed_message(parent_id: str, parent_status: str | None) -> str:
    """The error a child ended by its parent's failure carries."""
    if parent_status is None:
        return f"Parent job {parent_id} is no longer kept, so its outcome is unknown."
    return f"Parent job {parent_id} ended {parent_status}."


def enqueue_events() -> list[tuple[int, str]]:
    """The (sequence, type) of the events a new job's log begins with; their
    payloads are empty."""
    return [(sequence, event_type) for sequence, event_type in enumerate(ENQUEUE_EVENTS, start=1)]


def lifecycle_events(branch: Branch, job: Mapping[Any, Any]) -> list[tuple[int, str, JsonObject]]:
    """The (sequence, type, payload) of each event `branch` writes, from the
    job's columns after the change (whose last_event_sequence includes them)."""
    first = job["last_event_sequence"] - len(branch.events) + 1
    # The attempt an event speaks of: the one a claim began, else the one that ended.
    attempt = job["attempt"] if branch.attempt > 0 else job["attempt"] - branch.attempt
    return [
        (first + offset, event_type, _payload(event_type, job, attempt))
        for offset, event_type in enumerate(branch.events)
    ]


def _payload(event_type: str, job: Mapping[Any, Any], attempt: int) -> JsonObject:
    if event_type in ("job.started", "job.lease_expired", "job.released"):
        return {"attempt": attempt}
    if event_type == "job.snoozed":
        return {"attempt": attempt, "available_at": rfc3339(job["available_at"])}
    if event_type == "job.retry_scheduled":
        return {
            "attempt": attempt,
            "error": job["error_message"],
            "error_type": job["error_type"],
            "available_at": rfc3339(job["available_at"]),
        }
    if event_type == "job.failed":
        return {"error": job["error_message"], "error_type": job["error_type"]}
    return {}


# The columns a job keeps its place in a graph in (`tables.jobs`).
DEPENDENCY_COLUMNS = ("depends_on", "pending_dependencies", "on_parent_failure", "has_dependents")


def wakes_claimers(transition: Transition | None, branch: Branch, limits_running: bool) -> bool:
    """Whether a change makes work claimable, so waiting claimers must look
    again: a job queued anew (an enqueue, `transition` None; a retry coming
    back, a lease handed back) or, while running jobs are limited, an attempt
    that ended (its slot came free)."""
    if branch.status is QUEUED:
        return transition is None or transition.source is not QUEUED
    return (
        limits_running
        and transition is not None
        and transition.source is RUNNING
        and branch.status is not RUNNING
    )


# The statuses of a job still to run or running: a schedule's previous firing
# in one of them is still live (`OverlapPolicy.SKIP`).
LIVE_STATUSES = frozenset({QUEUED, RUNNING})


def new_job_values(new_job: NewJob) -> dict[str, Any]:
    """A new job's own columns (the rest are `queued_row`'s), under a fresh id."""
    return {
        "id": new_job_id(),
        "owner_id": new_job.owner_id,
        "kind": new_job.kind,
        "resource_type": new_job.resource_type,
        "resource_id": new_job.resource_id,
        "payload": new_job.payload,
        "max_attempts": new_job.max_attempts,
        "timeout_seconds": new_job.timeout_seconds,
        "run_at": new_job.run_at,
        "priority": new_job.priority,
        **policy_columns(new_job.retry_policy),
        "traceparent": new_job.traceparent,
    }


def dependency_values(depends_on: list[str], policy: ParentFailurePolicy, pending: int) -> dict[str, Any]:
    """A new job's columns of its place in a graph: the parents it waits for
    (as its Enqueue named them), how many are still pending, and its policy."""
    return {"depends_on": depends_on, "pending_dependencies": pending, "on_parent_failure": policy.value}


def job_of(columns: Mapping[str, Any]) -> Job:
    """A `Job` from its columns by name. Those a new row leaves unset (it was
    never started, cancelled, retried or failed) may be absent, and so may the
    result, which a List page leaves out."""
    return Job(
        id=columns["id"],
        owner_id=columns["owner_id"],
        kind=columns["kind"],
        resource_type=columns["resource_type"],
        resource_id=columns["resource_id"],
        status=JobStatus(columns["status"]),
        attempt=columns["attempt"],
        max_attempts=columns["max_attempts"],
        timeout_seconds=columns["timeout_seconds"],
        available_at=columns["available_at"],
        cancel_requested_at=columns.get("cancel_requested_at"),
        retry_of_job_id=columns.get("retry_of_job_id"),
        error_message=columns.get("error_message"),
        error_type=columns.get("error_type"),
        created_at=columns["created_at"],
        updated_at=columns["updated_at"],
        started_at=columns.get("started_at"),
        completed_at=columns.get("completed_at"),
        result=columns.get("result"),
        run_at=columns.get("run_at"),
        priority=columns["priority"],
        retry_policy=retry_policy_of(columns),
        traceparent=columns.get("traceparent"),
        depends_on=tuple(columns.get("depends_on") or ()),
        pending_dependencies=columns.get("pending_dependencies") or 0,
        on_parent_failure=_policy(columns.get("on_parent_failure")),
    )


def _policy(stored: str | None) -> ParentFailurePolicy | None:
    return None if stored is None else ParentFailurePolicy(stored)


# Every column of a job's row, as the schema has them (a test holds the two
# alike): what an engine without a schema of its own keeps per job.
JOB_COLUMNS = (
    "seq",
    "id",
    "owner_id",
    "kind",
    "resource_type",
    "resource_id",
    "payload",
    "status",
    "attempt",
    "max_attempts",
    "timeout_seconds",
    "available_at",
    "cancel_requested_at",
    "retry_of_job_id",
    "error_message",
    "error_type",
    "result",
    "checkpoint",
    "lease_owner",
    "lease_token",
    "lease_expires_at",
    "deadline_at",
    "last_event_sequence",
    "created_at",
    "updated_at",
    "started_at",
    "completed_at",
    "run_at",
    "priority",
    *POLICY_COLUMNS,
    "traceparent",
    *DEPENDENCY_COLUMNS,
)
