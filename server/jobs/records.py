"""Immutable records that cross the repository seam."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

JsonObject = dict[str, Any]


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        return self in TERMINAL_STATUSES


TERMINAL_STATUSES = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELLED})


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a job's failed attempts are retried (`state_machine.backoff_seconds`),
    with every default already resolved."""

    initial_interval_seconds: float = 1.0
    backoff_coefficient: float = 2.0
    max_interval_seconds: float = 100.0
    # Error types that end the job failed at once, whatever attempts remain.
    non_retryable_error_types: tuple[str, ...] = ()


class WaitReason(StrEnum):
    """Why a queued job is not running yet (`steering.wait_reason`)."""

    SCHEDULED = "scheduled"
    BACKOFF = "backoff"
    KIND_LIMIT = "kind_limit"
    OWNER_LIMIT = "owner_limit"
    RATE_LIMIT = "rate_limit"
    PAUSED = "paused"
    NO_WORKER = "no_worker"
    READY = "ready"
    DEPENDENCIES = "dependencies"


class ParentFailurePolicy(StrEnum):
    """What a parent that ends failed or cancelled does to a job that depends on it."""

    # The child ends cancelled (`DEPENDENCY_FAILED_ERROR_TYPE`), and so do its own
    # children of this policy.
    CANCEL = "cancel"
    # The child runs once every parent has ended, whatever the outcome.
    RUN = "run"


DEFAULT_PRIORITY = 3
# Claimed first to last.
PRIORITIES = (1, 2, 3, 4, 5)


@dataclass(frozen=True, slots=True)
class Job:
    """A job as its owner may see it: no payload, no lease."""

    id: str
    owner_id: str
    kind: str
    resource_type: str
    resource_id: str
    status: JobStatus
    attempt: int
    max_attempts: int
    timeout_seconds: int
    available_at: datetime
    cancel_requested_at: datetime | None
    retry_of_job_id: str | None
    error_message: str | None
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    # The exception class of the failed attempt that set error_message.
    error_type: str | None = None
    # What the job produced, once it succeeded (only where the reader asked for it:
    # Get and a success's own answer carry it, a List page does not).
    result: JsonObject | None = None
    # When its owner asked it to run, if it asked.
    run_at: datetime | None = None
    priority: int = DEFAULT_PRIORITY
    # None: the default schedule (`state_machine.backoff_seconds`).
    retry_policy: RetryPolicy | None = None
    # The W3C `traceparent` its Enqueue carried (normalised to version 00), so
    # each attempt's span joins the caller's trace; None: each attempt's span
    # is a root. Only a string: the domain knows nothing of OpenTelemetry.
    traceparent: str | None = None
    # The jobs it waits for, in the order its Enqueue named them.
    depends_on: tuple[str, ...] = ()
    # How many of them have not yet ended as it waits for; while above 0 the
    # job is queued but never claimed (`WaitReason.DEPENDENCIES`).
    pending_dependencies: int = 0
    # None for a job without parents.
    on_parent_failure: ParentFailurePolicy | None = None


@dataclass(frozen=True, slots=True)
class NewJob:
    owner_id: str
    kind: str
    payload: JsonObject
    resource_type: str = ""
    resource_id: str = ""
    max_attempts: int = 3
    timeout_seconds: int = 900
    # Not claimable before this (None or a past time: at once).
    run_at: datetime | None = None
    priority: int = DEFAULT_PRIORITY
    retry_policy: RetryPolicy | None = None
    traceparent: str | None = None
    # Existing jobs of the owner's this one waits for.
    depends_on: tuple[str, ...] = ()
    # Items of the same batch it waits for, by their place in the batch
    # (BatchEnqueue's depends_on_refs, resolved by the caller).
    depends_on_items: tuple[int, ...] = ()
    on_parent_failure: ParentFailurePolicy = ParentFailurePolicy.CANCEL


