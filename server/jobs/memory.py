"""`JobRepository` in memory: the third engine, for `leasehold.testing` and the
contract suite.

It decides nothing of its own: the operations are `OperatedRepository`'s,
the same code the SQL engines run, and every transition is the state
machine's `Transition.apply`, executed here in Python where the SQL engines
compile it into statements. What is left here is only what a database would
do: find rows (by owner, by lease, by expiry, by due time), keep insertion
order, enforce one root job per resource key, hand out event sequences, undo
a failed unit of work, and announce committed changes.

Atomicity comes from asyncio: each unit of work yields once to the event loop
before it looks at anything (as a database round trip would), then reads and
writes without awaiting again, so no other call can interleave with it. A
unit of work that raises is undone from its journal, as a rollback would.

Job payloads, results, checkpoints and event payloads are stored as JSON
text and decoded afresh on every read, so a caller can never mutate stored
state through an object it was given or handed in, and what comes back is
what a database would give back (tuples as lists, and so on).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import random
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeVar

from leasehold._server.clock import Clock
from leasehold._server.jobs import admin, owner_stats, schedules, steering
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import JobNotFound, LeaseLost, ScheduleNotFound, StorageClosed
from leasehold._server.jobs.memory_rows import (
    Journal,
    MemoryQueueView,
    MemoryRows,
    MemoryStore,
    Pending,
    Row,
    admin_match,
    decoded,
    fenced,
    matches,
)
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.operations import feed
from leasehold._server.jobs.operations.repository import Many, OperatedRepository
from leasehold._server.jobs.operations.rows import Columns, Rows
from leasehold._server.jobs.owner_limits import OwnedField
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
from leasehold._server.jobs.routing import ANY_KIND, KindPatterns
from leasehold._server.jobs.worker_writes import WorkerWrite

T = TypeVar("T")
ItemT = TypeVar("ItemT")

_QUEUED = JobStatus.QUEUED.value
_RUNNING = JobStatus.RUNNING.value


def _job(row: Mapping[str, Any], with_result: bool = True) -> Job:
    """The job of `row`; a List page leaves its result out, as the SQL engines do."""
    job = sm.job_of(decoded(row))
    return job if with_result else replace(job, result=None)


class _WaitingWrite:
    """A unit of work waiting for the next write that makes work claimable."""

    def __init__(self, repository: MemoryJobRepository, op: Callable[[Rows], Any]) -> None:
        self.op = op
        self.answer: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._repository = repository

    async def result(self) -> Any:
        return await asyncio.shield(self.answer)

    async def withdraw(self) -> Any:
        if self in self._repository._waiting:
            self._repository._waiting.remove(self)
            return None
        return await asyncio.shield(self.answer)


class MemoryJobRepository(OperatedRepository):
    """Every job and event of one process, in dicts. Rows are kept in insertion
    order (a dict keeps the order its keys were first inserted in, and a row
    changes by replacing its value), which is the `seq` order the SQL engines
    sort by. Lookups scan: this engine serves tests, not queues of millions."""

    def __init__(
        self,
        clock: Clock,
        changes: ChangeHub | None = None,
        steering_rules: steering.Steering = steering.NO_STEERING,
        jitter: Callable[[], float] = random.random,
        max_events_per_job: int | None = None,
    ) -> None:
        super().__init__(clock, changes, steering_rules, jitter, max_events_per_job)
        self._store = MemoryStore(clock)
        self._waiting: list[_WaitingWrite] = []
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        waiting, self._waiting = self._waiting, []
        for write in waiting:
            write.answer.set_exception(StorageClosed("the in-memory job repository is closed"))

    # ----- units of work ----------------------------------------------------------------

    async def _turn(self) -> None:
        """Yield to the event loop once, as a database call would, then refuse
        if the repository was closed meanwhile. Nothing is read before this."""
        await asyncio.sleep(0)
        if self._closed:
            raise StorageClosed("the in-memory job repository is closed")

    async def _write(self, op: Callable[[Rows], T]) -> T:
        await self._turn()
        journal, pending = Journal(), Pending()
        rows = MemoryRows(self._store, journal, pending)
        try:
            answer = op(rows)
        except BaseException:
            journal.undo()
            raise
        if pending.work:
            # Waiting claims are made in the same unit of work, as the SQL
            # engines make them in the same transaction.
            waiting, self._waiting = self._waiting, []
            for write in waiting:
                # A waiting write that fails is undone alone, and announces nothing.
                mark, announced = journal.mark(), len(pending.events)
                try:
                    write.answer.set_result(write.op(rows))
                except Exception as exc:
                    journal.undo(mark)
                    del pending.events[announced:]
                    write.answer.set_exception(exc)
            self._changes.publish_work()
        if pending.events:
            self._changes.publish_events(feed.seal(rows, pending.events))
        return answer

    async def _write_many(self, many: Many[ItemT, T], item: ItemT) -> T:
        (answer,) = await self._write(lambda rows: many.run(rows, [item]))
        if isinstance(answer, Exception):
            raise answer
        return answer

    def _write_on_next_work(self, op: Callable[[Rows], T]) -> _WaitingWrite:
        if self._closed:
            raise StorageClosed("the in-memory job repository is closed")
        waiting = _WaitingWrite(self, op)
        self._waiting.append(waiting)
        return waiting

    async def _next_fire_at(self) -> datetime | None:
        await self._turn()
        return min(
            (s.next_fire_at for s, _ in self._store.schedules.values() if s.next_fire_at), default=None
        )

    async def _bulk_preview(
        self, job_filter: admin.AdminFilter, below: int | None, limit: int, unretried: bool
    ) -> list[Columns]:
        await self._turn()
        return MemoryRows(self._store, Journal(), Pending()).bulk_batch(
            job_filter, below, limit, unretried, lock=False
        )

    # ----- reads serving an owner ---------------------------------------------------------

    def _owned(self, owner_id: str, job_id: str) -> Row:
        """The owner's job; another owner's is as missing as an unknown id."""
        row = self._store.rows.get(job_id)
        if row is None or row["owner_id"] != owner_id:
            raise JobNotFound(job_id)
        return row

    async def get(self, owner_id: str, job_id: str) -> Job:
        await self._turn()
        return _job(self._owned(owner_id, job_id))

    async def list_jobs(
        self, owner_id: str, job_filter: JobFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        await self._turn()
        below = None
        if after is not None:
            # The caller's own job only; any other cursor matches nothing, as in SQL.
            cursor_row = self._store.rows.get(after.job_id)
            if cursor_row is None or cursor_row["owner_id"] != owner_id:
                return JobPage(jobs=[], next_cursor=None)
            below = cursor_row["seq"]
        found = self._store.newest(
            lambda row: row["owner_id"] == owner_id and matches(row, job_filter), below, page_size + 1
        )
        return _page(found, page_size)

    async def owner_stats(self, owner_id: str) -> owner_stats.OwnerStats:
        # The reference engine keeps no index; it holds a test's few jobs.
        await self._turn()
        counts: Counter[tuple[str, JobStatus]] = Counter(
            (row["kind"], JobStatus(row["status"]))
            for row in self._store.rows.values()
            if row["owner_id"] == owner_id
        )
        return owner_stats.assemble(
            self._store.now(),
            by_status=None,
            by_kind=[(kind, status, jobs) for (kind, status), jobs in counts.items()],
        )

    async def known_values(self, owner_id: str, owned: OwnedField, among: Sequence[str]) -> frozenset[str]:
        await self._turn()
        wanted = set(among)
        return frozenset(
            row[owned.value]
            for row in self._store.rows.values()
            if row["owner_id"] == owner_id and row[owned.value] in wanted
        )

    async def count_distinct(self, owner_id: str, owned: OwnedField, up_to: int) -> int:
        await self._turn()
        values = {row[owned.value] for row in self._store.rows.values() if row["owner_id"] == owner_id}
        values.discard("")  # no resource type
        return min(len(values), up_to)

    async def count_schedules(self, owner_id: str, up_to: int) -> int:
        await self._turn()
        return min(sum(1 for owner, _ in self._store.schedules if owner == owner_id), up_to)

    async def list_events(
        self, owner_id: str, job_id: str, after_sequence: int, limit: int
    ) -> list[JobEvent]:
        await self._turn()
        self._owned(owner_id, job_id)
        newer = [event for event in self._store.events[job_id] if event[0] > after_sequence]
        return [
            JobEvent(job_id, sequence, event_type, json.loads(text), created_at)
            for sequence, event_type, text, created_at in newer[: max(limit, 0)]
        ]

    async def read_feed(self, owner_id: str, after_position: int, limit: int) -> FeedPage:
        await self._turn()
        store = self._store
        entries = store.feed.get(owner_id, [])
        found: list[FeedEvent] = []
        for position, job_id, sequence in entries[bisect.bisect_right(entries, (after_position, "~")) :]:
            if len(found) == limit:
                break
            events = store.events.get(job_id)
            if events is None:
                continue  # deleted by retention
            _, event_type, text, created_at = events[sequence - 1]
            row = store.rows[job_id]
            found.append(
                FeedEvent(
                    JobEvent(job_id, sequence, event_type, json.loads(text), created_at),
                    position,
                    JobSubject(owner_id, row["kind"], row["resource_type"], row["resource_id"]),
                )
            )
        return FeedPage(found, store.feed_heads.get(owner_id, FeedHead(0, 0)).expired_through)

    async def feed_head(self, owner_id: str) -> FeedHead:
        await self._turn()
        return self._store.feed_heads.get(owner_id, FeedHead(0, 0))

    async def get_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule:
        await self._turn()
        found = self._store.stored_schedule(owner_id, schedule_id)
        if found is None:
            raise ScheduleNotFound(schedule_id)
        return found

    async def list_schedules(
        self, owner_id: str, page_size: int, after: str | None
    ) -> schedules.SchedulePage:
        await self._turn()
        names = sorted(
            schedule_id
            for owner, schedule_id in self._store.schedules
            if owner == owner_id and schedule_id > (after or "")
        )
        page = [self._store.stored_schedule(owner_id, name) for name in names[:page_size]]
        cursor = names[page_size - 1] if len(names) > page_size else None
        return schedules.SchedulePage([s for s in page if s is not None], cursor)

    async def occupancy(self, owner_id: str, kind: str) -> steering.Occupancy:
        await self._turn()
        now = self._store.now()
        running = MemoryQueueView(self._store.rows.values(), ANY_KIND, now).running()
        rate = self._steering.kind_rates.get(kind)
        tokens = None if rate is None else steering.refill(self._store.buckets.get(kind), rate, now)
        return steering.Occupancy(
            running.by_kind.get(kind, 0),
            running.by_owner.get(owner_id, 0),
            tokens,
            kind in self._store.paused,
        )

    async def queued_by_kind(self) -> list[QueuedKind]:
        # The reference engine keeps no index; it holds a test's few jobs.
        await self._turn()
        now = self._store.now()
        due: dict[str, list[datetime]] = {}
        for row in self._store.rows.values():
            if row["status"] == _QUEUED and row["available_at"] <= now:
                due.setdefault(row["kind"], []).append(row["available_at"])
        return [QueuedKind(kind, len(times), min(times)) for kind, times in sorted(due.items())]

    # ----- reads serving a worker ---------------------------------------------------------

    async def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None:
        await self._turn()
        return self._store.worker_writes.get(lease.job_id, {}).get((lease.token, request_key))

    async def cancel_requested(self, lease: Lease) -> bool:
        await self._turn()
        row = fenced(self._store.rows.get(lease.job_id), lease, self._store.now())
        if row is None:
            raise LeaseLost(lease.job_id)
        return row["cancel_requested_at"] is not None

    # ----- administration, across every owner ------------------------------------------

    async def queue_stats(self) -> admin.QueueStats:
        # The reference engine keeps no index; it holds a test's few jobs.
        await self._turn()
        now = self._store.now()
        since = admin.stats_since(now)
        live: Counter[tuple[str, JobStatus]] = Counter()
        owners: Counter[str] = Counter()
        finished: Counter[tuple[str, JobStatus, datetime]] = Counter()
        due: dict[str, datetime] = {}
        oldest: tuple[str, datetime] | None = None
        oldest_position: tuple[object, ...] | None = None
        for row in self._store.rows.values():
            status, kind = JobStatus(row["status"]), row["kind"]
            if status in sm.CANCELLABLE_STATUSES:
                live[(kind, status)] += 1
            if status is JobStatus.RUNNING:
                owners[row["owner_id"]] += 1
            if status.is_terminal and row["completed_at"] >= since:
                finished[(kind, status, admin.minute_of(row["completed_at"]))] += 1
            if status is JobStatus.QUEUED and row["available_at"] <= now:
                due[kind] = min(due.get(kind, row["available_at"]), row["available_at"])
                position = (row["available_at"], row["seq"])
                if oldest_position is None or position < oldest_position:  # type: ignore[operator]
                    oldest, oldest_position = (row["id"], row["available_at"]), position
        return admin.assemble_stats(
            now,
            live=[(kind, status, count) for (kind, status), count in live.items()],
            running_by_owner=list(owners.items()),
            oldest_due_by_kind=due,
            finished=[(kind, status, minute, count) for (kind, status, minute), count in finished.items()],
            oldest=oldest,
            paused=set(self._store.paused),
        )

    async def list_all_jobs(
        self, job_filter: admin.AdminFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        await self._turn()
        below = None
        if after is not None:
            cursor_row = self._store.rows.get(after.job_id)
            if cursor_row is None:
                return JobPage(jobs=[], next_cursor=None)
            below = cursor_row["seq"]
        return _page(self._store.newest(admin_match(job_filter), below, page_size + 1), page_size)

    async def lease_holders(
        self, remote_kinds: KindPatterns, worker_ids: Collection[str]
    ) -> list[admin.LeaseHolder]:
        await self._turn()
        now = self._store.now()
        held: Counter[tuple[str, str]] = Counter()
        latest: dict[tuple[str, str], datetime] = {}
        for row in self._store.rows.values():
            if row["status"] != _RUNNING or row["lease_expires_at"] <= now:
                continue
            worker, kind = row["lease_owner"], row["kind"]
            if remote_kinds.matches(kind) or worker in worker_ids:
                held[(worker, kind)] += 1
                latest[(worker, kind)] = max(latest.get((worker, kind), now), row["lease_expires_at"])
        return admin.lease_holders(
            (worker, kind, jobs, latest[(worker, kind)]) for (worker, kind), jobs in held.items()
        )

    async def newest_position(self) -> int:
        await self._turn()
        return self._store.counters["seq"]


def _page(found: list[Row], page_size: int) -> JobPage:
    page, more = found[:page_size], len(found) > page_size
    return JobPage(
        jobs=[_job(row, with_result=False) for row in page],
        next_cursor=PageCursor(page[-1]["id"]) if more else None,
    )
