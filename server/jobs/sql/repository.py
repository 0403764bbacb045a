"""`JobRepository` over SQLAlchemy Core, on any database with a `SqlDialect`.

The operations are `OperatedRepository`'s, written once above the engines;
this engine runs each of them as an operation of the group-commit writer, on
`SqlRows` (one statement per ask, every transition one UPDATE the state
machine compiled, fenced in its WHERE clause). The UPDATE holds the job's row
lock until the transaction commits, so even with several replicas appending to
one job, each takes the next number only after the last one committed: a
stale worker can change nothing and event logs stay gap-free. Reads use their
own pooled connections and hold no transaction between statements.

Commits made by other processes reach this one's change hub through the
dialect's change feed (SQLite: a cheap poll of the file's data version;
PostgreSQL: LISTEN).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import random
import uuid
from collections.abc import Callable, Collection, Sequence
from datetime import datetime
from typing import Any, TypeVar

import structlog
from sqlalchemy import Row, select
from sqlalchemy.exc import DBAPIError

from leasehold._server.clock import Clock
from leasehold._server.jobs import owner_stats, schedules, steering, worker_writes
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.admin import AdminFilter, LeaseHolder, QueueStats
from leasehold._server.jobs.errors import JobNotFound, LeaseLost, ScheduleNotFound
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.operations import feed
from leasehold._server.jobs.operations.repository import Many, OperatedRepository
from leasehold._server.jobs.operations.rows import Columns, Rows
from leasehold._server.jobs.owner_limits import OwnedField
from leasehold._server.jobs.reachability import Reachability
from leasehold._server.jobs.records import (
    FeedEvent,
    FeedHead,
    FeedPage,
    Job,
    JobEvent,
    JobFilter,
    JobPage,
    JobStatus,
    JobSubject,
    Lease,
    PageCursor,
    QueuedKind,
)
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.jobs.sibling_bus import SiblingBus, SiblingGroup
from leasehold._server.jobs.sql import admin as admin_rows
from leasehold._server.jobs.sql import feed as feed_rows
from leasehold._server.jobs.sql import graphs as graph_rows
from leasehold._server.jobs.sql import owned as owned_rows
from leasehold._server.jobs.sql import queue_view
from leasehold._server.jobs.sql import schedules as schedule_rows
from leasehold._server.jobs.sql import statements as sql
from leasehold._server.jobs.sql import worker_writes as worker_write_rows
from leasehold._server.jobs.sql.admin import SqlAdmin
from leasehold._server.jobs.sql.dialect import ChangeFeed, Engines
from leasehold._server.jobs.sql.errors import translate_storage_error
from leasehold._server.jobs.sql.read_batch import ReadBatcher
from leasehold._server.jobs.sql.rows import SqlRows
from leasehold._server.jobs.sql.tables import jobs
from leasehold._server.jobs.sql.transitions import JOB_COLUMNS
from leasehold._server.jobs.sql.writer import GroupCommitWriter, OpGroup, WaitingOp, WriteTx
from leasehold._server.jobs.steering import Occupancy

log = structlog.get_logger("leasehold.storage")

# How often to look for commits made by other processes on the same SQLite file.
OTHER_WRITERS_POLL_SECONDS = 1.0

T = TypeVar("T")
ItemT = TypeVar("ItemT")


def _job_from_row(row: Any) -> Job:
    """A `Job` from a result row that carries the job columns."""
    return sm.job_of(row._mapping)


class SqlJobRepository(OperatedRepository):
    """On SQLite, `other_writers_poll_seconds` bounds how late this process
    learns of a commit made by another process on the same file (its own are
    announced at once): that late an idle worker notices a job another process
    enqueued, and a watcher an event another process appended. On PostgreSQL
    other replicas' commits arrive by notification, as they commit, and so do a
    SQLite process's `siblings` (`serve --processes`): the sibling bus replaces
    the polling."""

    def __init__(
        self,
        engines: Engines,
        clock: Clock,
        changes: ChangeHub | None = None,
        other_writers_poll_seconds: float = OTHER_WRITERS_POLL_SECONDS,
        steering_rules: steering.Steering = steering.NO_STEERING,
        jitter: Callable[[], float] = random.random,
        max_events_per_job: int | None = None,
        siblings: SiblingGroup | None = None,
    ) -> None:
        super().__init__(clock, changes, steering_rules, jitter, max_events_per_job)
        self._engines = engines
        self._dialect = dialect = engines.dialect
        # Names this process's announcements, so that it can skip its own.
        origin = uuid.uuid4().hex[:16]

        def seal(tx: WriteTx, events: list[JobEvent], subjects: dict[str, JobSubject]) -> list[FeedEvent]:
            return feed.seal(SqlRows(tx, dialect, clock), events, subjects)

        # PostgreSQL's NOTIFY reaches sibling processes as it does any replica.
        bus = SiblingBus(siblings, self._changes) if siblings and not dialect.locks_rows else None
        # What the writers found of the database, for health (`serve`).
        self.reachability = Reachability()
        self._writer = GroupCommitWriter(
            engines.writer,
            self._changes,
            dialect,
            announce=dialect.announce(origin),
            seal=seal,
            tell=bus.tell if bus is not None else None,
            reachability=self.reachability,
        )
        # Retention's deletes. On PostgreSQL, whose transactions run side by side,
        # they get a writer (a connection and a thread) of their own, so a claim
        # or enqueue never queues in this process's writer behind a batch; on
        # SQLite the file's one write lock is shared by every connection anyway.
        # It tells other replicas what it commits, as the main writer does:
        # nothing for a deletion, new work and events for a bulk action.
        self._sweeper = (
            GroupCommitWriter(
                engines.writer,
                self._changes,
                dialect,
                announce=dialect.announce(origin),
                seal=seal,
                reachability=self.reachability,
            )
            if dialect.locks_rows
            else self._writer
        )
        # AdminService's bulk batches share retention's writer (`_sweep`), so a
        # claim never queues in this process's writer behind a batch either.
        self._admin = SqlAdmin(self._read)
        self._feed: ChangeFeed = bus or dialect.change_feed(
            engines, self._changes, self._writer, origin, other_writers_poll_seconds
        )
        self._cancel_checks = ReadBatcher(self._cancel_requested_many)
        self._feed_task: asyncio.Task[None] | None = None
        self._closing = False

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

    async def ping(self) -> None:
        """One empty write: returns once a writable database committed it, so
        the writer reports the database reached again."""
        await self._writer.run(lambda tx: None)

    def _watch_other_writers(self) -> None:
        """Start, once, the task that announces other processes' commits. Called
        by the paths whose callers then wait on the change hub."""
        if self._closing:
            return
        if self._feed_task is None or self._feed_task.done():
            self._feed_task = asyncio.create_task(  # not in the starting call's log context
                self._feed.run(), name="leasehold-other-writers", context=contextvars.Context()
            )

    # ----- units of work --------------------------------------------------------------

    def _rows(self, tx: WriteTx) -> SqlRows:
        return SqlRows(tx, self._dialect, self._clock)

    async def _write(self, op: Callable[[Rows], T]) -> T:
        return await self._writer.run(lambda tx: op(self._rows(tx)))

    async def _write_many(self, many: Many[ItemT, T], item: ItemT) -> T:
        group: OpGroup[ItemT, T] = OpGroup(many.name, lambda tx, items: many.run(self._rows(tx), items))
        return await self._writer.run_grouped(group, item)

    async def _sweep(self, op: Callable[[Rows], T]) -> T:
        return await self._sweeper.run(lambda tx: op(self._rows(tx)))

    def _write_on_next_work(self, op: Callable[[Rows], T]) -> WaitingOp[T]:
        return self._writer.run_on_next_work(lambda tx: op(self._rows(tx)))

    async def _bulk_preview(
        self, job_filter: AdminFilter, below: int | None, limit: int, unretried: bool
    ) -> list[Columns]:
        statement = admin_rows.batch(job_filter, unretried, lock=False, whole_rows=False)
        return [
            row._mapping for row in await self._read(statement, admin_rows.batch_parameters(below, limit))
        ]

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
        if job_filter.depends_on:
            statement = statement.where(
                jobs.c.id.in_(graph_rows.CHILD_IDS.params(parent=job_filter.depends_on).scalar_subquery())
            )
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

    async def read_feed(self, owner_id: str, after_position: int, limit: int) -> FeedPage:
        self._watch_other_writers()
        rows = await self._read(feed_rows.PAGE, {"owner": owner_id, "after": after_position, "limit": limit})
        if not rows:
            return FeedPage([], (await self.feed_head(owner_id)).expired_through)
        return FeedPage(
            [
                FeedEvent(
                    JobEvent(row.job_id, row.sequence, row.type, row.payload, row.created_at),
                    row.position,
                    JobSubject(owner_id, row.kind, row.resource_type, row.resource_id),
                )
                for row in rows
            ],
            rows[0].expired_through,
        )

    async def feed_head(self, owner_id: str) -> FeedHead:
        rows = await self._read(feed_rows.HEAD, {"owner": owner_id})
        return FeedHead(rows[0].last_position, rows[0].expired_through) if rows else FeedHead(0, 0)

    async def queued_by_kind(self) -> list[QueuedKind]:
        rows = await self._read(sql.QUEUED_BY_KIND, {"now": self._clock.now()})
        return [QueuedKind(row.kind, row.depth, row.oldest) for row in rows]

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

    async def newest_position(self) -> int:
        return await self._admin.newest_position()

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

    async def _next_fire_at(self) -> datetime | None:
        rows = await self._read(schedule_rows.NEXT_FIRE_AT)
        return rows[0][0] if rows else None

    async def worker_write(self, lease: Lease, request_key: str) -> worker_writes.WorkerWrite | None:
        rows = await self._read(worker_write_rows.FIND, worker_write_rows.key(lease, request_key))
        return worker_write_rows.from_row(rows[0]._mapping) if rows else None