@dataclass(frozen=True, slots=True)
class Lease:
    """The right to act on one attempt of a job.

    Every worker-side transition names the job and the attempt's token; the token
    alone decides. The attempt number is for logs (a remote worker's writes name
    only the token, and a failure's backoff comes from the job's own row).
    """

    job_id: str
    token: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    job: Job
    payload: JsonObject
    lease: Lease
    lease_expires_at: datetime
    # The last checkpoint an earlier attempt saved (`state_machine.CHECKPOINT`),
    # or None: where this attempt may resume.
    checkpoint: JsonObject | None = None
    # The results of the jobs it depends on, by job id: each parent that
    # succeeded with a result, while their total stays within
    # `dependencies.PARENT_RESULTS_LIMIT_BYTES` (in depends_on order).
    parent_results: dict[str, JsonObject] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class LeaseRenewal:
    """A heartbeat's answer for a lease it renewed."""

    expires_at: datetime
    cancel_requested: bool


@dataclass(frozen=True, slots=True)
class RecoveredJob:
    """A job a recovery moved on, with what metrics may name it by: its kind and
    where it went, never its owner or payload."""

    job_id: str
    kind: str
    # Queued again, or finished (failed or cancelled).
    status: JobStatus
    # True: its lease expired (the worker went away); False: its attempt ran past
    # its deadline while the worker still held the lease.
    lease_expired: bool


@dataclass(frozen=True, slots=True)
class QueuedKind:
    """The due work of one kind waiting for a worker: how many queued jobs
    whose time has come, and since when the oldest of them has been due."""

    kind: str
    depth: int
    oldest_due_at: datetime


@dataclass(frozen=True, slots=True)
class ClaimResult:
    jobs: list[ClaimedJob]
    # The earliest moment something may become claimable (a retry falls due or a
    # lease expires), so an idle worker knows when to look again; None when
    # nothing is foreseen, and after a claim that filled its limit (its caller
    # claims again at once).
    next_wakeup_at: datetime | None
    # Jobs whose expired lease (or overdue attempt) this claim recovered.
    recovered: list[RecoveredJob] = field(default_factory=list)

    @property
    def expired_job_ids(self) -> list[str]:
        """The recovered jobs' ids (requeued, failed or cancelled)."""
        return [job.job_id for job in self.recovered]


@dataclass(frozen=True, slots=True)
class JobEvent:
    job_id: str
    sequence: int
    type: str
    payload: JsonObject
    created_at: datetime


class JobSubject(NamedTuple):
    """Whose a job is and what it is about: what the owner's feed says of each
    event besides the event itself."""

    owner_id: str
    kind: str
    resource_type: str
    resource_id: str

    @classmethod
    def of(cls, row: Mapping[Any, Any]) -> JobSubject:
        """The subject of a job's row (any mapping with its columns)."""
        return cls(row["owner_id"], row["kind"], row["resource_type"], row["resource_id"])


@dataclass(frozen=True, slots=True)
class FeedEvent:
    """An event as its owner's feed carries it. `position` numbers the owner's
    events 1, 2, 3 … in the order they committed, counted for that owner alone."""

    event: JobEvent
    position: int
    subject: JobSubject


@dataclass(frozen=True, slots=True)
class FeedPage:
    """Events of one owner's feed after a position, and how far retention has
    deleted into that feed (`expired_through`: no event at or below it is
    promised to be kept), read together."""

    events: list[FeedEvent]
    expired_through: int


@dataclass(frozen=True, slots=True)
class FeedHead:
    """Where one owner's feed stands: its newest position, and retention's."""

    last_position: int
    expired_through: int


@dataclass(frozen=True, slots=True)
class JobFilter:
    statuses: frozenset[JobStatus] = field(default_factory=frozenset)
    kind: str = ""
    resource_type: str = ""
    resource_id: str = ""
    # Only the jobs that depend on this one (its children).
    depends_on: str = ""


@dataclass(frozen=True, slots=True)
class PageCursor:
    """Keyset position: the last job of the previous page (newest first)."""

    job_id: str


@dataclass(frozen=True, slots=True)
class JobPage:
    jobs: list[Job]
    next_cursor: PageCursor | None
