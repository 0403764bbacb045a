"""Table definitions: the schema alembic migrates to, and what Core statements use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
    false,
    text,
)
from sqlalchemy.types import TypeDecorator

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class UtcTimestamp(TypeDecorator[datetime]):
    """A timezone-aware UTC instant stored as integer microseconds since the epoch.

    Integers compare and index the same way on every engine and never lose the
    zone, which SQLite's text datetimes would.
    """

    impl = BigInteger
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> int | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        return (value - _EPOCH) // timedelta(microseconds=1)

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return _EPOCH + timedelta(microseconds=int(value))


# A version-00 W3C traceparent: 00-<32 hex>-<16 hex>-<2 hex>.
TRACEPARENT_LENGTH = 55

# The rows the one-root-job-per-resource index covers. A literal, not a bound
# parameter: PostgreSQL matches an ON CONFLICT's condition to a partial index
# only when it reads the same.
RESOURCE_ROOT_CONDITION = "resource_id != '' AND retry_of_job_id IS NULL"

# The rows the parents' retention index covers, as the statements that use
# it read (SQLite uses a partial index only for a query naming its condition).
PARENT_CONDITION = "has_dependents = true"

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)


jobs = Table(
    "jobs",
    metadata,
    # Insertion order. Timestamps come from a clock that can repeat or jump back;
    # "newest", "earliest" and page positions are decided by this instead.
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("id", String(64), nullable=False, unique=True),
    Column("owner_id", String(128), nullable=False),
    Column("kind", String(128), nullable=False),
    Column("resource_type", String(256), nullable=False, server_default=""),
    Column("resource_id", String(256), nullable=False, server_default=""),
    Column("payload", JSON, nullable=False),
    Column("status", String(16), nullable=False),
    Column("attempt", Integer, nullable=False, server_default="0"),
    Column("max_attempts", Integer, nullable=False),
    Column("timeout_seconds", Integer, nullable=False),
    Column("available_at", UtcTimestamp, nullable=False),
    Column("cancel_requested_at", UtcTimestamp),
    Column("retry_of_job_id", String(64)),
    Column("error_message", Text),
    # The exception class of the failed attempt that set error_message.
    Column("error_type", String(128)),
    # What a succeeded job produced (a JSON object), or NULL.
    Column("result", JSON),
    # The last checkpoint an attempt saved (a JSON object), or NULL: what the
    # next attempt resumes from (state_machine.CHECKPOINT).
    Column("checkpoint", JSON),
    Column("lease_owner", String(256)),
    Column("lease_token", String(64)),
    Column("lease_expires_at", UtcTimestamp),
    # When the running attempt must have ended (its timeout, or a cancel's
    # grace); the rescuer ends it then, whatever its worker says.
    Column("deadline_at", UtcTimestamp),
    # The last event sequence handed out; bumped by the fenced UPDATE of the same
    # transaction that inserts the events, so sequences stay gap-free even with
    # concurrent appenders.
    Column("last_event_sequence", BigInteger, nullable=False, server_default="0"),
    Column("created_at", UtcTimestamp, nullable=False),
    Column("updated_at", UtcTimestamp, nullable=False),
    Column("started_at", UtcTimestamp),
    Column("completed_at", UtcTimestamp),
    # What the owner asked for (DESIGN §11): when to run it (available_at holds
    # the next attempt's time), its priority (1 first), and how to retry it
    # (all four NULL: the default schedule; see state_machine.POLICY_COLUMNS).
    Column("run_at", UtcTimestamp),
    Column("priority", Integer, nullable=False, server_default="3"),
    Column("retry_initial_seconds", Float),
    Column("retry_coefficient", Float),
    Column("retry_max_seconds", Float),
    Column("non_retryable_error_types", Text),
    # The caller's W3C traceparent (`records.Job.traceparent`), or NULL.
    Column("traceparent", String(TRACEPARENT_LENGTH)),
    # Dependencies (DESIGN §18). What the job waits for (a JSON list of job ids,
    # as its Enqueue named them; NULL: nothing), how many of those have not yet
    # ended as it waits for (while above 0 it is queued but held back: its
    # available_at is state_machine.AWAITING_PARENTS), and what a parent's
    # failure does to it (records.ParentFailurePolicy; NULL without parents).
    Column("depends_on", JSON),
    Column("pending_dependencies", Integer, nullable=False, server_default="0"),
    Column("on_parent_failure", String(8)),
    # Whether any job was ever enqueued to wait on this one: a job's ending
    # looks for children only then, so jobs outside graphs pay nothing.
    Column("has_dependents", Boolean, nullable=False, server_default=false()),
    CheckConstraint(
        "status IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')",
        name="status_known",
    ),
    CheckConstraint("priority BETWEEN 1 AND 5", name="priority_known"),
    # The claim's walk (steering.QueueView): each priority's owners with due
    # jobs, and each owner's oldest due jobs, are index seeks on this one.
    Index("ix_jobs_claim_order", "status", "priority", "owner_id", "available_at", "seq"),
    # The next due time, the clock re-anchoring, and Get's "scheduled or due".
    Index("ix_jobs_status_available_at", "status", "available_at", "seq"),
    Index("ix_jobs_status_lease_expires_at", "status", "lease_expires_at"),
    Index("ix_jobs_status_deadline_at", "status", "deadline_at"),
    Index("ix_jobs_owner_id_seq", "owner_id", "seq"),
    Index("ix_jobs_owner_id_resource", "owner_id", "resource_type", "resource_id", "seq"),
    Index("ix_jobs_retry_of_job_id", "retry_of_job_id"),
    # Retention (serve --retention): the terminal jobs that finished longest ago,
    # and apart, those some job waited on (whose children are asked about).
    Index("ix_jobs_status_completed_at", "status", "completed_at"),
    Index(
        "ix_jobs_parents_completed_at",
        "status",
        "completed_at",
        sqlite_where=text(PARENT_CONDITION),
        postgresql_where=text(PARENT_CONDITION),
    ),
    # AdminService: a status's jobs newest first (ListAllJobs, and the keyset
    # batches of BulkCancel / BulkRetry).
    Index("ix_jobs_status_seq", "status", "seq"),
    # JobService.GetStats: an owner's jobs counted by kind and status from
    # the index alone (SQLite covers them; PostgreSQL reads it index-only).
    Index("ix_jobs_owner_id_kind_status", "owner_id", "kind", "status"),
    # One root job per resource key: the database, not a check-then-insert,
    # decides which of two concurrent Enqueues wins.
    Index(
        "uq_jobs_resource_root",
        "owner_id",
        "resource_type",
        "resource_id",
        unique=True,
        sqlite_where=text(RESOURCE_ROOT_CONDITION),
        postgresql_where=text(RESOURCE_ROOT_CONDITION),
    ),
)

# One row per (parent, child) of a job graph: a parent's ending finds its
# children by the primary key's prefix, O(children). The edges go with the
# child (retention deletes it, the cascade its edges); a parent outlives its
# unfinished children (retention keeps it while one is queued or running).
job_dependencies = Table(
    "job_dependencies",
    metadata,
    Column("parent_id", String(64), nullable=False),
    Column("child_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    PrimaryKeyConstraint("parent_id", "child_id"),
    Index("ix_job_dependencies_child_id", "child_id"),
)

# Each rate-limited kind's token bucket (serve --kind-rate), shared by every
# process on the database: what it held when it was last drawn from, and when.
rate_buckets = Table(
    "rate_buckets",
    metadata,
    Column("kind", String(128), primary_key=True),
    Column("tokens", Float, nullable=False),
    Column("refilled_at", UtcTimestamp, nullable=False),
)

# Recurring schedules (DESIGN §12), one row each, owner-scoped like jobs.
schedules = Table(
    "schedules",
    metadata,
    # Insertion order, for a stable primary key on every engine.
    Column("seq", BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True),
    Column("owner_id", String(128), nullable=False),
    Column("schedule_id", String(128), nullable=False),
    Column("cron", String(256), nullable=False),
    Column("time_zone", String(64), nullable=False),
    # The job template (schedules.JobTemplate), in the jobs table's own terms.
    Column("kind", String(128), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("max_attempts", Integer, nullable=False),
    Column("timeout_seconds", Integer, nullable=False),
    Column("priority", Integer, nullable=False),
    Column("retry_initial_seconds", Float),
    Column("retry_coefficient", Float),
    Column("retry_max_seconds", Float),
    Column("non_retryable_error_types", Text),
    Column("overlap", String(16), nullable=False),
    Column("catchup_window_seconds", BigInteger, nullable=False),
    Column("paused", Boolean, nullable=False),
    # NULL while paused or when the rule never fires again: the due scan skips it.
    Column("next_fire_at", UtcTimestamp),
    Column("last_fire_at", UtcTimestamp),
    Column("last_job_id", String(64)),
    Column("skipped_firings", BigInteger, nullable=False, server_default="0"),
    Column("last_skipped_fire_at", UtcTimestamp),
    Column("last_skip_reason", String(32)),
    Column("created_at", UtcTimestamp, nullable=False),
    Column("updated_at", UtcTimestamp, nullable=False),
    CheckConstraint("overlap IN ('skip', 'allow')", name="overlap_known"),
    Index("uq_schedules_owner_id_schedule_id", "owner_id", "schedule_id", unique=True),
    Index("ix_schedules_next_fire_at", "next_fire_at"),
)

job_events = Table(
    "job_events",
    metadata,
    Column(
        "job_id",
        String(64),
        ForeignKey("jobs.id", ondelete="CASCADE"),
        nullable=False,
    ),
    Column("sequence", BigInteger, nullable=False),
    Column("type", String(128), nullable=False),
    Column("payload", JSON, nullable=False),
    Column("created_at", UtcTimestamp, nullable=False),
    # The job's owner and the event's place in that owner's feed (see
    # operations.feed): written with every event, and by migration 0015 for
    # the events before it; nullable only because SQLite adds columns so.
    Column("owner_id", String(128), nullable=True),
    Column("position", BigInteger, nullable=True),
    PrimaryKeyConstraint("job_id", "sequence"),
    Index("uq_job_events_owner_id_position", "owner_id", "position", unique=True),
)

# Each owner's feed: its newest position (locked by the unit of work that
# numbers the next events until it commits) and how far retention has deleted
# into it (a subscriber behind that has missed events).
feed_heads = Table(
    "feed_heads",
    metadata,
    Column("owner_id", String(128), primary_key=True),
    Column("last_position", BigInteger, nullable=False),
    Column("expired_through", BigInteger, nullable=False, server_default="0"),
)

# Idempotency keys (AIP-155) of Enqueue, BatchEnqueue and Retry: the first
# call's result, replayed to a repeat of the same request_id from the same
# owner until retention forgets the key.
request_ids = Table(
    "request_ids",
    metadata,
    Column("owner_id", String(128), nullable=False),
    Column("request_id", String(128), nullable=False),
    # Which call made it ("enqueue", "batch_enqueue", "retry"), and a digest
    # of that call's request: a key reused for another request is refused
    # rather than answered with an unrelated result.
    Column("method", String(32), nullable=False),
    Column("fingerprint", String(64), nullable=False),
    # The first call's answer: a JSON list of {"job_id", "created"}.
    Column("response", JSON, nullable=False),
    Column("created_at", UtcTimestamp, nullable=False),
    PrimaryKeyConstraint("owner_id", "request_id"),
    Index("ix_request_ids_created_at", "created_at"),
)

# Kinds an admin paused (AdminService.PauseKind): claims on every replica and
# remote worker skip them until resumed.
paused_kinds = Table(
    "paused_kinds",
    metadata,
    Column("kind", String(128), primary_key=True),
    Column("paused_at", UtcTimestamp, nullable=False),
)

# What a lease token's worker writes left (`worker_writes`): its finishing write
# (request_key "") with the job as it left it, and each AppendEvent sent with a
# request_id, so that a repeat of either is answered instead of refused. The
# records go with their job (retention deletes jobs, the cascade their records).
worker_writes = Table(
    "worker_writes",
    metadata,
    Column("job_id", String(64), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("lease_token", String(64), nullable=False),
    Column("request_key", String(128), nullable=False),
    # The state machine transition's name, or "append_event".
    Column("write", String(32), nullable=False),
    Column("fingerprint", String(64), nullable=False),
    Column("answer", JSON, nullable=False),
    Column("created_at", UtcTimestamp, nullable=False),
    PrimaryKeyConstraint("job_id", "lease_token", "request_key"),
)
