"""`JobRepository` in memory: the third engine, for `leasehold.testing` and the
contract suite.

It decides nothing of its own. Every change of status, counter, timestamp or
lease is `state_machine`'s `Transition.apply`, every lifecycle event comes from
`state_machine.lifecycle_events`, and claim order is `state_machine.CLAIM_ORDER`:
the same table the SQL engines compile into statements, executed here in Python.
What is left here is only what a database would do: find rows (by owner, by
lease, by expiry, by due time), keep insertion order, enforce one root job per
resource key, hand out event sequences, and announce committed changes.

Atomicity comes from asyncio: each method yields once to the event loop before
it looks at anything (as a database round trip would), then reads and writes
without awaiting again, so no other call can interleave with it. A method that
raises has changed nothing: everything it checks, it checks before it writes.

Job payloads and event payloads are stored as JSON text and decoded afresh on
every read, so a caller can never mutate stored state through an object it was
given or handed in, and what comes back is what a database would give back
(tuples as lists, and so on).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from leasehold._server.clock import Clock
from leasehold._server.jobs import (
    admin,
    idempotency,
    ids,
    limits,
    owner_stats,
    schedules,
    state_machine,
    steering,
    worker_writes,
)
from leasehold._server.jobs.errors import (
    EventLimitReached,
    JobNotFound,
    LeaseLost,
    RetryNotAllowed,
    ScheduleExists,
    ScheduleNotFound,
    StorageClosed,
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
from leasehold._server.jobs.sql.tables import jobs as jobs_table
from leasehold._server.jobs.state_machine import Branch, Inputs, Transition
from leasehold._server.jobs.steering import Occupancy, Steering
from leasehold._server.jobs.waits import first_of
from leasehold._server.jobs.worker_writes import WorkerWrite

Row = dict[str, Any]

# The columns of a job row: the schema's, so this engine's rows can never lack
# one the state machine reads or writes.
_COLUMNS = tuple(jobs_table.c.keys())
_JOB_FIELDS = tuple(f.name for f in fields(Job) if f.name != "retry_policy")
_QUEUED = JobStatus.QUEUED.value
_RUNNING = JobStatus.RUNNING.value


@dataclass
class _Pending:
    """What one call will announce once it has changed everything it changes
    (the in-memory counterpart of a commit)."""

    work: bool = False
    events: list[JobEvent] = field(default_factory=list)


@dataclass(eq=False)
class _WaitingClaim:
    """A claim waiting for the next write that makes work (claim_with_next_work)."""

    worker_id: str
    limit: int
    lease_seconds: float
    kinds: KindFilter
    answer: asyncio.Future[ClaimResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def _dumps(value: JsonObject) -> str:
    return json.dumps(value)


def _loads(text: str) -> JsonObject:
    value: JsonObject = json.loads(text)
    return value


def _job(row: Mapping[str, Any], with_result: bool = True) -> Job:
    """The job of `row`; a List page leaves its result out, as the SQL engines do."""
    values = {name: row[name] for name in _JOB_FIELDS}
    values["status"] = JobStatus(row["status"])
    stored = row["result"]
    values["result"] = _loads(stored) if with_result and stored is not None else None
    return Job(**values, retry_policy=state_machine.retry_policy_of(row))


class MemoryJobRepository:
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
        self._clock = clock
        self._max_events = max_events_per_job
        self._steering = steering_rules
        self._jitter = jitter
        self._fair_share_cursor = ""
        # Each rate-limited kind's token bucket, once drawn from.
        self._buckets: dict[str, steering.Bucket] = {}
        self._changes = changes or ChangeHub()
        self._rows: dict[str, Row] = {}
        # Per job: (sequence, type, payload as JSON text, created_at), in sequence order.
        self._events: dict[str, list[tuple[int, str, str, datetime]]] = {}
        # (owner, resource type, resource id) -> its root job, and its newest job.
        self._roots: dict[tuple[str, str, str], str] = {}
        self._latest: dict[tuple[str, str, str], str] = {}
        self._next_seq = 1
        # As in the SQL engine: the time of the last claim, to notice a clock step back.
        self._claim_clock_high_water: datetime | None = None
        self._waiting_claims: list[_WaitingClaim] = []
        # (owner, schedule id) -> the schedule, and its template's payload as JSON text.
        self._schedules: dict[tuple[str, str], tuple[schedules.Schedule, str]] = {}
        # Kinds AdminService.PauseKind holds: claims skip them.
        self._paused: set[str] = set()
        # (owner, request id) -> (method, fingerprint, the first answer, when it was made).
        self._request_ids: dict[tuple[str, str], tuple[str, str, list[dict[str, Any]], datetime]] = {}
        # Per job: (lease token, request key) -> the worker write's record.
        self._worker_writes: dict[str, dict[tuple[str, str], WorkerWrite]] = {}
        self._closed = False

    @property
    def changes(self) -> ChangeHub:
        return self._changes

    async def close(self) -> None:
        self._closed = True

    # ----- the engine's own plumbing -------------------------------------------------

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

    @contextmanager
    def _write(self) -> Iterator[_Pending]:
        """Collect what a call changes and announce it once the call's body has
        finished without raising: the hub hears of committed changes only."""
        pending = _Pending()
        yield pending
        if pending.work:
            # Waiting claims are made in the same write, as the SQL engines make
            # them in the same transaction.
            waiting, self._waiting_claims = self._waiting_claims, []
            for claim in waiting:
                claim.answer.set_result(self._claim_now(claim, pending))
            self._changes.publish_work()
        if pending.events:
            self._changes.publish_events(pending.events)

    def _store(self, row: Row, branch: Branch, now: datetime, pending: _Pending) -> None:
        """Keep `row` (the outcome of `branch`) and the lifecycle events the
        state machine says it writes; work became claimable if it is queued."""
        self._rows[row["id"]] = row
        for sequence, event_type, payload in state_machine.lifecycle_events(branch, row):
            self._add_event(row["id"], sequence, event_type, payload, now, pending)
        if branch.status is JobStatus.QUEUED:
            pending.work = True
        elif (
            self._steering.limits_running
            and row["status"] != _RUNNING
            and branch is not state_machine.ENQUEUE
        ):
            pending.work = True  # a slot under a limit may have come free

    def _apply(self, transition: Transition, row: Row, inputs: Inputs, pending: _Pending) -> Row:
        new, branch = transition.apply(row, inputs)
        self._store(new, branch, inputs.now, pending)
        return new

    def _add_event(
        self,
        job_id: str,
        sequence: int,
        event_type: str,
        payload: JsonObject,
        now: datetime,
        pending: _Pending,
    ) -> JobEvent:
        text = _dumps(payload)
        self._events[job_id].append((sequence, event_type, text, now))
        event = JobEvent(job_id, sequence, event_type, _loads(text), now)
        pending.events.append(event)
        return event

    def _owned(self, owner_id: str, job_id: str) -> Row:
        """The owner's job; another owner's is as missing as an unknown id."""
        row = self._rows.get(job_id)
        if row is None or row["owner_id"] != owner_id:
            raise JobNotFound(job_id)
        return row

    def _fenced(self, lease: Lease, now: datetime) -> Row:
        """The job this lease still owns: running, this token, lease unexpired."""
        row = self._rows.get(lease.job_id)
        if (
            row is None
            or row["status"] != _RUNNING
            or row["lease_token"] != lease.token
            or row["lease_expires_at"] <= now
        ):
            raise LeaseLost(lease.job_id)
        return row

    def _insert(self, values: dict[str, Any], now: datetime, pending: _Pending) -> Row:
        """A new queued job (`state_machine.queued_row`) with its enqueue events."""
        row: Row = dict.fromkeys(_COLUMNS)
        row.update(state_machine.queued_row(values, now), seq=self._next_seq)
        self._next_seq += 1
        self._events[row["id"]] = []
        self._store(row, state_machine.ENQUEUE, now, pending)
        if row["resource_id"]:
            key = (row["owner_id"], row["resource_type"], row["resource_id"])
            self._latest[key] = row["id"]
            if row["retry_of_job_id"] is None:
                self._roots[key] = row["id"]
        return row

    # ----- serving an owner -------------------------------------------------------------

    async def enqueue(self, new_job: NewJob) -> tuple[Job, bool]:
        (answer,) = await self.enqueue_batch([new_job])
        return answer

    async def enqueue_batch(self, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        await self._turn()
        return self._enqueue_now(new_jobs)

    def _enqueue_now(self, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        # Serialized first, every one of them: a payload no database could store
        # changes nothing, and neither do the batch's other items.
        payloads = [_dumps(new_job.payload) for new_job in new_jobs]
        now = self._now()
        with self._write() as pending:
            return [
                self._enqueue_one(new_job, payload, now, pending)
                for new_job, payload in zip(new_jobs, payloads, strict=True)
            ]

    def _enqueue_one(
        self, new_job: NewJob, payload: str, now: datetime, pending: _Pending
    ) -> tuple[Job, bool]:
        """One item of a batch; `_insert` records a new root at once, so a later
        item of the same batch naming the same resource finds this one's job."""
        key = (new_job.owner_id, new_job.resource_type, new_job.resource_id)
        if new_job.resource_id and key in self._roots:
            return _job(self._rows[self._latest[key]]), False
        values = {
            "id": ids.new_job_id(),
            "owner_id": new_job.owner_id,
            "kind": new_job.kind,
            "resource_type": new_job.resource_type,
            "resource_id": new_job.resource_id,
            "payload": payload,
            "max_attempts": new_job.max_attempts,
            "timeout_seconds": new_job.timeout_seconds,
            "run_at": new_job.run_at,
            "priority": new_job.priority,
            **state_machine.policy_columns(new_job.retry_policy),
            "traceparent": new_job.traceparent,
        }
        return _job(self._insert(values, now, pending)), True

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
        found: list[Row] = []
        for row in reversed(self._rows.values()):
            if len(found) > page_size:
                break
            if (below is None or row["seq"] < below) and _matches(row, owner_id, job_filter):
                found.append(row)
        page, more = found[:page_size], len(found) > page_size
        return JobPage(
            jobs=[_job(row, with_result=False) for row in page],
            next_cursor=PageCursor(page[-1]["id"]) if more else None,
        )

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

    async def cancel(
        self, owner_id: str, job_id: str, grace_seconds: float = state_machine.DEFAULT_CANCEL_GRACE_SECONDS
    ) -> Job:
        await self._turn()
        now = self._now()
        inputs = Inputs(now=now, grace_until=now + timedelta(seconds=grace_seconds))
        with self._write() as pending:
            row = self._owned(owner_id, job_id)
            transition = state_machine.owner_cancel(
                JobStatus(row["status"]), row["cancel_requested_at"] is not None
            )
            if transition is None:
                return _job(row)
            return _job(self._apply(transition, row, inputs, pending))

    async def retry(self, owner_id: str, job_id: str) -> Job:
        await self._turn()
        return self._retry_now(owner_id, job_id)

    def _retry_now(self, owner_id: str, job_id: str) -> Job:
        with self._write() as pending:
            source = self._owned(owner_id, job_id)
            if not state_machine.can_retry(JobStatus(source["status"])):
                raise RetryNotAllowed(job_id, source["status"])
            values = {"id": ids.new_job_id(), **state_machine.retry_values(source)}
            return _job(self._insert(values, self._now(), pending))

    # ----- idempotent calls (request ids) ----------------------------------------------

    async def enqueue_once(self, new_jobs: Sequence[NewJob], key: RequestKey) -> KeyedAnswer:
        await self._turn()
        return self._once(key, lambda: self._enqueue_now(new_jobs))

    async def retry_once(self, owner_id: str, job_id: str, key: RequestKey) -> KeyedAnswer:
        await self._turn()
        return self._once(key, lambda: [(self._retry_now(owner_id, job_id), True)])

    def _once(self, key: RequestKey, act: Callable[[], list[Answer]]) -> KeyedAnswer:
        """Answer from the key's record, or act and record the answer; without
        awaiting in between, so no other call can take the key meanwhile. A call
        that fails has written nothing, and records no key."""
        stored = self._request_ids.get((key.owner_id, key.request_id))
        if stored is not None:
            method, fingerprint, response, _ = stored
            named = (self._rows.get(job_id) for job_id in idempotency.recorded_job_ids(response))
            jobs = {row["id"]: _job(row) for row in named if row is not None}
            return idempotency.replay(key, method, fingerprint, response, jobs)
        answers = act()
        self._request_ids[(key.owner_id, key.request_id)] = (
            key.method.value,
            key.fingerprint,
            idempotency.record(answers),
            self._now(),
        )
        return KeyedAnswer(answers, repeated=False)

    async def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        await self._turn()
        # Kept in the order they were made, so the oldest come first.
        doomed = [key for key, stored in self._request_ids.items() if stored[3] < created_before][:limit]
        for key in doomed:
            del self._request_ids[key]
        return len(doomed)

    async def list_events(
        self, owner_id: str, job_id: str, after_sequence: int, limit: int
    ) -> list[JobEvent]:
        await self._turn()
        self._owned(owner_id, job_id)
        newer = [event for event in self._events[job_id] if event[0] > after_sequence]
        return [
            JobEvent(job_id, sequence, event_type, _loads(text), created_at)
            for sequence, event_type, text, created_at in newer[: max(limit, 0)]
        ]

    # ----- schedules and retention ------------------------------------------------------

    def _stored_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule:
        """The owner's schedule, its payload decoded afresh; another owner's is
        as missing as an unknown id."""
        stored = self._schedules.get((owner_id, schedule_id))
        if stored is None:
            raise ScheduleNotFound(schedule_id)
        schedule, payload = stored
        return replace(schedule, template=replace(schedule.template, payload=_loads(payload)))

    def _keep_schedule(self, schedule: schedules.Schedule) -> schedules.Schedule:
        payload = _dumps(schedule.template.payload)
        self._schedules[(schedule.owner_id, schedule.schedule_id)] = (schedule, payload)
        return self._stored_schedule(schedule.owner_id, schedule.schedule_id)

    async def create_schedule(self, new_schedule: schedules.NewSchedule) -> schedules.Schedule:
        await self._turn()
        now = self._now()
        if (new_schedule.owner_id, new_schedule.schedule_id) in self._schedules:
            raise ScheduleExists(new_schedule.schedule_id)
        rule = new_schedule.rule
        return self._keep_schedule(
            schedules.Schedule(
                owner_id=new_schedule.owner_id,
                schedule_id=new_schedule.schedule_id,
                cron=rule.expression,
                time_zone=rule.zone_name,
                template=new_schedule.template,
                overlap=new_schedule.overlap,
                catchup_window_seconds=new_schedule.catchup_window_seconds,
                paused=new_schedule.paused,
                next_fire_at=None if new_schedule.paused else rule.next_after(now),
                created_at=now,
                updated_at=now,
            )
        )

    async def get_schedule(self, owner_id: str, schedule_id: str) -> schedules.Schedule:
        await self._turn()
        return self._stored_schedule(owner_id, schedule_id)

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
        cursor = page[-1].schedule_id if len(names) > page_size else None
        return schedules.SchedulePage(page, cursor)

    async def set_schedule_paused(self, owner_id: str, schedule_id: str, paused: bool) -> schedules.Schedule:
        await self._turn()
        now = self._now()
        current = self._stored_schedule(owner_id, schedule_id)
        if current.paused == paused:
            return current
        next_fire_at = None if paused else current.rule.next_after(now)
        return self._keep_schedule(replace(current, paused=paused, next_fire_at=next_fire_at, updated_at=now))

    async def delete_schedule(self, owner_id: str, schedule_id: str) -> None:
        await self._turn()
        self._stored_schedule(owner_id, schedule_id)
        del self._schedules[(owner_id, schedule_id)]

    async def trigger_schedule(self, owner_id: str, schedule_id: str) -> tuple[schedules.Schedule, Job]:
        await self._turn()
        now = self._now()
        current = self._stored_schedule(owner_id, schedule_id)
        with self._write() as pending:
            job = self._enqueue_firing(current, now, now, pending)
            stored = self._keep_schedule(schedules.triggered(current, job.id, now))
        return stored, job

    def _enqueue_firing(
        self, schedule: schedules.Schedule, fire_at: datetime, now: datetime, pending: _Pending
    ) -> Job:
        new_job = schedules.firing_job(schedule, fire_at)
        job, _created = self._enqueue_one(new_job, _dumps(new_job.payload), now, pending)
        return job

    async def fire_due_schedules(self) -> schedules.FiringRound:
        await self._turn()
        now = self._now()
        outcomes = []
        with self._write() as pending:
            due = [
                s for s, _ in self._schedules.values() if s.next_fire_at is not None and s.next_fire_at <= now
            ]
            for found in due:
                schedule = self._stored_schedule(found.owner_id, found.schedule_id)
                running = schedule.overlap is schedules.OverlapPolicy.SKIP and self._still_running(
                    schedule.last_job_id
                )
                firing = schedules.plan_firing(schedule, now, running)
                job_id = None
                if firing.fire_at is not None:
                    job_id = self._enqueue_firing(schedule, firing.fire_at, now, pending).id
                self._keep_schedule(schedules.after_firing(schedule, firing, job_id, now))
                outcomes.append(schedules.outcome(schedule, firing, job_id))
        upcoming = [s.next_fire_at for s, _ in self._schedules.values() if s.next_fire_at is not None]
        return schedules.FiringRound(outcomes, min(upcoming, default=None))

    def _still_running(self, job_id: str | None) -> bool:
        row = self._rows.get(job_id) if job_id is not None else None
        return row is not None and row["status"] in (_QUEUED, _RUNNING)

    async def delete_expired(self, finished_before: datetime, limit: int) -> int:
        await self._turn()

        def expired(row: Row) -> bool:
            return (
                JobStatus(row["status"]).is_terminal
                and row["completed_at"] is not None
                and row["completed_at"] < finished_before
            )

        # As in SQL: a resource key's jobs go together, once every one has expired.
        in_use = {
            (row["owner_id"], row["resource_type"], row["resource_id"])
            for row in self._rows.values()
            if row["resource_id"] and not expired(row)
        }
        doomed = [
            row
            for row in self._rows.values()
            if expired(row) and (row["owner_id"], row["resource_type"], row["resource_id"]) not in in_use
        ][:limit]
        for row in doomed:
            del self._rows[row["id"]]
            del self._events[row["id"]]
            self._worker_writes.pop(row["id"], None)
            key = (row["owner_id"], row["resource_type"], row["resource_id"])
            if self._roots.get(key) == row["id"]:
                del self._roots[key]
            if self._latest.get(key) == row["id"]:
                del self._latest[key]
        return len(doomed)

    # ----- serving a worker ---------------------------------------------------------------

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        await self._turn()
        with self._write() as pending:
            return self._claim_now(_WaitingClaim(worker_id, limit, lease_seconds, kinds), pending)

    async def claim_with_next_work(
        self,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        kinds: KindFilter,
        give_up: asyncio.Event,
        timeout: float,
    ) -> ClaimResult | None:
        await self._turn()
        waiting = _WaitingClaim(worker_id, limit, lease_seconds, kinds)
        self._waiting_claims.append(waiting)
        try:
            made = await first_of(asyncio.shield(waiting.answer), give_up, timeout)
        except asyncio.CancelledError:
            if waiting.answer.done():  # made as the wait was cancelled: give it back
                await asyncio.shield(self._hand_back(waiting.answer.result()))
            raise
        finally:
            if waiting in self._waiting_claims:
                self._waiting_claims.remove(waiting)
        # A write may have made it while the wait was being given up: its jobs
        # are leased, so they are this caller's.
        return made if made is not None or not waiting.answer.done() else waiting.answer.result()

    async def _hand_back(self, result: ClaimResult) -> None:
        for claimed in result.jobs:
            with contextlib.suppress(LeaseLost):
                await self.release(claimed.lease)

    def _claim_now(self, claim: _WaitingClaim, pending: _Pending) -> ClaimResult:
        now = self._now()
        high_water = self._claim_clock_high_water
        if high_water is None or now < high_water:
            self._reanchor_after_clock_step(now)
        expired = self._recover_expired(now, pending)
        claimed, rate_wakeup = self._lease_due(
            claim.worker_id, claim.limit, claim.lease_seconds, now, pending, claim.kinds
        )
        self._claim_clock_high_water = now
        later = None if len(claimed) == claim.limit else self._next_wakeup(claim.kinds, now)
        wakeups = (later, rate_wakeup)
        return ClaimResult(
            jobs=claimed,
            next_wakeup_at=min((m for m in wakeups if m is not None), default=None),
            recovered=expired,
        )

    def _reanchor_after_clock_step(self, now: datetime) -> None:
        """What the SQL engines' REANCHOR_AFTER_CLOCK_STEP does: a queued job last
        written in the future was stamped by a clock that has since stepped back;
        it keeps its delay, counted from now, instead of waiting out the step."""
        for job_id, row in self._rows.items():
            if row["status"] == _QUEUED and row["available_at"] > now and row["updated_at"] > now:
                delay = row["available_at"] - row["updated_at"]
                self._rows[job_id] = {**row, "available_at": now + delay, "updated_at": now}

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        await self._turn()
        with self._write() as pending:
            return self._recover_expired(self._now(), pending)

    def _recover_expired(self, now: datetime, pending: _Pending) -> list[RecoveredJob]:
        """Expired leases first, then overdue attempts, as the SQL engines do."""
        recovered: list[RecoveredJob] = []
        for transition, column in (
            (state_machine.RECOVER_EXPIRED_LEASE, "lease_expires_at"),
            (state_machine.END_OVERDUE, "deadline_at"),
        ):
            found = [
                row
                for row in self._rows.values()
                if row["status"] == transition.source.value and row[column] is not None and row[column] <= now
            ]
            for row in found:
                new = self._apply(transition, row, Inputs(now=now, jitter=self._jitter()), pending)
                recovered.append(
                    RecoveredJob(
                        new["id"],
                        new["kind"],
                        JobStatus(new["status"]),
                        lease_expired=transition is state_machine.RECOVER_EXPIRED_LEASE,
                    )
                )
        return recovered

    async def queued_by_kind(self) -> list[QueuedKind]:
        # The reference engine keeps no index; it holds a test's few jobs.
        await self._turn()
        now = self._now()
        due: dict[str, list[datetime]] = {}
        for row in self._rows.values():
            if row["status"] == _QUEUED and row["available_at"] <= now:
                due.setdefault(row["kind"], []).append(row["available_at"])
        return [QueuedKind(kind, len(times), min(times)) for kind, times in sorted(due.items())]

    def _lease_due(
        self,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        now: datetime,
        pending: _Pending,
        kinds: KindFilter = ANY_KIND,
    ) -> tuple[list[ClaimedJob], datetime | None]:
        if limit <= 0:
            return [], None
        rules = self._steering
        tokens = {
            kind: steering.refill(self._buckets.get(kind), rate, now)
            for kind, rate in rules.kind_rates.items()
        }
        view = _MemoryQueueView(self._rows.values(), kinds, now, self._paused)
        choice = steering.choose(view, rules, limit, self._fair_share_cursor, tokens)
        self._fair_share_cursor = choice.cursor
        for kind, spent in choice.rate_spent.items():
            self._buckets[kind] = steering.Bucket(tokens[kind] - spent, now)
        rate_wakeup = steering.rate_wakeup(tokens, choice.rate_spent, rules.kind_rates, now)
        # One fresh token for the whole claim, as in the SQL engine: fencing is
        # per (job id, token), and no other attempt of these jobs can hold it.
        token = ids.new_lease_token()
        expires_at = now + timedelta(seconds=lease_seconds)
        inputs = Inputs(now=now, worker=worker_id, token=token, expires_at=expires_at)
        claimed = []
        for job_id in choice.job_ids:
            new = self._apply(state_machine.CLAIM, self._rows[job_id], inputs, pending)
            claimed.append(
                ClaimedJob(
                    job=_job(new),
                    payload=_loads(new["payload"]),
                    lease=Lease(job_id=new["id"], token=token, attempt=new["attempt"]),
                    lease_expires_at=expires_at,
                    checkpoint=None if new["checkpoint"] is None else _loads(new["checkpoint"]),
                )
            )
        return claimed, rate_wakeup

    def _next_wakeup(self, kinds: KindFilter, now: datetime) -> datetime | None:
        """When something may next become claimable for this claimer: a queued
        job of its kinds falls due later, or any running job's lease expires
        (as the SQL engines' `statements.next_wakeup`)."""
        moments = [
            row["available_at"] if row["status"] == _QUEUED else row["lease_expires_at"]
            for row in self._rows.values()
            if (
                row["status"] == _QUEUED
                and row["available_at"] > now
                and kinds.admits(row["kind"])
                and row["kind"] not in self._paused
            )
            or row["status"] == _RUNNING
        ]
        return min(moments, default=None)

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        (renewal,) = await self.heartbeat([lease], lease_seconds)
        if renewal is None:
            raise LeaseLost(lease.job_id)
        return renewal.expires_at

    async def heartbeat(self, leases: list[Lease], lease_seconds: float) -> list[LeaseRenewal | None]:
        await self._turn()
        now = self._now()
        expires_at = now + timedelta(seconds=lease_seconds)
        answers: list[LeaseRenewal | None] = []
        with self._write() as pending:
            for lease in leases:
                try:
                    row = self._fenced(lease, now)
                except LeaseLost:
                    answers.append(None)
                    continue
                if row["deadline_at"] is not None and row["deadline_at"] <= now:
                    answers.append(None)  # past its deadline: the rescuer ends it
                    continue
                self._apply(state_machine.HEARTBEAT, row, Inputs(now=now, expires_at=expires_at), pending)
                answers.append(LeaseRenewal(expires_at, row["cancel_requested_at"] is not None))
        return answers

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        await self._turn()
        now = self._now()
        stored = _dumps(checkpoint)  # kept as text, like a payload: a copy the caller cannot change
        expires_at = now + timedelta(seconds=lease_seconds)
        with self._write() as pending:
            row = self._fenced(lease, now)
            if row["deadline_at"] is not None and row["deadline_at"] <= now:
                raise LeaseLost(lease.job_id)  # past its deadline, as a heartbeat is refused
            inputs = Inputs(now=now, expires_at=expires_at, checkpoint=stored)
            self._apply(state_machine.CHECKPOINT, row, inputs, pending)
            return LeaseRenewal(expires_at, row["cancel_requested_at"] is not None)

    async def succeed(self, lease: Lease, result: JsonObject | None = None, remember: bool = False) -> Job:
        stored = None if result is None else _dumps(result)  # kept as text, like a payload
        return await self._end(
            lease, state_machine.SUCCEED, lambda now: Inputs(now=now, result=stored), remember
        )

    async def fail(
        self,
        lease: Lease,
        error: str,
        retryable: bool = True,
        error_type: str | None = None,
        retry_after_seconds: float | None = None,
        remember: bool = False,
    ) -> Job:
        stored = limits.storable_error(error)
        return await self._end(
            lease,
            state_machine.FAIL,
            lambda now: Inputs(
                now=now,
                jitter=self._jitter(),
                retryable=retryable,
                error=stored,
                error_type=limits.storable_error_type(error_type),
                retry_at=None
                if retry_after_seconds is None
                else now + timedelta(seconds=retry_after_seconds),
            ),
            remember,
        )

    async def snooze(self, lease: Lease, delay_seconds: float, remember: bool = False) -> Job:
        return await self._end(
            lease,
            state_machine.SNOOZE,
            lambda now: Inputs(now=now, retry_at=now + timedelta(seconds=delay_seconds)),
            remember,
        )

    async def release(self, lease: Lease) -> Job:
        return await self._end(lease, state_machine.RELEASE, lambda now: Inputs(now=now))

    async def mark_cancelled(self, lease: Lease, remember: bool = False) -> Job:
        return await self._end(lease, state_machine.CONFIRM_CANCEL, lambda now: Inputs(now=now), remember)

    async def _end(
        self,
        lease: Lease,
        transition: Transition,
        inputs: Callable[[datetime], Inputs],
        remember: bool = False,
    ) -> Job:
        """One fenced transition of the attempt `lease` holds (with its record,
        when asked to `remember` it)."""
        await self._turn()
        now = self._now()
        with self._write() as pending:
            row = self._fenced(lease, now)
            job = _job(self._apply(transition, row, inputs(now), pending))
            if remember:
                self._keep_worker_write(worker_writes.finished(lease, transition, job, now))
            return job

    def _keep_worker_write(self, record: WorkerWrite) -> None:
        self._worker_writes.setdefault(record.job_id, {})[(record.lease_token, record.request_key)] = record

    async def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None:
        await self._turn()
        return self._worker_writes.get(lease.job_id, {}).get((lease.token, request_key))

    async def append_event(
        self, lease: Lease, event_type: str, payload: JsonObject, request_id: str | None = None
    ) -> JobEvent:
        await self._turn()
        now = self._now()
        _dumps(payload)  # refused before anything changes, like an enqueue's payload
        if request_id is not None:
            stored = self._worker_writes.get(lease.job_id, {}).get((lease.token, request_id))
            if stored is not None:
                return worker_writes.replay_append(stored, request_id, event_type, payload)
        with self._write() as pending:
            event = self._append_now(lease, event_type, payload, now, pending)
            if request_id is not None:
                self._keep_worker_write(worker_writes.appended(lease, request_id, event))
            return event

    def _append_now(
        self, lease: Lease, event_type: str, payload: JsonObject, now: datetime, pending: _Pending
    ) -> JobEvent:
        row = self._fenced(lease, now)
        if self._max_events is not None and row["last_event_sequence"] >= self._max_events:
            raise EventLimitReached(lease.job_id, self._max_events)
        sequence = row["last_event_sequence"] + 1
        self._rows[lease.job_id] = {**row, "last_event_sequence": sequence}
        return self._add_event(lease.job_id, sequence, event_type, payload, now, pending)

    @property
    def steering(self) -> Steering:
        return self._steering

    async def occupancy(self, owner_id: str, kind: str) -> Occupancy:
        await self._turn()
        now = self._now()
        running = _MemoryQueueView(self._rows.values(), ANY_KIND, now).running()
        rate = self._steering.kind_rates.get(kind)
        tokens = None if rate is None else steering.refill(self._buckets.get(kind), rate, now)
        return steering.Occupancy(
            running.by_kind.get(kind, 0), running.by_owner.get(owner_id, 0), tokens, kind in self._paused
        )

    # ----- administration (AdminService), across every owner ---------------------------

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
            if status in admin.CANCELLABLE:
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
        found = self._newest_matching(job_filter, below, page_size + 1)
        page, more = found[:page_size], len(found) > page_size
        return JobPage(
            jobs=[_job(row, with_result=False) for row in page],
            next_cursor=PageCursor(page[-1]["id"]) if more else None,
        )

    def _newest_matching(
        self, job_filter: admin.AdminFilter, below: int | None, limit: int, skip: frozenset[str] = frozenset()
    ) -> list[Row]:
        found: list[Row] = []
        for row in reversed(self._rows.values()):
            if len(found) >= limit:
                break
            if job_filter.owner_id and row["owner_id"] != job_filter.owner_id:
                continue
            if (below is None or row["seq"] < below) and row["id"] not in skip:
                if _matches(row, row["owner_id"], job_filter.jobs):
                    found.append(row)
        return found

    async def bulk_cancel(
        self,
        job_filter: admin.AdminFilter,
        below: int | None,
        limit: int,
        grace_seconds: float,
        dry_run: bool,
    ) -> admin.BulkBatch:
        await self._turn()
        now = self._now()
        rows = self._newest_matching(job_filter, below, limit)
        changed: list[Job] = []
        if not dry_run:
            inputs = Inputs(now=now, grace_until=now + timedelta(seconds=grace_seconds))
            with self._write() as pending:
                for row in rows:
                    transition = state_machine.owner_cancel(
                        JobStatus(row["status"]), row["cancel_requested_at"] is not None
                    )
                    if transition is not None:
                        changed.append(_job(self._apply(transition, row, inputs, pending)))
        return _bulk_batch(rows, changed)

    async def bulk_retry(
        self, job_filter: admin.AdminFilter, below: int | None, limit: int, dry_run: bool
    ) -> admin.BulkBatch:
        await self._turn()
        retried = frozenset(row["retry_of_job_id"] for row in self._rows.values() if row["retry_of_job_id"])
        rows = self._newest_matching(job_filter, below, limit, skip=retried)
        changed: list[Job] = []
        if not dry_run:
            with self._write() as pending:
                changed = [self._insert_retry(source, pending) for source in rows]
        return _bulk_batch(rows, changed)

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
        return self._next_seq

    async def set_kind_paused(self, kind: str, paused: bool) -> bool:
        await self._turn()
        with self._write() as pending:
            if paused:
                self._paused.add(kind)
            elif kind in self._paused:
                self._paused.discard(kind)
                pending.work = True  # its queued jobs are claimable again
        return paused

    def _insert_retry(self, source: Row, pending: _Pending) -> Job:
        """A new queued job copying `source`, as `retry` makes one."""
        values = {"id": ids.new_job_id(), **state_machine.retry_values(source)}
        return _job(self._insert(values, self._now(), pending))

    async def cancel_requested(self, lease: Lease) -> bool:
        await self._turn()
        return self._fenced(lease, self._now())["cancel_requested_at"] is not None

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        """`succeed`, answering only the status the job ended in, as the SQL engine's."""
        return (await self.succeed(lease, result)).status


