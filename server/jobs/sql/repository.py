"""`JobRepository` over SQLAlchemy Core, on SQLite or PostgreSQL.

Writes go through the group-commit writer; reads use their own pooled
connections and hold no transaction between statements. Every worker transition
is one fenced UPDATE (`id`, `status = 'running'`, the lease token, an unexpired
lease) that also reserves the event sequences it writes. The UPDATE holds the
job's row lock until the transaction commits, so even with several replicas
appending to one job, each takes the next number only after the last one
committed: a stale worker can change nothing and event logs stay gap-free.

Commits made by other processes reach this one's change hub by the engine's
own means: a cheap poll of SQLite's data version, or PostgreSQL's LISTEN.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import structlog
from sqlalchemy import Row, select, update
from sqlalchemy.exc import DBAPIError

from leasehold._server.clock import Clock
from leasehold._server.jobs import ids, limits, state_machine
from leasehold._server.jobs.errors import (
    JobNotFound,
    LeaseLost,
    RetryNotAllowed,
    StorageClosed,
    StorageFull,
    StorageUnavailable,
)
from leasehold._server.jobs.notifications import ChangeHub
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
    NewJob,
    PageCursor,
)
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql.engines import Engines, listener_connect_args
from leasehold._server.jobs.sql.errors import translate_storage_error
from leasehold._server.jobs.sql.tables import jobs
from leasehold._server.jobs.sql.writer import GroupCommitWriter, OpGroup, WriteTx

_JOB_COLUMNS = sql.JOB_COLUMNS

log = structlog.get_logger("leasehold.storage")


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
    }


def _queued_row(values: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The row of a new job, queued and available now."""
    return {
        **values,
        "status": JobStatus.QUEUED.value,
        "attempt": 0,
        "available_at": now,
        "last_event_sequence": 1,
        "created_at": now,
        "updated_at": now,
    }


def _fences(flavour: str, leases: list[Lease], now: datetime) -> dict[str, Any]:
    """The parameters of `statements.FENCED_MANY[flavour]`."""
    job_ids = [lease.job_id for lease in leases]
    if flavour == "postgresql":
        return {"job_ids": job_ids, "tokens": [lease.token for lease in leases], "now": now}
    return {
        "job_ids": job_ids,
        "fences": [(lease.job_id, lease.token, sql.RUNNING) for lease in leases],
        "now": now,
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
    )


