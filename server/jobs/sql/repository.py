"""`JobRepository` over SQLAlchemy Core, on any database with a `SqlDialect`.

Writes go through the group-commit writer; reads use their own pooled
connections and hold no transaction between statements. Every transition is
the state machine's (`state_machine`), compiled into one UPDATE
(`transitions.py`): for a worker it is fenced (`id`, `status = 'running'`, the
lease token, an unexpired lease), and it also reserves the sequences of the
events the chosen branch writes. The UPDATE holds the job's row lock until the
transaction commits, so even with several replicas appending to one job, each
takes the next number only after the last one committed: a stale worker can
change nothing and event logs stay gap-free. Which branch was taken is read
back from the row's new status; the state machine then says which events to
write. Nothing in this module chooses a status or an event.

Commits made by other processes reach this one's change hub through the
dialect's change feed (SQLite: a cheap poll of the file's data version;
PostgreSQL: LISTEN).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import random
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any, TypeVar

import structlog
from sqlalchemy import Row, select
from sqlalchemy.exc import DBAPIError

from leasehold._server.clock import Clock
from leasehold._server.jobs import idempotency, ids, limits, owner_stats, schedules, steering, worker_writes
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.admin import AdminFilter, BulkBatch, LeaseHolder, QueueStats
from leasehold._server.jobs.errors import (
    EventLimitReached,
    JobNotFound,
    LeaseLost,
    RequestIdReused,
    RequestResultDeleted,
    RetryNotAllowed,
    ScheduleNotFound,
)
from leasehold._server.jobs.idempotency import Answer, KeyedAnswer, RequestKey
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.owner_limits import OwnedField
from leasehold._server.jobs.records import (
    ClaimedJob,
    ClaimResult,
    Job,
    JobEvent,
    JobFilter,
    JobPage,
    JobStatus,
    JsonObject,
    Lease,
    LeaseRenewal,
    NewJob,
    PageCursor,
    QueuedKind,
    RecoveredJob,
)
from leasehold._server.jobs.routing import ANY_KIND, KindFilter, KindPatterns
from leasehold._server.jobs.sql import owned as owned_rows
from leasehold._server.jobs.sql import queue_view
from leasehold._server.jobs.sql import request_ids as request_rows
from leasehold._server.jobs.sql import schedules as schedule_rows
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql import worker_writes as worker_write_rows
from leasehold._server.jobs.sql.admin import SqlAdmin
from leasehold._server.jobs.sql.dialect import Engines
from leasehold._server.jobs.sql.errors import translate_storage_error
from leasehold._server.jobs.sql.read_batch import ReadBatcher
from leasehold._server.jobs.sql.tables import jobs
from leasehold._server.jobs.sql.transitions import JOB_COLUMNS, parameters
from leasehold._server.jobs.sql.writer import GroupCommitWriter, OpGroup, WriteOp, WriteTx
from leasehold._server.jobs.steering import Occupancy, Steering
from leasehold._server.jobs.waits import first_of

log = structlog.get_logger("leasehold.storage")

# How often to look for commits made by other processes on the same SQLite file.
OTHER_WRITERS_POLL_SECONDS = 1.0
# The append statement's bound when no event limit is set: more than any sequence.
NO_EVENT_LIMIT = 2**62

# Due schedules fired per transaction of the writer.
FIRING_BATCH = 50

EventRow = tuple[str, int, str, JsonObject, datetime]
T = TypeVar("T")


def _new_job_values(new_job: NewJob) -> dict[str, Any]:
    return {
        "id": ids.new_job_id(),
        "owner_id": new_job.owner_id,
        "kind": new_job.kind,
        "resource_type": new_job.resource_type,
        "resource_id": new_job.resource_id,
        "payload": new_job.payload,
        "max_attempts": new_job.max_attempts,
        "timeout_seconds": new_job.timeout_seconds,
        "run_at": new_job.run_at,
        "priority": new_job.priority,
        **sm.policy_columns(new_job.retry_policy),
        "traceparent": new_job.traceparent,
    }


def _job_from_row(row: Any) -> Job:
    """A `Job` from a result row that carries the job columns."""
    return _job_from_mapping(row._mapping)


def _job_from_mapping(m: Mapping[str, Any]) -> Job:
    """A `Job` from the job columns by name. Columns a new row leaves unset (it
    was never started, cancelled, retried or failed) may be absent."""
    return Job(
        id=m["id"],
        owner_id=m["owner_id"],
        kind=m["kind"],
        resource_type=m["resource_type"],
        resource_id=m["resource_id"],
        status=JobStatus(m["status"]),
        attempt=m["attempt"],
        max_attempts=m["max_attempts"],
        timeout_seconds=m["timeout_seconds"],
        available_at=m["available_at"],
        cancel_requested_at=m.get("cancel_requested_at"),
        retry_of_job_id=m.get("retry_of_job_id"),
        error_message=m.get("error_message"),
        error_type=m.get("error_type"),
        created_at=m["created_at"],
        updated_at=m["updated_at"],
        started_at=m.get("started_at"),
        completed_at=m.get("completed_at"),
        result=m.get("result"),
        run_at=m.get("run_at"),
        priority=m["priority"],
        retry_policy=sm.retry_policy_of(m),
        traceparent=m.get("traceparent"),
    )


@dataclass(frozen=True)
class _Append:
    lease: Lease
    event_type: str
    payload: JsonObject


def _fence(lease: Lease) -> dict[str, Any]:
    """The parameters of `statements.FENCED` (besides `now`)."""
    return {"job_id": lease.job_id, "token": lease.token}


class SqlJobRepository:
    """On SQLite, `other_writers_poll_seconds` bounds how late this process
    learns of a commit made by another process on the same file (its own are
    announced at once): that late an idle worker notices a job another process
    enqueued, and a watcher an event another process appended. On PostgreSQL
    other replicas' commits arrive by notification, as they commit."""

    def __init__(
        self,
        engines: Engines,
        clock: Clock,
        changes: ChangeHub | None = None,
        other_writers_poll_seconds: float = OTHER_WRITERS_POLL_SECONDS,
        steering_rules: steering.Steering = steering.NO_STEERING,
        jitter: Callable[[], float] = random.random,
        max_events_per_job: int | None = None,
    ) -> None:
        """`max_events_per_job`: append_event refuses a job whose log holds that many
        events (its lifecycle events included, which are never refused); None: no limit."""
        self._engines = engines
        self._max_events = max_events_per_job
        self._steering = steering_rules
        self._jitter = jitter
        # Where the turn-taking among owners with nothing running goes on
        # (steering.choose); this process's own, which is all fairness needs.
        self._fair_share_cursor = ""
        self._dialect = dialect = engines.dialect
        self._clock = clock
        # The time of the last committed claim; None until the first. See claim().
        self._claim_clock_high_water: datetime | None = None
        self._changes = changes or ChangeHub()
        # Names this process's announcements, so that it can skip its own.
        origin = uuid.uuid4().hex[:16]
        self._writer = GroupCommitWriter(
            engines.writer, self._changes, dialect, announce=dialect.announce(origin)
        )
        # Retention's deletes. On PostgreSQL, whose transactions run side by side,
        # they get a writer (a connection and a thread) of their own, so a claim
        # or enqueue never queues in this process's writer behind a batch; on
        # SQLite the file's one write lock is shared by every connection anyway.
        # It tells other replicas what it commits, as the main writer does:
        # nothing for a deletion, new work and events for a bulk action.
        self._sweeper = (
            GroupCommitWriter(engines.writer, self._changes, dialect, announce=dialect.announce(origin))
            if dialect.locks_rows
            else self._writer
        )
        # AdminService's bulk batches (sql/admin.py) share retention's writer, so
        # a claim never queues in this process's writer behind a batch either.
        self._admin = SqlAdmin(self, self._writer, self._sweeper, dialect, clock, _job_from_mapping)
        self._feed = dialect.change_feed(
            engines, self._changes, self._writer, origin, other_writers_poll_seconds
        )
        self._succeed_group = OpGroup(sm.SUCCEED.name, self._succeed_many)
        self._succeed_status_group = OpGroup("succeed_status", self._succeed_status_many)
        self._enqueue_group = OpGroup("enqueue", self._enqueue_many)
        self._enqueue_once_group = OpGroup("enqueue_once", self._enqueue_once_many)
        self._append_group = OpGroup("append", self._append_many)
        self._cancel_checks = ReadBatcher(self._cancel_requested_many)
        self._feed_task: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def changes(self) -> ChangeHub:
        return self._changes

    async def close(self) -> None:
        self._closing = True
        if self._feed_task is not None:
            self._feed_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._feed_task
        await self._writer.close()
        if self._sweeper is not self._writer:
            await self._sweeper.close()
        await self._engines.dispose()

    def _watch_other_writers(self) -> None:
        """Start, once, the task that announces other processes' commits. Called
        by the paths whose callers then wait on the change hub."""
        if self._closing:
            return
        if self._feed_task is None or self._feed_task.done():
            self._feed_task = asyncio.create_task(  # not in the starting call's log context
                self._feed.run(), name="leasehold-other-writers", context=contextvars.Context()
            )

    # ----- reads -------------------------------------------------------------------

    async def _read(self, statement: Any, parameters: dict[str, Any] | None = None) -> Sequence[Row[Any]]:
        """One statement on a pooled connection. A pooled connection found broken
        (the database restarted since it was last used) is replaced and the read
        tried once more: reads change nothing."""
        for attempt in (1, 2):
            try:
                async with self._engines.reader.connect() as conn:
                    result = await conn.execute(statement, parameters)
                    return result.all()
            except DBAPIError as exc:
                if attempt == 1 and exc.connection_invalidated:
                    continue
                raise translate_storage_error(exc) from exc
            except Exception as exc:
                raise translate_storage_error(exc) from exc
        raise AssertionError("unreachable")

    async def get(self, owner_id: str, job_id: str) -> Job:
        rows = await self._read(sql.GET_JOB, {"job_id": job_id, "owner": owner_id})
        if not rows:
            raise JobNotFound(job_id)
        return _job_from_row(rows[0])

    async def owner_stats(self, owner_id: str) -> owner_stats.OwnerStats:
        now = self._clock.now()
        by_kind = await self._read(sql.OWNER_BY_KIND, {"owner": owner_id, "limit": owner_stats.KIND_ROWS})
        by_status = None
        if len(by_kind) == owner_stats.KIND_ROWS:
            # Not every kind was read: the totals come from a count of their own.
            rows = await self._read(sql.OWNER_BY_STATUS, {"owner": owner_id})
            by_status = [(JobStatus(row.status), row.jobs) for row in rows]
        return owner_stats.assemble(
            now,
            by_status=by_status,
            by_kind=[(row.kind, JobStatus(row.status), row.jobs) for row in by_kind],
        )

    async def known_values(self, owner_id: str, owned: OwnedField, among: Sequence[str]) -> frozenset[str]:
        if not among:
            return frozenset()
        rows = await self._read(owned_rows.KNOWN[owned], {"owner": owner_id, "among": list(among)})
        return frozenset(row[0] for row in rows)

    async def count_distinct(self, owner_id: str, owned: OwnedField, up_to: int) -> int:
        rows = await self._read(owned_rows.COUNT_DISTINCT[owned], {"owner": owner_id, "up_to": up_to})
        return int(rows[0][0])

    async def count_schedules(self, owner_id: str, up_to: int) -> int:
        rows = await self._read(owned_rows.COUNT_SCHEDULES, {"owner": owner_id, "up_to": up_to})
        return int(rows[0][0])

    async def list_jobs(
        self, owner_id: str, job_filter: JobFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        statement = select(*JOB_COLUMNS).where(jobs.c.owner_id == owner_id)
        if job_filter.statuses:
            statement = statement.where(jobs.c.status.in_(sorted(job_filter.statuses)))
        for column, value in (
            (jobs.c.kind, job_filter.kind),
            (jobs.c.resource_type, job_filter.resource_type),
            (jobs.c.resource_id, job_filter.resource_id),
        ):
            if value:
                statement = statement.where(column == value)
        if after is not None:
            # The position of the caller's own last job: a token carries no
            # counter that would reveal how much other owners enqueue.
            after_seq = (
                select(jobs.c.seq)
                .where(jobs.c.id == after.job_id, jobs.c.owner_id == owner_id)
                .scalar_subquery()
            )
            statement = statement.where(jobs.c.seq < after_seq)
        statement = statement.order_by(jobs.c.seq.desc()).limit(page_size + 1)
        rows = await self._read(statement)
        page, more = rows[:page_size], len(rows) > page_size
        cursor = PageCursor(page[-1].id) if more else None
        return JobPage(jobs=[_job_from_row(row) for row in page], next_cursor=cursor)

    async def list_events(
        self, owner_id: str, job_id: str, after_sequence: int, limit: int
    ) -> list[JobEvent]:
        self._watch_other_writers()
        rows = await self._read(
            sql.LIST_EVENTS, {"owner": owner_id, "job_id": job_id, "after": after_sequence, "limit": limit}
        )
        if not rows:
            # Nothing new, or not the caller's job: tell the two apart. Another
            # owner's job and an unknown id take this same path.
            await self.get(owner_id, job_id)
            return []
        return [
            JobEvent(
                job_id=row.job_id,
                sequence=row.sequence,
                type=row.type,
                payload=row.payload,
                created_at=row.created_at,
            )
            for row in rows
        ]

    async def queued_by_kind(self) -> list[QueuedKind]:
        rows = await self._read(sql.QUEUED_BY_KIND, {"now": self._clock.now()})
        return [QueuedKind(row.kind, row.depth, row.oldest) for row in rows]

    @property
    def steering(self) -> Steering:
        return self._steering

    async def occupancy(self, owner_id: str, kind: str) -> Occupancy:
        now = self._clock.now()
        kind_running = (await self._read(queue_view.KIND_RUNNING, {"now": now, "kind": kind}))[0][0]
        owner_running = (await self._read(queue_view.OWNER_RUNNING, {"now": now, "owner": owner_id}))[0][0]
        rate = self._steering.kind_rates.get(kind)
        tokens = None
        if rate is not None:
            rows = await self._read(queue_view.BUCKET, {"kind": kind})
            bucket = steering.Bucket(rows[0].tokens, rows[0].refilled_at) if rows else None
            tokens = steering.refill(bucket, rate, now)
        paused = await self._admin.is_paused(kind)
        return steering.Occupancy(kind_running, owner_running, tokens, paused)

    async def cancel_requested(self, lease: Lease) -> bool:
        # Handlers woken by one commit reach their safe points together: their
        # checks are one read (read_batch), not one pooled connection each.
        return await self._cancel_checks.ask(lease)

    async def _cancel_requested_many(self, leases: Sequence[Lease]) -> list[bool | Exception]:
        params = self._dialect.lease_parameters(leases, self._clock.now())
        rows = await self._read(self._dialect.many_leases.cancel_requested, params)
        requested = {(row.id, row.lease_token): row.cancel_requested_at is not None for row in rows}
        return [requested.get((lease.job_id, lease.token), LeaseLost(lease.job_id)) for lease in leases]

    # ----- executing transitions --------------------------------------------------------

    def _transition(
        self, tx: WriteTx, transition: sm.Transition, statement: Any, params: dict[str, Any], now: datetime
    ) -> list[Row[Any]]:
        """Run `statement` (which executes `transition`), then write the events of
        the branch each changed row took; returns the changed rows."""
        rows = list(tx.conn.execute(statement, params).all())
        events: list[EventRow] = []
        for row in rows:
            branch = transition.branch_for(row.status)
            events.extend(
                (row.id, sequence, event_type, payload, now)
                for sequence, event_type, payload in sm.lifecycle_events(branch, row._mapping)
            )
            if branch.status is JobStatus.QUEUED and transition.source is not JobStatus.QUEUED:
                tx.announce_work()
            elif self._steering.limits_running and transition.source is JobStatus.RUNNING:
                if branch.status is not JobStatus.RUNNING:
                    tx.announce_work()  # a slot under a limit came free
        self._insert_events(tx, events)
        return rows

    def _insert_events(self, tx: WriteTx, events: list[EventRow]) -> None:
        if not events:
            return
        self._dialect.bulk_insert(
            tx.conn,
            "job_events",
            [
                {"job_id": j, "sequence": s, "type": t, "payload": p, "created_at": c}
                for j, s, t, p, c in events
            ],
        )
        tx.announce_events([JobEvent(*event) for event in events])

    def _insert_new_job(self, tx: WriteTx, values: dict[str, Any], now: datetime, dedup: bool) -> Job | None:
        """Insert a queued job with its enqueue events; None when the resource
        already has a root job."""
        statement = self._dialect.insert_if_new if dedup else sql.INSERT_JOB
        inserted = tx.conn.execute(statement, sm.queued_row(values, now)).first()
        if inserted is None:
            return None
        self._insert_events(tx, self._enqueue_events(values["id"], now))
        tx.announce_work()
        return _job_from_row(inserted)

    @staticmethod
    def _enqueue_events(job_id: str, now: datetime) -> list[EventRow]:
        return [(job_id, sequence, event_type, {}, now) for sequence, event_type in sm.enqueue_events()]

    # ----- writes serving an owner ---------------------------------------------------

    async def enqueue(self, new_job: NewJob) -> tuple[Job, bool]:
        if not new_job.resource_id:
            # Nothing to look up first: every such enqueue of a batch is one INSERT.
            return await self._writer.run_grouped(self._enqueue_group, new_job)

        def op(tx: WriteTx) -> tuple[Job, bool]:
            created = self._insert_new_job(tx, _new_job_values(new_job), self._clock.now(), dedup=True)
            if created is None:
                return self._latest_for_resource(tx, new_job), False
            return created, True

        return await self._writer.run(op)

    def _enqueue_many(self, tx: WriteTx, new_jobs: list[NewJob]) -> list[tuple[Job, bool] | Exception]:
        # Nothing the database decides shows in a new job, so no RETURNING: the
        # rows go in as one statement, and the jobs are built from them here.
        now = self._clock.now()
        rows = [sm.queued_row(_new_job_values(new_job), now) for new_job in new_jobs]
        self._dialect.bulk_insert(tx.conn, "jobs", rows)
        self._insert_events(tx, [event for row in rows for event in self._enqueue_events(row["id"], now)])
        tx.announce_work()
        return [(_job_from_mapping(row), True) for row in rows]

    async def enqueue_batch(self, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        # One operation of the writer, so one savepoint: the batch commits whole
        # or not at all, whatever else shares its transaction.
        batch = list(new_jobs)
        return await self._writer.run(lambda tx: self._enqueue_batch(tx, batch))

    def _enqueue_batch(self, tx: WriteTx, new_jobs: list[NewJob]) -> list[tuple[Job, bool]]:
        """Items without a resource id queue up for one bulk insert; each resource
        is inserted alone (the unique index decides, as for `enqueue`), once per
        batch, after the rows queued before it, so jobs are stored in request
        order. A resource named again later in the batch is answered from the
        first answer: that is its most recent job."""
        now = self._clock.now()
        answers: list[tuple[Job, bool]] = []
        unkeyed: list[dict[str, Any]] = []
        created_ids: list[str] = []
        by_resource: dict[tuple[str, str, str], Job] = {}
        for new_job in new_jobs:
            values = _new_job_values(new_job)
            if not new_job.resource_id:
                row = sm.queued_row(values, now)
                unkeyed.append(row)
                created_ids.append(row["id"])
                answers.append((_job_from_mapping(row), True))
                continue
            key = (new_job.owner_id, new_job.resource_type, new_job.resource_id)
            if key in by_resource:
                answers.append((by_resource[key], False))
                continue
            self._dialect.bulk_insert(tx.conn, "jobs", unkeyed)
            unkeyed = []
            job, created = self._insert_or_find(tx, new_job, values, now)
            if created:
                created_ids.append(job.id)
            by_resource[key] = job
            answers.append((job, created))
        self._dialect.bulk_insert(tx.conn, "jobs", unkeyed)
        # Every new job's events in one statement, announced with the commit.
        events = [event for job_id in created_ids for event in self._enqueue_events(job_id, now)]
        self._insert_events(tx, events)
        if created_ids:
            tx.announce_work()
        return answers

    def _insert_or_find(
        self, tx: WriteTx, new_job: NewJob, values: dict[str, Any], now: datetime
    ) -> tuple[Job, bool]:
        """The resource's new root job (without its events, which the caller
        writes), or its latest job when a root already exists."""
        inserted = tx.conn.execute(self._dialect.insert_if_new, sm.queued_row(values, now)).first()
        if inserted is None:
            return self._latest_for_resource(tx, new_job), False
        return _job_from_row(inserted), True

    def _latest_for_resource(self, tx: WriteTx, new_job: NewJob) -> Job:
        result = tx.conn.execute(
            sql.LATEST_FOR_RESOURCE,
            {"owner": new_job.owner_id, "rtype": new_job.resource_type, "rid": new_job.resource_id},
        )
        return _job_from_row(result.one())

    async def cancel(
        self, owner_id: str, job_id: str, grace_seconds: float = sm.DEFAULT_CANCEL_GRACE_SECONDS
    ) -> Job:
        def op(tx: WriteTx) -> Job:
            now = self._clock.now()
            current = self._owned_job(tx, owner_id, job_id)
            transition = sm.owner_cancel(current.status, current.cancel_requested_at is not None)
            if transition is None:
                return current
            statement = sql.OWNER_CANCEL[transition.name]
            inputs = sm.Inputs(now=now, grace_until=now + timedelta(seconds=grace_seconds))
            params = {**parameters(inputs), "job_id": job_id, "owner": owner_id}
            (row,) = self._transition(tx, transition, statement, params, now)
            return _job_from_row(row)

        return await self._writer.run(op)

    async def retry(self, owner_id: str, job_id: str) -> Job:
        return await self._writer.run(lambda tx: self._retry(tx, owner_id, job_id))

    def _retry(self, tx: WriteTx, owner_id: str, job_id: str) -> Job:
        now = self._clock.now()
        source = tx.conn.execute(sql.GET_SOURCE_FOR_RETRY, {"job_id": job_id, "owner": owner_id}).first()
        if source is None:
            raise JobNotFound(job_id)
        if not sm.can_retry(JobStatus(source.status)):
            raise RetryNotAllowed(job_id, source.status)
        values = {"id": ids.new_job_id(), **sm.retry_values(source._mapping)}
        created = self._insert_new_job(tx, values, now, dedup=False)
        assert created is not None
        return created

    def _owned_job(self, tx: WriteTx, owner_id: str, job_id: str) -> Job:
        row = tx.conn.execute(sql.GET_JOB_FOR_UPDATE, {"job_id": job_id, "owner": owner_id}).first()
        if row is None:
            raise JobNotFound(job_id)
        return _job_from_row(row)

    # ----- administration (sql/admin.py) ---------------------------------------------

    async def queue_stats(self) -> QueueStats:
        return await self._admin.queue_stats(self._clock.now())

    async def lease_holders(
        self, remote_kinds: KindPatterns, worker_ids: Collection[str]
    ) -> list[LeaseHolder]:
        return await self._admin.lease_holders(self._clock.now(), remote_kinds, worker_ids)

    async def list_all_jobs(
        self, job_filter: AdminFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        return await self._admin.list_all_jobs(job_filter, page_size, after)

    async def bulk_cancel(
        self, job_filter: AdminFilter, below: int | None, limit: int, grace_seconds: float, dry_run: bool
    ) -> BulkBatch:
        return await self._admin.bulk_cancel(job_filter, below, limit, grace_seconds, dry_run)

    async def bulk_retry(
        self, job_filter: AdminFilter, below: int | None, limit: int, dry_run: bool
    ) -> BulkBatch:
        return await self._admin.bulk_retry(job_filter, below, limit, dry_run)

    async def newest_position(self) -> int:
        return await self._admin.newest_position()

    async def set_kind_paused(self, kind: str, paused: bool) -> bool:
        return await self._admin.set_kind_paused(kind, paused)

    # ----- idempotent calls (request ids) -----------------------------------------------

    async def enqueue_once(self, new_jobs: Sequence[NewJob], key: RequestKey) -> KeyedAnswer:
        batch = list(new_jobs)
        if len(batch) == 1 and not batch[0].resource_id:
            # The commonest idempotent call (a client sends a request id with
            # every Enqueue): its answer is known before anything is written,
            # so such calls of a batch share their statements, as plain ones do.
            return await self._writer.run_grouped(self._enqueue_once_group, (batch[0], key))
        return await self._writer.run(lambda tx: self._once(tx, key, lambda: self._enqueue_batch(tx, batch)))

    def _enqueue_once_many(
        self, tx: WriteTx, items: list[tuple[NewJob, RequestKey]]
    ) -> list[KeyedAnswer | Exception]:
        """Single new jobs without a resource key, each under its request id:
        every key goes in with its final answer (the job id is drawn here, and
        such a job is always created) in one INSERT; the jobs whose keys went
        in are inserted together; every other call is a repeat, answered from
        its key's row once those jobs are in."""
        now = self._clock.now()
        firsts: dict[tuple[str, str], Job] = {}
        key_rows = []
        job_rows = []
        for new_job, key in items:
            ident = (key.owner_id, key.request_id)
            if ident in firsts:
                continue
            row = sm.queued_row(_new_job_values(new_job), now)
            firsts[ident] = job = _job_from_mapping(row)
            job_rows.append(row)
            key_rows.append(self._key_row(key, idempotency.record([(job, True)]), now))
        inserted = tx.conn.execute(self._dialect.insert_request_id, key_rows)
        taken = {(row.owner_id, row.request_id) for row in inserted}
        created = [row for row, ident in zip(job_rows, firsts, strict=True) if ident in taken]
        if created:
            self._dialect.bulk_insert(tx.conn, "jobs", created)
            events = [event for row in created for event in self._enqueue_events(row["id"], now)]
            self._insert_events(tx, events)
            tx.announce_work()
        answers: list[KeyedAnswer | Exception] = []
        for _, key in items:
            ident = (key.owner_id, key.request_id)
            if ident in taken:
                taken.discard(ident)  # the first call with the key; any later one is a repeat
                answers.append(KeyedAnswer([(firsts[ident], True)], repeated=False))
                continue
            try:
                answers.append(self._replay(tx, key))
            except (RequestIdReused, RequestResultDeleted) as exc:
                answers.append(exc)
        return answers

    @staticmethod
    def _key_row(key: RequestKey, response: list[dict[str, Any]], now: datetime) -> dict[str, Any]:
        return {
            "owner_id": key.owner_id,
            "request_id": key.request_id,
            "method": key.method.value,
            "fingerprint": key.fingerprint,
            "response": response,
            "created_at": now,
        }

    async def retry_once(self, owner_id: str, job_id: str, key: RequestKey) -> KeyedAnswer:
        return await self._writer.run(
            lambda tx: self._once(tx, key, lambda: [(self._retry(tx, owner_id, job_id), True)])
        )

    def _once(self, tx: WriteTx, key: RequestKey, act: Callable[[], list[Answer]]) -> KeyedAnswer:
        """Take the key, then act and record the answer; or, when the key is
        taken, answer from its record. All in the caller's savepoint: a call
        that fails leaves neither jobs nor a key behind."""
        taken = tx.conn.execute(
            self._dialect.insert_request_id, self._key_row(key, [], self._clock.now())
        ).first()
        if taken is None:
            return self._replay(tx, key)
        answers = act()
        tx.conn.execute(
            request_rows.SET_RESPONSE,
            {"owner": key.owner_id, "rid": key.request_id, "response": idempotency.record(answers)},
        )
        return KeyedAnswer(answers, repeated=False)

    @staticmethod
    def _replay(tx: WriteTx, key: RequestKey) -> KeyedAnswer:
        found = tx.conn.execute(request_rows.FIND, {"owner": key.owner_id, "rid": key.request_id}).one()
        ids = idempotency.recorded_job_ids(found.response)
        rows = tx.conn.execute(request_rows.JOBS_NAMED, {"ids": ids, "owner": key.owner_id}).all()
        jobs_named = {row.id: _job_from_row(row) for row in rows}
        return idempotency.replay(key, found.method, found.fingerprint, found.response, jobs_named)

    async def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        params = {"cutoff": created_before, "last": limit - 1}
        return await self._sweeper.run(lambda tx: tx.conn.execute(request_rows.FORGET, params).rowcount)

    # ----- schedules and retention --------------------------------------------------

    async def create_schedule(self, new_schedule: schedules.NewSchedule) -> schedules.Schedule:
        return await self._writer.run(
            lambda tx: schedule_rows.create(tx.conn, new_schedule, self._clock.now())
        )

    async def get_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule:
        rows = await self._read(schedule_rows.GET, {"owner": owner_id, "sid": schedule_id})
        if not rows:
            raise ScheduleNotFound(schedule_id)
        return schedule_rows.schedule_from_row(rows[0])

    async def list_schedules(
        self, owner_id: str, page_size: int, after: str | None
    ) -> schedules.SchedulePage:
        rows = await self._read(
            schedule_rows.LIST, {"owner": owner_id, "after": after or "", "limit": page_size + 1}
        )
        page = [schedule_rows.schedule_from_row(row) for row in rows[:page_size]]
        cursor = page[-1].schedule_id if len(rows) > page_size else None
        return schedules.SchedulePage(page, cursor)

    async def set_schedule_paused(self, owner_id: str, schedule_id: str, paused: bool) -> schedules.Schedule:
        def op(tx: WriteTx) -> schedules.Schedule:
            now = self._clock.now()
            current = schedule_rows.owned(tx.conn, owner_id, schedule_id, for_update=True)
            if current.paused == paused:
                return current
            next_fire_at = None if paused else current.rule.next_after(now)
            changed = replace(current, paused=paused, next_fire_at=next_fire_at, updated_at=now)
            return schedule_rows.store(tx.conn, changed)

        return await self._writer.run(op)

    async def delete_schedule(self, owner_id: str, schedule_id: str) -> None:
        def op(tx: WriteTx) -> None:
            deleted = tx.conn.execute(schedule_rows.DELETE, {"owner": owner_id, "sid": schedule_id})
            if deleted.rowcount == 0:
                raise ScheduleNotFound(schedule_id)

        await self._writer.run(op)

    async def trigger_schedule(self, owner_id: str, schedule_id: str) -> tuple[schedules.Schedule, Job]:
        def op(tx: WriteTx) -> tuple[schedules.Schedule, Job]:
            now = self._clock.now()
            current = schedule_rows.owned(tx.conn, owner_id, schedule_id, for_update=True)
            job = self._enqueue_firing(tx, current, now, now)
            return schedule_rows.store(tx.conn, schedules.triggered(current, job.id, now)), job

        return await self._writer.run(op)

    def _enqueue_firing(
        self, tx: WriteTx, schedule: schedules.Schedule, fire_at: datetime, now: datetime
    ) -> Job:
        """The firing's job: new, or the one another replica already made for it."""
        new_job = schedules.firing_job(schedule, fire_at)
        created = self._insert_new_job(tx, _new_job_values(new_job), now, dedup=True)
        return created if created is not None else self._latest_for_resource(tx, new_job)

    async def fire_due_schedules(self) -> schedules.FiringRound:
        outcomes: list[schedules.FiringOutcome] = []
        # A look that finds nothing due costs one indexed read, not a write
        # transaction (on SQLite, the file's write lock) every few seconds.
        upcoming = await self._next_fire_at()
        if upcoming is None or upcoming > self._clock.now():
            return schedules.FiringRound(outcomes, upcoming)
        while True:
            batch = await self._writer.run(self._fire_due)
            outcomes.extend(batch)
            if len(batch) < FIRING_BATCH:
                break
        return schedules.FiringRound(outcomes, await self._next_fire_at())

    async def _next_fire_at(self) -> datetime | None:
        rows = await self._read(schedule_rows.NEXT_FIRE_AT)
        return rows[0][0] if rows else None

    def _fire_due(self, tx: WriteTx) -> list[schedules.FiringOutcome]:
        """Fire a batch of due schedules (at most FIRING_BATCH)."""
        now = self._clock.now()
        due = tx.conn.execute(
            schedule_rows.DUE[self._dialect.locks_rows], {"now": now, "limit": FIRING_BATCH}
        ).all()
        outcomes = []
        for row in due:
            schedule = schedule_rows.schedule_from_row(row)
            running = schedule.overlap is schedules.OverlapPolicy.SKIP and schedule_rows.previous_running(
                tx.conn, schedule
            )
            firing = schedules.plan_firing(schedule, now, running)
            job_id = None
            if firing.fire_at is not None:
                job_id = self._enqueue_firing(tx, schedule, firing.fire_at, now).id
            schedule_rows.store(tx.conn, schedules.after_firing(schedule, firing, job_id, now))
            outcomes.append(schedules.outcome(schedule, firing, job_id))
        return outcomes

    async def delete_expired(self, finished_before: datetime, limit: int) -> int:
        def op(tx: WriteTx) -> int:
            ids: list[str] = []
            for statement in schedule_rows.EXPIRED[self._dialect.locks_rows]:
                remaining = limit - len(ids)
                if remaining > 0:
                    ids.extend(
                        tx.conn.execute(statement, {"cutoff": finished_before, "limit": remaining}).scalars()
                    )
            if not ids:
                return 0
            tx.conn.execute(schedule_rows.DELETE_EVENTS, {"ids": ids})
            return tx.conn.execute(schedule_rows.DELETE_JOBS, {"ids": ids}).rowcount

        return await self._sweeper.run(op)

    # ----- writes serving a worker -----------------------------------------------------

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        self._watch_other_writers()
        result, now = await self._writer.run(self._claim_op(worker_id, limit, lease_seconds, kinds))
        # Only a committed claim moves the mark, so a rolled-back re-anchor is
        # redone. After a re-anchor nothing is stamped later than `now`.
        self._claim_clock_high_water = now
        return result

    async def claim_with_next_work(
        self,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        kinds: KindFilter,
        give_up: asyncio.Event,
        timeout: float,
    ) -> ClaimResult | None:
        # The claim rides in the writer's next batch that makes work claimable:
        # its transaction, its commit.
        self._watch_other_writers()
        waiting = self._writer.run_on_next_work(self._claim_op(worker_id, limit, lease_seconds, kinds))
        try:
            outcome = await first_of(waiting.result(), give_up, timeout)
        except asyncio.CancelledError:
            # Nobody will run what a batch may already have claimed: give it back.
            late = await asyncio.shield(waiting.withdraw())
            if late is not None:
                await asyncio.shield(self._hand_back(late[0]))
            raise
        if outcome is None:
            outcome = await waiting.withdraw()
        if outcome is None:
            return None
        result, now = outcome
        self._claim_clock_high_water = now
        return result

    async def _hand_back(self, result: ClaimResult) -> None:
        await asyncio.gather(*(self.release(c.lease) for c in result.jobs), return_exceptions=True)

    def _claim_op(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter
    ) -> WriteOp[tuple[ClaimResult, datetime]]:
        high_water = self._claim_clock_high_water

        def op(tx: WriteTx) -> tuple[ClaimResult, datetime]:
            if self._steering.has_limits:
                # Before the time is read: a claim that waited for another to
                # commit counts leases, and stamps its starts, from after that.
                self._dialect.lock_claims(tx.conn)
            now = self._clock.now()
            if high_water is None or now < high_water:
                # First claim of this process (perhaps after a snapshot restore), or
                # the wall clock went back since the last one: only then can queued
                # jobs carry stamps from the future. Checking walks every job in
                # backoff, so it stays off the hot path otherwise.
                tx.conn.execute(sql.REANCHOR_AFTER_CLOCK_STEP, {"now": now})
            view = queue_view.SqlQueueView(tx.conn, self._dialect, kinds, now, self._clock)
            if self._steering.has_limits:
                # Counted first, so the starts are stamped (from `counted_at`)
                # close to when their slots were seen free. A job this claim's
                # recovery ends past its deadline still counts: this claim is
                # cautious, the next one sees the slot.
                view.running()
            expired = self._recover(tx, now)
            claimed, rate_wakeup, started = self._lease_due(tx, view, worker_id, limit, lease_seconds, now)
            # A claim that filled its limit is made again at once: no wake-up to find.
            later = None if len(claimed) == limit else self._next_wakeup(tx, kinds, now)
            wakeups = (later, rate_wakeup)
            result = ClaimResult(
                jobs=claimed,
                next_wakeup_at=min((m for m in wakeups if m is not None), default=None),
                recovered=expired,
            )
            return result, started

        return op

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        return await self._writer.run(lambda tx: self._recover(tx, self._clock.now()))

    def _recover(self, tx: WriteTx, now: datetime) -> list[RecoveredJob]:
        """Expired leases first: an attempt whose worker stopped heartbeating
        ended because the worker went away, whatever deadline it also passed;
        what is left overdue still has a live worker, which must be stopped."""
        expired = self._transition(
            tx, sm.RECOVER_EXPIRED_LEASE, self._dialect.recover_expired, {"now": now}, now
        )
        overdue = self._transition(
            tx,
            sm.END_OVERDUE,
            self._dialect.end_overdue,
            parameters(sm.Inputs(now=now, jitter=self._jitter())),
            now,
        )
        return [
            RecoveredJob(row.id, row.kind, JobStatus(row.status), lease_expired=lease_expired)
            for rows, lease_expired in ((expired, True), (overdue, False))
            for row in rows
        ]

    def _lease_due(
        self,
        tx: WriteTx,
        view: queue_view.SqlQueueView,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        now: datetime,
    ) -> tuple[list[ClaimedJob], datetime | None, datetime]:
        """Lease the jobs `steering.choose` deals this claim; also answers when
        a rate-limited kind next has a token, if one ran out, and the time the
        starts are stamped with."""
        if limit <= 0:
            return [], None, now
        rules = self._steering
        tokens = queue_view.bucket_tokens(tx.conn, rules.kind_rates, now)
        choice = steering.choose(view, rules, limit, self._fair_share_cursor, tokens)
        self._fair_share_cursor = choice.cursor
        queue_view.spend_tokens(tx.conn, self._dialect, tokens, choice.rate_spent, now)
        rate_wakeup = steering.rate_wakeup(tokens, choice.rate_spent, rules.kind_rates, now)
        if not choice.job_ids:
            return [], rate_wakeup, now
        # Starts dealt from running counts are stamped after the counts were
        # read. An attempt another process ended is stamped before its commit,
        # so one this claim saw ended carries an earlier time than the starts
        # that took its slot: the event log never shows more running than a
        # limit allowed.
        started = now if view.counted_at is None else max(now, view.counted_at)
        # One token for the whole claim: fencing is per (job id, token), and every
        # claim draws a fresh one, so no other attempt of these jobs can hold it.
        inputs = sm.Inputs(
            now=started,
            worker=worker_id,
            token=ids.new_lease_token(),
            expires_at=started + timedelta(seconds=lease_seconds),
        )
        params = {**parameters(inputs), **self._dialect.chosen_parameters(choice.job_ids)}
        rows = self._transition(tx, sm.CLAIM, self._dialect.claim_chosen, params, started)
        # RETURNING gives no order: put them back in the order they were dealt in.
        dealt = {job_id: place for place, job_id in enumerate(choice.job_ids)}
        rows.sort(key=lambda row: dealt[row.id])
        assert inputs.token is not None and inputs.expires_at is not None
        claimed = [
            ClaimedJob(
                job=_job_from_row(row),
                payload=row.payload,
                lease=Lease(job_id=row.id, token=inputs.token, attempt=row.attempt),
                lease_expires_at=inputs.expires_at,
                checkpoint=row.checkpoint,
            )
            for row in rows
        ]
        return claimed, rate_wakeup, started

    @staticmethod
    def _next_wakeup(tx: WriteTx, kinds: KindFilter, now: datetime) -> datetime | None:
        params: dict[str, Any] = {"now": now}
        if kinds.only is not None:
            params["kinds"] = sorted(kinds.only)
        row = tx.conn.execute(sql.next_wakeup(kinds.shape), params).one()
        return min((m for m in (row.available, row.expiry) if m is not None), default=None)

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        renewal = await self._renew_one(lease, lease_seconds)
        return renewal.expires_at

    async def heartbeat(self, leases: list[Lease], lease_seconds: float) -> list[LeaseRenewal | None]:
        # Each lease joins the writer's current batch of renewals: however many
        # workers heartbeat at once, a batch is one statement.
        answers = await asyncio.gather(
            *(self._renew_one(lease, lease_seconds) for lease in leases), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, LeaseLost):
                raise answer
        return [answer if isinstance(answer, LeaseRenewal) else None for answer in answers]

    async def _renew_one(self, lease: Lease, lease_seconds: float) -> LeaseRenewal:
        # Heartbeats of jobs claimed together fall due together: one statement
        # renews every lease whose heartbeat reached the same batch.
        group = OpGroup(f"renew:{lease_seconds!r}", functools.partial(self._renew_many, lease_seconds))
        return await self._writer.run_grouped(group, lease)

    def _renew_many(
        self, lease_seconds: float, tx: WriteTx, leases: list[Lease]
    ) -> list[LeaseRenewal | Exception]:
        now = self._clock.now()
        expires_at = now + timedelta(seconds=lease_seconds)
        answers: dict[int, LeaseRenewal | Exception] = {}
        # Two leases on one job (a stale one and perhaps the valid one) go in
        # separate statements: a returned row names its token, but one
        # statement would renew the row once for both.
        waiting = list(enumerate(leases))
        while waiting:
            this_round: dict[str, tuple[int, Lease]] = {}
            later: list[tuple[int, Lease]] = []
            for index, lease in waiting:
                if lease.job_id in this_round:
                    later.append((index, lease))
                else:
                    this_round[lease.job_id] = (index, lease)
            batch = [lease for _, lease in this_round.values()]
            inputs = sm.Inputs(now=now, expires_at=expires_at)
            params = {**parameters(inputs), **self._dialect.lease_parameters(batch, now)}
            rows = tx.conn.execute(self._dialect.many_leases.heartbeat, params).all()
            renewed = {(row.id, row.lease_token): row.cancel_requested_at is not None for row in rows}
            for index, lease in this_round.values():
                key = (lease.job_id, lease.token)
                answers[index] = (
                    LeaseRenewal(expires_at, renewed[key]) if key in renewed else LeaseLost(lease.job_id)
                )
            waiting = later
        return [answers[index] for index in range(len(leases))]

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        def op(tx: WriteTx) -> LeaseRenewal:
            now = self._clock.now()
            expires_at = now + timedelta(seconds=lease_seconds)
            inputs = sm.Inputs(now=now, expires_at=expires_at, checkpoint=checkpoint)
            params = {**parameters(inputs), **_fence(lease)}
            rows = tx.conn.execute(sql.SAVE_CHECKPOINT, params).all()
            if not rows:
                raise LeaseLost(lease.job_id)
            return LeaseRenewal(expires_at, rows[0].cancel_requested_at is not None)

        return await self._writer.run(op)

    async def succeed(self, lease: Lease, result: JsonObject | None = None, remember: bool = False) -> Job:
        if result is None and not remember:
            # The common case, and the same statement for every lease: successes
            # that queue together are one UPDATE.
            return await self._writer.run_grouped(self._succeed_group, lease)
        return await self._single_lease(
            sm.SUCCEED, lease, lambda now: sm.Inputs(now=now, result=result), remember
        )

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        """`succeed`, answering only the status the job ended in (SUCCEEDED, or
        CANCELLED when a cancel request won): what the runtime needs, without
        reading back and building the whole job."""
        if result is None:
            return await self._writer.run_grouped(self._succeed_status_group, lease)
        return (await self.succeed(lease, result)).status

    def _succeed_many(self, tx: WriteTx, leases: list[Lease]) -> list[Job | Exception]:
        statement = self._dialect.many_leases.succeed
        return self._succeed_leases(tx, leases, statement, _job_from_row)

    def _succeed_status_many(self, tx: WriteTx, leases: list[Lease]) -> list[JobStatus | Exception]:
        statement = self._dialect.many_leases.succeed_status
        return self._succeed_leases(tx, leases, statement, lambda row: JobStatus(row.status))

    def _succeed_leases(
        self, tx: WriteTx, leases: list[Lease], statement: Any, answer: Callable[[Row[Any]], T]
    ) -> list[T | Exception]:
        """Succeed every lease in as few statements as possible; each changed row
        gives its caller's `answer`. Two leases on one job (a stale one and
        perhaps the valid one) go in separate statements, one after the other,
        since the row returned cannot say whose it was."""
        answers: dict[int, T | Exception] = {}
        waiting = list(enumerate(leases))
        while waiting:
            now = self._clock.now()
            this_round: dict[str, int] = {}
            later: list[tuple[int, Lease]] = []
            for index, lease in waiting:
                if lease.job_id in this_round:
                    later.append((index, lease))
                else:
                    this_round[lease.job_id] = index
            fences = self._dialect.lease_parameters([leases[index] for index in this_round.values()], now)
            rows = self._transition(
                tx, sm.SUCCEED, statement, {**parameters(sm.Inputs(now=now)), **fences}, now
            )
            done = {row.id: answer(row) for row in rows}
            for job_id, index in this_round.items():
                found = done.get(job_id)
                answers[index] = LeaseLost(job_id) if found is None else found
            waiting = later
        return [answers[index] for index in range(len(leases))]

    async def mark_cancelled(self, lease: Lease, remember: bool = False) -> Job:
        return await self._single_lease(sm.CONFIRM_CANCEL, lease, lambda now: sm.Inputs(now=now), remember)

    async def fail(
        self,
        lease: Lease,
        error: str,
        retryable: bool = True,
        error_type: str | None = None,
        retry_after_seconds: float | None = None,
        remember: bool = False,
    ) -> Job:
        def inputs(now: datetime) -> sm.Inputs:
            return sm.Inputs(
                now=now,
                jitter=self._jitter(),
                retryable=retryable,
                error=limits.storable_error(error),
                error_type=limits.storable_error_type(error_type),
                retry_at=None
                if retry_after_seconds is None
                else now + timedelta(seconds=retry_after_seconds),
            )

        return await self._single_lease(sm.FAIL, lease, inputs, remember)

    async def snooze(self, lease: Lease, delay_seconds: float, remember: bool = False) -> Job:
        def inputs(now: datetime) -> sm.Inputs:
            return sm.Inputs(now=now, retry_at=now + timedelta(seconds=delay_seconds))

        return await self._single_lease(sm.SNOOZE, lease, inputs, remember)

    async def release(self, lease: Lease) -> Job:
        """Give the attempt back unfinished (the worker is shutting down): the job is
        claimable again at once, and the interrupted attempt does not count."""
        return await self._single_lease(sm.RELEASE, lease, lambda now: sm.Inputs(now=now))

    async def _single_lease(
        self, transition: sm.Transition, lease: Lease, inputs: Any, remember: bool = False
    ) -> Job:
        """One fenced UPDATE executing `transition` for `lease`, with its events
        (and, to `remember` it, the write's record in the same transaction)."""
        statement = sql.SINGLE_LEASE[transition.name]

        def op(tx: WriteTx) -> Job:
            now = self._clock.now()
            params = {**parameters(inputs(now)), **_fence(lease)}
            rows = self._transition(tx, transition, statement, params, now)
            if not rows:
                raise LeaseLost(lease.job_id)
            job = _job_from_row(rows[0])
            if remember:
                record = worker_writes.finished(lease, transition, job, now)
                tx.conn.execute(worker_write_rows.INSERT, record.row())
            return job

        return await self._writer.run(op)

    async def append_event(
        self, lease: Lease, event_type: str, payload: JsonObject, request_id: str | None = None
    ) -> JobEvent:
        if request_id is None:
            # Jobs that report progress together append together: every event of a
            # batch takes its sequence in one UPDATE and goes in with one INSERT.
            return await self._writer.run_grouped(self._append_group, _Append(lease, event_type, payload))

        def op(tx: WriteTx) -> JobEvent:
            found = tx.conn.execute(worker_write_rows.FIND, self._worker_write_key(lease, request_id)).first()
            if found is not None:
                stored = worker_write_rows.from_row(found._mapping)
                return worker_writes.replay_append(stored, request_id, event_type, payload)
            answer = self._append_many(tx, [_Append(lease, event_type, payload)])[0]
            if isinstance(answer, Exception):
                raise answer
            tx.conn.execute(worker_write_rows.INSERT, worker_writes.appended(lease, request_id, answer).row())
            return answer

        return await self._writer.run(op)

    @staticmethod
    def _worker_write_key(lease: Lease, request_key: str) -> dict[str, Any]:
        return {"job_id": lease.job_id, "token": lease.token, "request_key": request_key}

    async def worker_write(self, lease: Lease, request_key: str) -> worker_writes.WorkerWrite | None:
        rows = await self._read(worker_write_rows.FIND, self._worker_write_key(lease, request_key))
        return worker_write_rows.from_row(rows[0]._mapping) if rows else None

    def _held_leases(self, tx: WriteTx, leases: list[Lease], now: datetime) -> set[tuple[str, str]]:
        """Which of `leases` still hold their jobs (an append that got no row for
        one of them met the event limit, not a lost lease)."""
        params = self._dialect.lease_parameters(leases, now)
        rows = tx.conn.execute(self._dialect.many_leases.cancel_requested, params).all()
        return {(row.id, row.lease_token) for row in rows}

    def _append_many(self, tx: WriteTx, appends: list[_Append]) -> list[JobEvent | Exception]:
        now = self._clock.now()
        answers: dict[int, JobEvent | Exception] = {}
        events: list[EventRow] = []
        # Two appends on one job (concurrent ones by its handler, or a stale
        # lease beside the valid one) go in separate statements: one UPDATE
        # takes one sequence per row, however many leases name it.
        waiting = list(enumerate(appends))
        while waiting:
            this_round: dict[str, tuple[int, _Append]] = {}
            later: list[tuple[int, _Append]] = []
            for index, append in waiting:
                if append.lease.job_id in this_round:
                    later.append((index, append))
                else:
                    this_round[append.lease.job_id] = (index, append)
            params = self._dialect.lease_parameters([a.lease for _, a in this_round.values()], now)
            params["max_events"] = NO_EVENT_LIMIT if self._max_events is None else self._max_events
            rows = tx.conn.execute(self._dialect.many_leases.append_event, params).all()
            taken = {(row.id, row.lease_token): row.last_event_sequence for row in rows}
            missed = [a.lease for _, a in this_round.values() if (a.lease.job_id, a.lease.token) not in taken]
            full = self._held_leases(tx, missed, now) if missed and self._max_events is not None else set()
            for index, append in this_round.values():
                lease = append.lease
                sequence = taken.get((lease.job_id, lease.token))
                if sequence is None:
                    answers[index] = (
                        EventLimitReached(lease.job_id, self._max_events or 0)
                        if (lease.job_id, lease.token) in full
                        else LeaseLost(lease.job_id)
                    )
                    continue
                events.append((lease.job_id, sequence, append.event_type, append.payload, now))
                answers[index] = JobEvent(lease.job_id, sequence, append.event_type, append.payload, now)
            waiting = later
        self._insert_events(tx, events)
        return [answers[index] for index in range(len(appends))]