class _MemoryQueueView:
    """`steering.QueueView` over the rows, by scanning them."""

    def __init__(
        self, rows: Iterable[Row], kinds: KindFilter, now: datetime, paused: set[str] | None = None
    ) -> None:
        self._rows = list(rows)
        self._now = now
        held = paused or set()
        self._due = [
            row
            for row in self._rows
            if row["status"] == _QUEUED
            and row["available_at"] <= now
            and kinds.admits(row["kind"])
            and row["kind"] not in held
        ]

    def running(self) -> steering.Running:
        live = [
            row for row in self._rows if row["status"] == _RUNNING and row["lease_expires_at"] > self._now
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
        self,
        priority: int,
        wanted: Sequence[steering.HeadsWanted],
        blocked_kinds: frozenset[str],
    ) -> dict[str, list[steering.Head]]:
        return {want.owner_id: self._heads(priority, want, blocked_kinds) for want in wanted}

    def _heads(
        self, priority: int, want: steering.HeadsWanted, blocked_kinds: frozenset[str]
    ) -> list[steering.Head]:
        found = [
            steering.Head(row["id"], row["kind"], _claim_position(row))
            for row in self._due
            if row["priority"] == priority
            and row["owner_id"] == want.owner_id
            and row["kind"] not in blocked_kinds
        ]
        found.sort(key=lambda head: head.position)  # type: ignore[arg-type,return-value]
        if want.after is not None:
            found = [head for head in found if head.position > want.after]  # type: ignore[operator]
        return found[: want.count]


def _bulk_batch(rows: list[Row], changed: list[Job]) -> admin.BulkBatch:
    """As the SQL engines: the walk ends with a batch that finds nothing."""
    return admin.BulkBatch(len(rows), changed, rows[-1]["seq"] if rows else None)


def _claim_position(row: Row) -> tuple[object, ...]:
    return tuple(row[column] for column in state_machine.CLAIM_ORDER)


def _matches(row: Mapping[str, Any], owner_id: str, job_filter: JobFilter) -> bool:
    if row["owner_id"] != owner_id:
        return False
    if job_filter.statuses and JobStatus(row["status"]) not in job_filter.statuses:
        return False
    wanted = (
        ("kind", job_filter.kind),
        ("resource_type", job_filter.resource_type),
        ("resource_id", job_filter.resource_id),
    )
    return all(not value or row[column] == value for column, value in wanted)
