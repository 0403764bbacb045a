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
import json
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from leasehold._server.clock import Clock
from leasehold._server.jobs import admin, owner_stats, schedules, steering
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import (
    JobNotFound,
    LeaseLost,
    ScheduleExists,
    ScheduleNotFound,
    StorageClosed,
)
from leasehold._server.jobs.idempotency import RequestKey
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.operations.repository import Many, OperatedRepository
from leasehold._server.jobs.operations.rows import Columns, Rows
from leasehold._server.jobs.owner_limits import OwnedField
from leasehold._server.jobs.records import (
    Job,
    JobEvent,
    JobFilter,
    JobPage,
    JobStatus,
    Lease,
    PageCursor,
    QueuedKind,
)
from leasehold._server.jobs.routing import ANY_KIND, KindFilter, KindPatterns
from leasehold._server.jobs.worker_writes import WorkerWrite

Row = dict[str, Any]
T = TypeVar("T")
ItemT = TypeVar("ItemT")

_QUEUED = JobStatus.QUEUED.value
_RUNNING = JobStatus.RUNNING.value
# Kept as JSON text, decoded afresh on every read.
_JSON_COLUMNS = ("payload", "result", "checkpoint")
_ABSENT = object()


def _dumps(value: Any) -> str:
    return json.dumps(value)


def _decoded(row: Mapping[str, Any]) -> Row:
    """`row` as the operations see it: its JSON columns decoded afresh."""
    out = dict(row)
    for column in _JSON_COLUMNS:
        if out[column] is not None:
            out[column] = json.loads(out[column])
    return out


def _job(row: Mapping[str, Any], with_result: bool = True) -> Job:
    """The job of `row`; a List page leaves its result out, as the SQL engines do."""
    job = sm.job_of(_decoded(row))
    return job if with_result else replace(job, result=None)


class _Journal:
    """What a unit of work changed, to undo it if the unit raises."""

    def __init__(self) -> None:
        self._undo: list[Callable[[], None]] = []

    def put(self, mapping: MutableMapping[Any, Any], key: Any, value: Any) -> None:
        old = mapping.get(key, _ABSENT)
        mapping[key] = value
        self._undo.append(lambda: mapping.__setitem__(key, old) if old is not _ABSENT else mapping.pop(key))

    def delete(self, mapping: MutableMapping[Any, Any], key: Any) -> None:
        old = mapping.pop(key)
        self._undo.append(lambda: mapping.__setitem__(key, old))

    def append(self, items: list[Any], item: Any) -> None:
        items.append(item)
        self._undo.append(items.pop)

    def mark(self) -> int:
        return len(self._undo)

    def undo(self, mark: int = 0) -> None:
        while len(self._undo) > mark:
            self._undo.pop()()