# How often to look for commits made by other processes on the same file.
OTHER_WRITERS_POLL_SECONDS = 1.0


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
    ) -> None:
        self._engines = engines
        self._clock = clock
        # The time of the last committed claim; None until the first. See claim().
        self._claim_clock_high_water: datetime | None = None
        self._changes = changes or ChangeHub()
        self._other_writers_feed: Callable[[], Coroutine[Any, Any, None]]
        if engines.flavour == "postgresql":
            from leasehold._server.jobs.sql import postgres_changes  # needs the optional driver

            origin = postgres_changes.new_origin()
            announce = postgres_changes.notifier(origin)
            listener = postgres_changes.ChangeListener(listener_connect_args(engines), self._changes, origin)
            self._other_writers_feed = listener.run
        else:
            announce = None
            self._other_writers_feed = self._announce_other_writers
        self._writer = GroupCommitWriter(
            engines.writer, self._changes, begin_statement=engines.begin_statement, announce=announce
        )
        self._succeed_group = OpGroup("succeed", self._succeed_many)
        self._enqueue_group = OpGroup("enqueue", self._enqueue_many)
        self._other_writers_poll_seconds = other_writers_poll_seconds
        self._other_writers_watch: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def changes(self) -> ChangeHub:
        return self._changes

    async def close(self) -> None:
        self._closing = True
        if self._other_writers_watch is not None:
            self._other_writers_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._other_writers_watch
        await self._writer.close()
        await self._engines.dispose()

    def _watch_other_writers(self) -> None:
        """Start, once, the task that announces other processes' commits. Called
        by the paths whose callers then wait on the change hub."""
        if self._closing:
            return
        if self._other_writers_watch is None or self._other_writers_watch.done():
            self._other_writers_watch = asyncio.create_task(
                self._other_writers_feed(), name="leasehold-other-writers"
            )

    async def _announce_other_writers(self) -> None:
        """SQLite: one look at the file's data version per interval."""
        while True:
            await asyncio.sleep(self._other_writers_poll_seconds)
            try:
                if await self._writer.others_committed():
                    self._changes.publish_unknown_changes()
            except StorageClosed:
                return
            except (StorageUnavailable, StorageFull) as exc:
                log.warning("storage.other_writers_check_failed", error=str(exc))
            except Exception as exc:  # a bug, or a file gone bad: keep looking, loudly
                log.error("storage.other_writers_check_failed", error_class=type(exc).__name__, exc_info=exc)

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

    async def list_jobs(
        self, owner_id: str, job_filter: JobFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        statement = select(*_JOB_COLUMNS).where(jobs.c.owner_id == owner_id)
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

    async def cancel_requested(self, lease: Lease) -> bool:
        rows = await self._read(sql.CANCEL_REQUESTED, self._fence(lease, self._clock.now()))
        if not rows:
            raise LeaseLost(lease.job_id)
        return rows[0].cancel_requested_at is not None

    # ----- writes serving an owner ---------------------------------------------------

    async def enqueue(self, new_job: NewJob) -> tuple[Job, bool]:
        if not new_job.resource_id:
            # Nothing to look up first: every such enqueue of a batch is one INSERT.
            return await self._writer.run_grouped(self._enqueue_group, new_job)

        def op(tx: WriteTx) -> tuple[Job, bool]:
            created = self._insert_job(tx, _new_job_values(new_job), self._clock.now(), dedup=True)
            if created is None:
                return self._latest_for_resource(tx, new_job), False
            return created, True

        return await self._writer.run(op)

    def _enqueue_many(self, tx: WriteTx, new_jobs: list[NewJob]) -> list[tuple[Job, bool] | Exception]:
        # Nothing the database decides shows in a new job, so no RETURNING: the
        # rows go in as one statement, and the jobs are built from them here.
        now = self._clock.now()
        rows = [_queued_row(_new_job_values(new_job), now) for new_job in new_jobs]
        sql.INSERT_JOBS(tx.conn, rows)
        self._insert_events(tx, [(row["id"], 1, "job.queued", {}, now) for row in rows])
        tx.announce_work()
        return [(_job_from_mapping(row), True) for row in rows]

    def _latest_for_resource(self, tx: WriteTx, new_job: NewJob) -> Job:
        result = tx.conn.execute(
            select(*_JOB_COLUMNS)
            .where(
                jobs.c.owner_id == new_job.owner_id,
                jobs.c.resource_type == new_job.resource_type,
                jobs.c.resource_id == new_job.resource_id,
            )
            .order_by(jobs.c.seq.desc())
            .limit(1)
        )
        return _job_from_row(result.one())

    def _insert_job(self, tx: WriteTx, values: dict[str, Any], now: datetime, dedup: bool) -> Job | None:
        """Insert a queued job with its `job.queued` event; None when the resource
        already has a root job."""
        statement = sql.insert_job_if_new(tx.conn.dialect.name) if dedup else sql.INSERT_JOB
        result = tx.conn.execute(statement, _queued_row(values, now))
        inserted = result.first()
        if inserted is None:
            return None
        self._insert_events(tx, [(values["id"], 1, "job.queued", {}, now)])
        tx.announce_work()
        return _job_from_row(inserted)

    async def cancel(self, owner_id: str, job_id: str) -> Job:
        def op(tx: WriteTx) -> Job:
            now = self._clock.now()
            current = self._owned_job(tx, owner_id, job_id)
            if current.status is JobStatus.QUEUED:
                changes: dict[str, Any] = {
                    "status": JobStatus.CANCELLED.value,
                    "completed_at": now,
                }
                event = "job.cancelled"
            elif current.status is JobStatus.RUNNING and current.cancel_requested_at is None:
                changes = {"cancel_requested_at": now}
                event = "job.cancel_requested"
            else:
                return current
            result = tx.conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.status == current.status.value)
                .values(
                    **changes,
                    updated_at=now,
                    last_event_sequence=jobs.c.last_event_sequence + 1,
                )
                .returning(*sql.RETURNING)
            )
            row = result.one()
            self._insert_events(tx, [(job_id, row.last_event_sequence, event, {}, now)])
            return _job_from_row(row)

        return await self._writer.run(op)

    async def retry(self, owner_id: str, job_id: str) -> Job:
        def op(tx: WriteTx) -> Job:
            now = self._clock.now()
            result = tx.conn.execute(select(jobs).where(jobs.c.id == job_id, jobs.c.owner_id == owner_id))
            source = result.first()
            if source is None:
                raise JobNotFound(job_id)
            if not state_machine.can_retry(JobStatus(source.status)):
                raise RetryNotAllowed(job_id, source.status)
            values = {
                "id": ids.new_job_id(),
                "owner_id": owner_id,
                "kind": source.kind,
                "resource_type": source.resource_type,
                "resource_id": source.resource_id,
                "payload": source.payload,
                "max_attempts": source.max_attempts,
                "timeout_seconds": source.timeout_seconds,
                "retry_of_job_id": source.id,
            }
            created = self._insert_job(tx, values, now, dedup=False)
            assert created is not None
            return created

        return await self._writer.run(op)

    def _owned_job(self, tx: WriteTx, owner_id: str, job_id: str) -> Job:
        result = tx.conn.execute(
            select(*_JOB_COLUMNS).where(jobs.c.id == job_id, jobs.c.owner_id == owner_id).with_for_update()
        )
        row = result.first()
        if row is None:
            raise JobNotFound(job_id)
        return _job_from_row(row)

    # ----- writes serving a worker -----------------------------------------------------

    async def claim(self, worker_id: str, limit: int, lease_seconds: float) -> ClaimResult:
        self._watch_other_writers()
        high_water = self._claim_clock_high_water

        def op(tx: WriteTx) -> tuple[ClaimResult, datetime]:
            now = self._clock.now()
            if high_water is None or now < high_water:
                # First claim of this process (perhaps after a snapshot restore), or
                # the wall clock went back since the last one: only then can queued
                # jobs carry stamps from the future. Checking walks every job in
                # backoff, so it stays off the hot path otherwise.
                tx.conn.execute(sql.REANCHOR_AFTER_CLOCK_STEP, {"now": now})
            expired = self._recover_expired_leases(tx, now)
            claimed = self._lease_available(tx, worker_id, limit, lease_seconds, now)
            result = ClaimResult(jobs=claimed, next_wakeup_at=self._next_wakeup(tx), expired_job_ids=expired)
            return result, now

        result, now = await self._writer.run(op)
        # Only a committed claim moves the mark, so a rolled-back re-anchor is
        # redone. After a re-anchor nothing is stamped later than `now`.
        self._claim_clock_high_water = now
        return result

    async def recover_expired_leases(self) -> list[str]:
        return await self._writer.run(lambda tx: self._recover_expired_leases(tx, self._clock.now()))

    def _recover_expired_leases(self, tx: WriteTx, now: datetime) -> list[str]:
        rows = tx.conn.execute(sql.RECOVER_EXPIRED_LEASES[tx.conn.dialect.name], {"now": now}).all()
        events: list[tuple[str, int, str, JsonObject, datetime]] = []
        for row in rows:
            expired = {"attempt": row.attempt}
            if row.status == JobStatus.QUEUED.value:
                events.append((row.id, row.last_event_sequence, "job.lease_expired", expired, now))
                tx.announce_work()
                continue
            seq = row.last_event_sequence
            events.append((row.id, seq - 1, "job.lease_expired", expired, now))
            if row.status == JobStatus.FAILED.value:
                events.append(
                    (
                        row.id,
                        seq,
                        "job.failed",
                        {
                            "error": state_machine.LEASE_EXPIRED_ERROR_TEXT,
                            "error_type": state_machine.LEASE_EXPIRED_ERROR_TYPE,
                        },
                        now,
                    )
                )
            else:
                events.append((row.id, seq, "job.cancelled", {}, now))
        self._insert_events(tx, events)
        return [row.id for row in rows]

    def _lease_available(
        self, tx: WriteTx, worker_id: str, limit: int, lease_seconds: float, now: datetime
    ) -> list[ClaimedJob]:
        if limit <= 0:
            return []
        # One token for the whole claim: fencing is per (job id, token), and every
        # claim draws a fresh one, so no other attempt of these jobs can hold it.
        token = ids.new_lease_token()
        expires_at = now + timedelta(seconds=lease_seconds)
        result = tx.conn.execute(
            sql.LEASE_AVAILABLE[tx.conn.dialect.name],
            {"now": now, "limit": limit, "worker": worker_id, "token": token, "expires_at": expires_at},
        )
        rows = sorted(result.all(), key=lambda r: (r.available_at, r.seq))
        self._insert_events(
            tx,
            [(row.id, row.last_event_sequence, "job.started", {"attempt": row.attempt}, now) for row in rows],
        )
        return [
            ClaimedJob(
                job=_job_from_row(row),
                payload=row.payload,
                lease=Lease(job_id=row.id, token=token, attempt=row.attempt),
                lease_expires_at=expires_at,
            )
            for row in rows
        ]

    @staticmethod
    def _next_wakeup(tx: WriteTx) -> datetime | None:
        row = tx.conn.execute(sql.NEXT_WAKEUP).one()
        return min((m for m in (row.available, row.expiry) if m is not None), default=None)

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        # Heartbeats of jobs claimed together fall due together: one statement
        # renews every lease whose heartbeat reached the same batch.
        group = OpGroup(f"renew:{lease_seconds!r}", functools.partial(self._renew_many, lease_seconds))
        return await self._writer.run_grouped(group, lease)

    def _renew_many(
        self, lease_seconds: float, tx: WriteTx, leases: list[Lease]
    ) -> list[datetime | Exception]:
        now = self._clock.now()
        expires_at = now + timedelta(seconds=lease_seconds)
        flavour = tx.conn.dialect.name
        parameters = {**_fences(flavour, leases, now), "expires_at": expires_at}
        rows = tx.conn.execute(sql.RENEW_MANY[flavour], parameters).all()
        renewed = {(row.id, row.lease_token) for row in rows}
        return [
            expires_at if (lease.job_id, lease.token) in renewed else LeaseLost(lease.job_id)
            for lease in leases
        ]

    async def succeed(self, lease: Lease) -> Job:
        return await self._writer.run_grouped(self._succeed_group, lease)

    def _succeed_many(self, tx: WriteTx, leases: list[Lease]) -> list[Job | Exception]:
        """Succeed every lease in as few statements as possible. Two leases on one
        job (a stale one and perhaps the valid one) go in separate statements,
        one after the other, since the row returned cannot say whose it was."""
        answers: dict[int, Job | Exception] = {}
        waiting = list(enumerate(leases))
        while waiting:
            now = self._clock.now()
            this_round: dict[str, tuple[int, Lease]] = {}
            later: list[tuple[int, Lease]] = []
            for index, lease in waiting:
                if lease.job_id in this_round:
                    later.append((index, lease))
                else:
                    this_round[lease.job_id] = (index, lease)
            fences = _fences(tx.conn.dialect.name, [lease for _, lease in this_round.values()], now)
            rows = {
                row.id: row for row in tx.conn.execute(sql.SUCCEED_MANY[tx.conn.dialect.name], fences).all()
            }
            events: list[tuple[str, int, str, JsonObject, datetime]] = []
            for job_id, (index, _lease) in this_round.items():
                row = rows.get(job_id)
                if row is None:
                    answers[index] = LeaseLost(job_id)
                    continue
                job = answers[index] = _job_from_row(row)
                outcome = "job.cancelled" if job.status is JobStatus.CANCELLED else "job.succeeded"
                events.append((job_id, row.last_event_sequence, outcome, {}, now))
            self._insert_events(tx, events)
            waiting = later
        return [answers[index] for index in range(len(leases))]

    async def mark_cancelled(self, lease: Lease) -> Job:
        return await self._transition(
            lease, sql.MARK_CANCELLED, lambda now: {}, lambda job: ("job.cancelled", {})
        )

    async def fail(
        self, lease: Lease, error: str, retryable: bool = True, error_type: str | None = None
    ) -> Job:
        error = limits.storable_error(error)

        def describe(job: Job) -> tuple[str, JsonObject]:
            if job.status is JobStatus.QUEUED:
                return "job.retry_scheduled", {
                    "attempt": lease.attempt,
                    "error": error,
                    "error_type": error_type,
                    "available_at": state_machine.rfc3339(job.available_at),
                }
            return "job.failed", {"error": error, "error_type": error_type}

        return await self._transition(
            lease,
            sql.FAIL,
            lambda now: {
                "error": error,
                "error_type": error_type,
                "retryable": retryable,
                "retry_at": state_machine.next_retry_at(now, lease.attempt),
            },
            describe,
        )

    async def release(self, lease: Lease) -> Job:
        """Give the attempt back unfinished (the worker is shutting down): the job is
        claimable again at once, and the interrupted attempt does not count."""
        return await self._transition(
            lease, sql.RELEASE, lambda now: {}, lambda job: ("job.released", {"attempt": lease.attempt})
        )

    async def _transition(
        self,
        lease: Lease,
        statement: Any,
        parameters: Callable[[datetime], dict[str, Any]],
        describe: Callable[[Job], tuple[str, JsonObject]],
    ) -> Job:
        """One fenced UPDATE that ends the attempt, plus the event that says how."""

        def op(tx: WriteTx) -> Job:
            now = self._clock.now()
            row = tx.conn.execute(statement, {**self._fence(lease, now), **parameters(now)}).first()
            if row is None:
                raise LeaseLost(lease.job_id)
            job = _job_from_row(row)
            event_type, payload = describe(job)
            self._insert_events(tx, [(job.id, row.last_event_sequence, event_type, payload, now)])
            if job.status is JobStatus.QUEUED:
                tx.announce_work()
            return job

        return await self._writer.run(op)

    async def append_event(self, lease: Lease, event_type: str, payload: JsonObject) -> JobEvent:
        def op(tx: WriteTx) -> JobEvent:
            now = self._clock.now()
            sequence = tx.conn.execute(sql.APPEND_EVENT, self._fence(lease, now)).scalar()
            if sequence is None:
                raise LeaseLost(lease.job_id)
            event = JobEvent(lease.job_id, sequence, event_type, payload, now)
            self._insert_events(tx, [(event.job_id, sequence, event_type, payload, now)])
            return event

        return await self._writer.run(op)

    # ----- shared pieces -----------------------------------------------------------------

    @staticmethod
    def _fence(lease: Lease, now: datetime) -> dict[str, Any]:
        """The parameters of `statements.FENCED`."""
        return {"job_id": lease.job_id, "token": lease.token, "now": now}

    @staticmethod
    def _insert_events(tx: WriteTx, events: list[tuple[str, int, str, JsonObject, datetime]]) -> None:
        if not events:
            return
        sql.INSERT_EVENTS(
            tx.conn,
            [
                {"job_id": j, "sequence": s, "type": t, "payload": p, "created_at": c}
                for j, s, t, p, c in events
            ],
        )
        tx.announce_events([JobEvent(*event) for event in events])