@dataclass
class _Pending:
    """What one unit of work will announce once it has changed everything it
    changes (the in-memory counterpart of a commit)."""

    work: bool = False
    events: list[JobEvent] = field(default_factory=list)


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
        self._rows: dict[str, Row] = {}
        # Per job: (sequence, type, payload as JSON text, created_at), in sequence order.
        self._events: dict[str, list[tuple[int, str, str, datetime]]] = {}
        # (owner, resource type, resource id) -> its root job, and its newest job.
        self._roots: dict[tuple[str, str, str], str] = {}
        self._latest: dict[tuple[str, str, str], str] = {}
        self._counters = {"seq": 1}
        # Each rate-limited kind's token bucket, once drawn from.
        self._buckets: dict[str, steering.Bucket] = {}
        # (owner, schedule id) -> the schedule, and its template's payload as JSON text.
        self._schedules: dict[tuple[str, str], tuple[schedules.Schedule, str]] = {}
        # Kinds AdminService.PauseKind holds (the value is unused): claims skip them.
        self._paused: dict[str, bool] = {}
        # (owner, request id) -> (method, fingerprint, the first answer, when it was made).
        self._request_ids: dict[tuple[str, str], tuple[str, str, list[dict[str, Any]], datetime]] = {}
        # Per job: (lease token, request key) -> the worker write's record.
        self._worker_writes: dict[str, dict[tuple[str, str], WorkerWrite]] = {}
        self._waiting: list[_WaitingWrite] = []
        self._closed = False

    async def close(self) -> None:
        self._closed = True

    # ----- units of work ----------------------------------------------------------------

    async def _turn(self) -> None:
        """Yield to the event loop once, as a database call would, then refuse
        if the repository was closed meanwhile. Nothing is read before this."""
        await asyncio.sleep(0)
        if self._closed:
            raise StorageClosed("the in-memory job repository is closed")

    def _now(self) -> datetime:
        """The clock's time as a database hands it back: aware, in UTC."""
        now = self._clock.now()
        if now.tzinfo is None:
            raise ValueError("timestamps must be timezone-aware")
        return now.astimezone(UTC)

    async def _write(self, op: Callable[[Rows], T]) -> T:
        await self._turn()
        journal, pending = _Journal(), _Pending()
        rows = MemoryRows(self, journal, pending)
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
                mark = journal.mark()
                try:
                    write.answer.set_result(write.op(rows))
                except Exception as exc:
                    journal.undo(mark)
                    write.answer.set_exception(exc)
            self._changes.publish_work()
        if pending.events:
            self._changes.publish_events(pending.events)
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
        return min((s.next_fire_at for s, _ in self._schedules.values() if s.next_fire_at), default=None)

    async def _bulk_preview(
        self, job_filter: admin.AdminFilter, below: int | None, limit: int, unretried: bool
    ) -> list[Columns]:
        await self._turn()
        return MemoryRows(self, _Journal(), _Pending()).bulk_batch(
            job_filter, below, limit, unretried, lock=False
        )

    # ----- reads serving an owner ---------------------------------------------------------

    def _owned(self, owner_id: str, job_id: str) -> Row:
        """The owner's job; another owner's is as missing as an unknown id."""
        row = self._rows.get(job_id)
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
            cursor_row = self._rows.get(after.job_id)
            if cursor_row is None or cursor_row["owner_id"] != owner_id:
                return JobPage(jobs=[], next_cursor=None)
            below = cursor_row["seq"]
        found = self._newest(
            lambda row: row["owner_id"] == owner_id and _matches(row, job_filter), below, page_size + 1
        )
        return _page(found, page_size)

    def _newest(self, wanted: Callable[[Row], bool], below: int | None, limit: int) -> list[Row]:
        """Up to `limit` rows below the position `below`, newest first, that are `wanted`."""
        found: list[Row] = []
        for row in reversed(self._rows.values()):
            if len(found) >= limit:
                break
            if (below is None or row["seq"] < below) and wanted(row):
                found.append(row)
        return found

    async def owner_stats(self, owner_id: str) -> owner_stats.OwnerStats:
        # The reference engine keeps no index; it holds a test's few jobs.
        await self._turn()
        counts: Counter[tuple[str, JobStatus]] = Counter(
            (row["kind"], JobStatus(row["status"]))
            for row in self._rows.values()
            if row["owner_id"] == owner_id
        )
        return owner_stats.assemble(
            self._now(),
            by_status=None,
            by_kind=[(kind, status, jobs) for (kind, status), jobs in counts.items()],
        )

    async def known_values(self, owner_id: str, owned: OwnedField, among: Sequence[str]) -> frozenset[str]:
        await self._turn()
        wanted = set(among)
        return frozenset(
            row[owned.value]
            for row in self._rows.values()
            if row["owner_id"] == owner_id and row[owned.value] in wanted
        )

    async def count_distinct(self, owner_id: str, owned: OwnedField, up_to: int) -> int:
        await self._turn()
        values = {row[owned.value] for row in self._rows.values() if row["owner_id"] == owner_id}
        values.discard("")  # no resource type
        return min(len(values), up_to)

    async def count_schedules(self, owner_id: str, up_to: int) -> int:
        await self._turn()
        return min(sum(1 for owner, _ in self._schedules if owner == owner_id), up_to)

    async def list_events(
        self, owner_id: str, job_id: str, after_sequence: int, limit: int
    ) -> list[JobEvent]:
        await self._turn()
        self._owned(owner_id, job_id)
        newer = [event for event in self._events[job_id] if event[0] > after_sequence]
        return [
            JobEvent(job_id, sequence, event_type, json.loads(text), created_at)
            for sequence, event_type, text, created_at in newer[: max(limit, 0)]
        ]

    def _stored_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule | None:
        """The owner's schedule, its payload decoded afresh; another owner's is
        as missing as an unknown id."""
        stored = self._schedules.get((owner_id, schedule_id))
        if stored is None:
            return None
        schedule, payload = stored
        return replace(schedule, template=replace(schedule.template, payload=json.loads(payload)))

    async def get_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule:
        await self._turn()
        found = self._stored_schedule(owner_id, schedule_id)
        if found is None:
            raise ScheduleNotFound(schedule_id)
        return found

    async def list_schedules(
        self, owner_id: str, page_size: int, after: str | None
    ) -> schedules.SchedulePage:
        await self._turn()
        names = sorted(
            schedule_id
            for owner, schedule_id in self._schedules
            if owner == owner_id and schedule_id > (after or "")
        )
        page = [self._stored_schedule(owner_id, name) for name in names[:page_size]]
        cursor = names[page_size - 1] if len(names) > page_size else None
        return schedules.SchedulePage([s for s in page if s is not None], cursor)

    async def occupancy(self, owner_id: str, kind: str) -> steering.Occupancy:
        await self._turn()
        now = self._now()
        running = _MemoryQueueView(self._rows.values(), ANY_KIND, now).running()
        rate = self._steering.kind_rates.get(kind)
        tokens = None if rate is None else steering.refill(self._buckets.get(kind), rate, now)
        return steering.Occupancy(
            running.by_kind.get(kind, 0), running.by_owner.get(owner_id, 0), tokens, kind in self._paused
        )

    async def queued_by_kind(self) -> list[QueuedKind]:
        # The reference engine keeps no index; it holds a test's few jobs.
        await self._turn()
        now = self._now()
        due: dict[str, list[datetime]] = {}
        for row in self._rows.values():
            if row["status"] == _QUEUED and row["available_at"] <= now:
                due.setdefault(row["kind"], []).append(row["available_at"])
        return [QueuedKind(kind, len(times), min(times)) for kind, times in sorted(due.items())]

    # ----- reads serving a worker ---------------------------------------------------------

    async def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None:
        await self._turn()
        return self._worker_writes.get(lease.job_id, {}).get((lease.token, request_key))

    async def cancel_requested(self, lease: Lease) -> bool:
        await self._turn()
        row = _fenced(self._rows.get(lease.job_id), lease, self._now())
        if row is None:
            raise LeaseLost(lease.job_id)
        return row["cancel_requested_at"] is not None

    # ----- administration, across every owner ------------------------------------------

    async def queue_stats(self) -> admin.QueueStats:
        # The reference engine keeps no index; it holds a test's few jobs.
        await self._turn()
        now = self._now()
        since = admin.stats_since(now)
        live: Counter[tuple[str, JobStatus]] = Counter()
        owners: Counter[str] = Counter()
        finished: Counter[tuple[str, JobStatus, datetime]] = Counter()
        due: dict[str, datetime] = {}
        oldest: tuple[str, datetime] | None = None
        oldest_position: tuple[object, ...] | None = None
        for row in self._rows.values():
            status, kind = JobStatus(row["status"]), row["kind"]
            if not status.is_terminal:
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
            paused=set(self._paused),
        )

    async def list_all_jobs(
        self, job_filter: admin.AdminFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        await self._turn()
        below = None
        if after is not None:
            cursor_row = self._rows.get(after.job_id)
            if cursor_row is None:
                return JobPage(jobs=[], next_cursor=None)
            below = cursor_row["seq"]
        return _page(self._newest(_admin_match(job_filter), below, page_size + 1), page_size)

    async def lease_holders(
        self, remote_kinds: KindPatterns, worker_ids: Collection[str]
    ) -> list[admin.LeaseHolder]:
        await self._turn()
        now = self._now()
        held: Counter[tuple[str, str]] = Counter()
        latest: dict[tuple[str, str], datetime] = {}
        for row in self._rows.values():
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
        return self._counters["seq"]


class MemoryRows:
    """`Rows` over the repository's dicts, every change journaled."""

    def __init__(self, repository: MemoryJobRepository, journal: _Journal, pending: _Pending) -> None:
        self._r = repository
        self._journal = journal
        self._pending = pending

    def now(self) -> datetime:
        return self._r._now()

    # ----- new jobs -------------------------------------------------------------------

    def insert_jobs(self, rows: Sequence[Columns]) -> None:
        # Encoded first, every one of them: a payload no database could store
        # fails the unit of work before any of its rows is kept.
        encoded = [{**row, "payload": _dumps(row["payload"])} for row in rows]
        r, journal = self._r, self._journal
        for values in encoded:
            row: Row = dict.fromkeys(sm.JOB_COLUMNS)
            row.update(values, seq=r._counters["seq"])
            journal.put(r._counters, "seq", row["seq"] + 1)
            journal.put(r._rows, row["id"], row)
            journal.put(r._events, row["id"], [])
            if row["resource_id"]:
                key = (row["owner_id"], row["resource_type"], row["resource_id"])
                journal.put(r._latest, key, row["id"])
                if row["retry_of_job_id"] is None:
                    journal.put(r._roots, key, row["id"])

    def insert_root(self, row: Columns) -> bool:
        if (row["owner_id"], row["resource_type"], row["resource_id"]) in self._r._roots:
            return False
        self.insert_jobs([row])
        return True

    def latest_for_resource(self, owner_id: str, resource_type: str, resource_id: str) -> Columns:
        return _decoded(self._r._rows[self._r._latest[(owner_id, resource_type, resource_id)]])

    def insert_events(self, events: Sequence[JobEvent]) -> None:
        for event in events:
            text = _dumps(event.payload)
            self._journal.append(
                self._r._events[event.job_id], (event.sequence, event.type, text, event.created_at)
            )
            self._pending.events.append(replace(event, payload=json.loads(text)))

    def announce_work(self) -> None:
        self._pending.work = True

    # ----- transitions ----------------------------------------------------------------

    def _apply(self, transition: sm.Transition, row: Row, inputs: sm.Inputs) -> Row:
        stored = replace(
            inputs,
            result=None if inputs.result is None else _dumps(inputs.result),
            checkpoint=None if inputs.checkpoint is None else _dumps(inputs.checkpoint),
        )
        new, _branch = transition.apply(row, stored)
        self._journal.put(self._r._rows, row["id"], new)
        return _decoded(new)

    def owned_job(self, owner_id: str, job_id: str) -> Columns | None:
        row = self._r._rows.get(job_id)
        return None if row is None or row["owner_id"] != owner_id else _decoded(row)

    def transition_owned(
        self, transition: sm.Transition, owner_id: str, job_id: str, inputs: sm.Inputs
    ) -> Columns:
        return self._apply(transition, self._r._rows[job_id], inputs)

    def transition_leases(
        self, transition: sm.Transition, leases: Sequence[Lease], inputs: sm.Inputs, brief: bool = False
    ) -> list[Columns]:
        changed = []
        for lease in leases:
            row = _fenced(self._r._rows.get(lease.job_id), lease, inputs.now)
            if row is None:
                continue
            if (
                transition.within_deadline
                and row["deadline_at"] is not None
                and row["deadline_at"] <= inputs.now
            ):
                continue  # past its deadline: the rescuer ends it
            changed.append(self._apply(transition, row, inputs))
        return changed

    def transition_chosen(
        self, transition: sm.Transition, job_ids: Sequence[str], inputs: sm.Inputs
    ) -> list[Columns]:
        return [self._apply(transition, self._r._rows[job_id], inputs) for job_id in job_ids]

    def transition_found(self, transition: sm.Transition, inputs: sm.Inputs) -> list[Columns]:
        column = "lease_expires_at" if transition.find is sm.Find.EXPIRED else "deadline_at"
        found = [
            row
            for row in self._r._rows.values()
            if row["status"] == transition.source.value
            and row[column] is not None
            and row[column] <= inputs.now
        ]
        return [self._apply(transition, row, inputs) for row in found]

    def transition_batch(
        self, transition: sm.Transition, batch: Sequence[Columns], inputs: sm.Inputs
    ) -> list[Columns]:
        current = [self._r._rows[row["id"]] for row in batch]
        return [
            self._apply(transition, row, inputs)
            for row in current
            if row["status"] == transition.source.value
        ]

    def take_event_sequences(
        self, leases: Sequence[Lease], max_events: int | None, now: datetime
    ) -> dict[tuple[str, str], int]:
        taken = {}
        for lease in leases:
            row = _fenced(self._r._rows.get(lease.job_id), lease, now)
            if row is None or (max_events is not None and row["last_event_sequence"] >= max_events):
                continue
            sequence = row["last_event_sequence"] + 1
            self._journal.put(self._r._rows, lease.job_id, {**row, "last_event_sequence": sequence})
            taken[(lease.job_id, lease.token)] = sequence
        return taken

    def held_leases(self, leases: Sequence[Lease], now: datetime) -> set[tuple[str, str]]:
        return {
            (x.job_id, x.token) for x in leases if _fenced(self._r._rows.get(x.job_id), x, now) is not None
        }

    # ----- claims ----------------------------------------------------------------------

    def lock_claims(self) -> None:
        """One unit of work at a time here: nothing to hold off."""

    def reanchor_after_clock_step(self, now: datetime) -> None:
        for job_id, row in list(self._r._rows.items()):
            if row["status"] == _QUEUED and row["available_at"] > now and row["updated_at"] > now:
                delay = row["available_at"] - row["updated_at"]
                self._journal.put(
                    self._r._rows, job_id, {**row, "available_at": now + delay, "updated_at": now}
                )

    def queue_view(self, kinds: KindFilter, now: datetime) -> _MemoryQueueView:
        return _MemoryQueueView(self._r._rows.values(), kinds, now, set(self._r._paused))

    def bucket_tokens(self, rates: Mapping[str, steering.Rate], now: datetime) -> dict[str, float]:
        return {kind: steering.refill(self._r._buckets.get(kind), rate, now) for kind, rate in rates.items()}

    def spend_tokens(self, tokens: Mapping[str, float], spent: Mapping[str, int], now: datetime) -> None:
        for kind, count in spent.items():
            self._journal.put(self._r._buckets, kind, steering.Bucket(tokens[kind] - count, now))

    def next_wakeup(self, kinds: KindFilter, now: datetime) -> datetime | None:
        moments = [
            row["available_at"] if row["status"] == _QUEUED else row["lease_expires_at"]
            for row in self._r._rows.values()
            if (
                row["status"] == _QUEUED
                and row["available_at"] > now
                and kinds.admits(row["kind"])
                and row["kind"] not in self._r._paused
            )
            or row["status"] == _RUNNING
        ]
        return min(moments, default=None)

    # ----- request ids and worker writes ------------------------------------------

    def take_request_keys(
        self, keys: Sequence[tuple[RequestKey, list[dict[str, Any]]]], now: datetime
    ) -> set[tuple[str, str]]:
        taken = set()
        for key, response in keys:
            ident = (key.owner_id, key.request_id)
            if ident not in self._r._request_ids:
                self._journal.put(
                    self._r._request_ids, ident, (key.method.value, key.fingerprint, response, now)
                )
                taken.add(ident)
        return taken

    def set_request_response(self, key: RequestKey, response: list[dict[str, Any]]) -> None:
        ident = (key.owner_id, key.request_id)
        method, fingerprint, _, created_at = self._r._request_ids[ident]
        self._journal.put(self._r._request_ids, ident, (method, fingerprint, response, created_at))

    def request_record(self, key: RequestKey) -> tuple[str, str, list[dict[str, Any]]]:
        method, fingerprint, response, _ = self._r._request_ids[(key.owner_id, key.request_id)]
        return method, fingerprint, response

    def jobs_named(self, owner_id: str, job_ids: Collection[str]) -> list[Columns]:
        named = (self._r._rows.get(job_id) for job_id in job_ids)
        return [_decoded(row) for row in named if row is not None and row["owner_id"] == owner_id]

    def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None:
        return self._r._worker_writes.get(lease.job_id, {}).get((lease.token, request_key))

    def keep_worker_write(self, record: WorkerWrite) -> None:
        kept = self._r._worker_writes.setdefault(record.job_id, {})
        self._journal.put(kept, (record.lease_token, record.request_key), record)

    # ----- schedules ---------------------------------------------------------------------

    def insert_schedule(self, schedule: schedules.Schedule) -> schedules.Schedule:
        if (schedule.owner_id, schedule.schedule_id) in self._r._schedules:
            raise ScheduleExists(schedule.schedule_id)
        self.store_schedule(schedule)
        stored = self._r._stored_schedule(schedule.owner_id, schedule.schedule_id)
        assert stored is not None
        return stored

    def owned_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule | None:
        return self._r._stored_schedule(owner_id, schedule_id)

    def store_schedule(self, schedule: schedules.Schedule) -> None:
        stored = (schedule, _dumps(schedule.template.payload))
        self._journal.put(self._r._schedules, (schedule.owner_id, schedule.schedule_id), stored)

    def delete_schedule(self, owner_id: str, schedule_id: str) -> bool:
        if (owner_id, schedule_id) not in self._r._schedules:
            return False
        self._journal.delete(self._r._schedules, (owner_id, schedule_id))
        return True

    def due_schedules(self, now: datetime, limit: int) -> list[schedules.Schedule]:
        due = sorted(
            (
                s
                for s, _ in self._r._schedules.values()
                if s.next_fire_at is not None and s.next_fire_at <= now
            ),
            key=lambda s: s.next_fire_at,  # type: ignore[arg-type,return-value]
        )
        found = (self._r._stored_schedule(s.owner_id, s.schedule_id) for s in due[:limit])
        return [s for s in found if s is not None]

    def job_status(self, job_id: str) -> str | None:
        row = self._r._rows.get(job_id)
        return None if row is None else str(row["status"])

    # ----- retention and bulk actions ------------------------------------------------

    def expired_job_ids(self, finished_before: datetime, limit: int) -> list[str]:
        def expired(row: Row) -> bool:
            return JobStatus(row["status"]).is_terminal and row["completed_at"] < finished_before

        def key(row: Row) -> tuple[str, str, str]:
            return (row["owner_id"], row["resource_type"], row["resource_id"])

        # A resource key's jobs go together, once every one has expired.
        in_use = {key(row) for row in self._r._rows.values() if row["resource_id"] and not expired(row)}
        return [row["id"] for row in self._r._rows.values() if expired(row) and key(row) not in in_use][
            :limit
        ]

    def delete_jobs(self, job_ids: Sequence[str]) -> int:
        r, journal = self._r, self._journal
        deleted = 0
        for job_id in job_ids:
            row = r._rows.get(job_id)
            if row is None or not JobStatus(row["status"]).is_terminal:
                continue
            deleted += 1
            journal.delete(r._rows, job_id)
            journal.delete(r._events, job_id)
            if job_id in r._worker_writes:
                journal.delete(r._worker_writes, job_id)
            key = (row["owner_id"], row["resource_type"], row["resource_id"])
            for index in (r._roots, r._latest):
                if index.get(key) == job_id:
                    journal.delete(index, key)
        return deleted

    def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        # Kept in the order they were made, so the oldest come first.
        doomed = [key for key, stored in self._r._request_ids.items() if stored[3] < created_before][:limit]
        for key in doomed:
            self._journal.delete(self._r._request_ids, key)
        return len(doomed)

    def bulk_batch(
        self, job_filter: admin.AdminFilter, below: int | None, limit: int, unretried: bool, lock: bool
    ) -> list[Columns]:
        retried = {row["retry_of_job_id"] for row in self._r._rows.values()} if unretried else set()
        matching = _admin_match(job_filter)
        found = self._r._newest(lambda row: row["id"] not in retried and matching(row), below, limit)
        return [_decoded(row) for row in found]

    def retried_among(self, job_ids: Sequence[str]) -> set[str]:
        wanted = set(job_ids)
        return {row["retry_of_job_id"] for row in self._r._rows.values() if row["retry_of_job_id"] in wanted}

    def pause_kind(self, kind: str, now: datetime) -> None:
        self._journal.put(self._r._paused, kind, True)

    def resume_kind(self, kind: str) -> bool:
        if kind not in self._r._paused:
            return False
        self._journal.delete(self._r._paused, kind)
        return True


class _MemoryQueueView:
    """`steering.QueueView` over the rows, by scanning them when first asked
    (after the claim's recovery has run, as the SQL engines read then)."""

    counted_at: datetime | None = None

    def __init__(
        self, rows: Iterable[Row], kinds: KindFilter, now: datetime, paused: set[str] | None = None
    ) -> None:
        self._source = rows
        self._kinds = kinds
        self._now = now
        self._held = paused or set()

    @property
    def _due(self) -> list[Row]:
        return [
            row
            for row in self._source
            if row["status"] == _QUEUED
            and row["available_at"] <= self._now
            and self._kinds.admits(row["kind"])
            and row["kind"] not in self._held
        ]

    def running(self) -> steering.Running:
        live = [
            row for row in self._source if row["status"] == _RUNNING and row["lease_expires_at"] > self._now
        ]
        return steering.Running(
            Counter(row["owner_id"] for row in live), Counter(row["kind"] for row in live)
        )

    def due_priorities(self) -> list[tuple[int, str | None]]:
        owners: dict[int, set[str]] = {}
        for row in self._due:
            owners.setdefault(row["priority"], set()).add(row["owner_id"])
        return [
            (priority, next(iter(found)) if len(found) == 1 else None)
            for priority, found in sorted(owners.items())
        ]

    def owners_with_due(
        self, priority: int, after: str, count: int
    ) -> list[tuple[str, steering.Head | None]]:
        # One claim at a time here, so each owner's oldest job comes along.
        oldest: dict[str, steering.Head] = {}
        for row in self._due:
            if row["priority"] != priority:
                continue
            head = steering.Head(row["id"], row["kind"], _claim_position(row))
            known = oldest.get(row["owner_id"])
            if known is None or head.position < known.position:  # type: ignore[operator]
                oldest[row["owner_id"]] = head
        owners = sorted(oldest)
        rotated = [owner for owner in owners if owner > after] + [owner for owner in owners if owner <= after]
        return [(owner, oldest[owner]) for owner in rotated[:count]]

    def heads(
        self, priority: int, wanted: Sequence[steering.HeadsWanted], blocked_kinds: frozenset[str]
    ) -> dict[str, list[steering.Head]]:
        due = self._due
        return {want.owner_id: _heads(due, priority, want, blocked_kinds) for want in wanted}


def _heads(
    due: list[Row], priority: int, want: steering.HeadsWanted, blocked_kinds: frozenset[str]
) -> list[steering.Head]:
    found = [
        steering.Head(row["id"], row["kind"], _claim_position(row))
        for row in due
        if row["priority"] == priority
        and row["owner_id"] == want.owner_id
        and row["kind"] not in blocked_kinds
    ]
    found.sort(key=lambda head: head.position)  # type: ignore[arg-type,return-value]
    if want.after is not None:
        found = [head for head in found if head.position > want.after]  # type: ignore[operator]
    return found[: want.count]


def _fenced(row: Row | None, lease: Lease, now: datetime) -> Row | None:
    """The job this lease still owns (running, this token, lease unexpired), or None."""
    if (
        row is None
        or row["status"] != _RUNNING
        or row["lease_token"] != lease.token
        or row["lease_expires_at"] <= now
    ):
        return None
    return row


def _page(found: list[Row], page_size: int) -> JobPage:
    page, more = found[:page_size], len(found) > page_size
    return JobPage(
        jobs=[_job(row, with_result=False) for row in page],
        next_cursor=PageCursor(page[-1]["id"]) if more else None,
    )


def _claim_position(row: Row) -> tuple[object, ...]:
    return tuple(row[column] for column in sm.CLAIM_ORDER)


def _admin_match(job_filter: admin.AdminFilter) -> Callable[[Row], bool]:
    """`job_filter` as a test of a row (any owner, or its `owner_id`)."""
    return lambda row: (
        (not job_filter.owner_id or row["owner_id"] == job_filter.owner_id) and _matches(row, job_filter.jobs)
    )


def _matches(row: Mapping[str, Any], job_filter: JobFilter) -> bool:
    if job_filter.statuses and JobStatus(row["status"]) not in job_filter.statuses:
        return False
    wanted = (
        ("kind", job_filter.kind),
        ("resource_type", job_filter.resource_type),
        ("resource_id", job_filter.resource_id),
    )
    return all(not value or row[column] == value for column, value in wanted)
