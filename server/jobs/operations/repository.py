"""Every write operation of `JobRepository`, written once above the engines.

An operation here reads what it needs through `Rows`, decides with the state
machine, the schedules' rules and steering, and writes through `Rows` again,
all inside one unit of work the engine opens (`_write`). An engine subclasses
`OperatedRepository`, says how a unit of work is opened, and implements `Rows`
and the pure reads (get, list, stats); it never decides a status, an event, a
wait or a wake-up.

Operations that many callers make at once (enqueues without a resource key,
successes, heartbeats, progress events) are written over a list of callers
(`Many`): an engine that batches writes runs every caller of a batch in one
statement; the in-memory engine runs a list of one.
"""

from __future__ import annotations

import asyncio
import functools
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar

from leasehold._server.clock import Clock
from leasehold._server.jobs import idempotency, ids, limits, schedules, steering, worker_writes
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.admin import AdminFilter, BulkBatch
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
from leasehold._server.jobs.operations.rows import Columns, Rows
from leasehold._server.jobs.records import (
    ClaimedJob,
    ClaimResult,
    Job,
    JobEvent,
    JobStatus,
    JsonObject,
    Lease,
    LeaseRenewal,
    NewJob,
    RecoveredJob,
)
from leasehold._server.jobs.routing import ANY_KIND, KindFilter
from leasehold._server.jobs.waits import first_of

T = TypeVar("T")
ItemT = TypeVar("ItemT")

# Due schedules fired per unit of work.
FIRING_BATCH = 50


@dataclass(frozen=True)
class Many(Generic[ItemT, T]):
    """One operation that many callers may ask for at once: `run` gets every
    caller's item and answers each with its result or the exception to raise to
    that caller (an answer: the others' writes stand)."""

    name: str
    run: Callable[[Rows, list[ItemT]], list[T | Exception]]


class Waiting(Protocol[T]):
    """A unit of work waiting for the next write that makes work claimable."""

    async def result(self) -> T: ...

    async def withdraw(self) -> T | None:
        """Stop waiting: None if it had not run; else what it returned (or raised)."""
        ...


@dataclass(frozen=True)
class _Append:
    lease: Lease
    event_type: str
    payload: JsonObject


def _rounds(items: Sequence[ItemT], job_id: Callable[[ItemT], str]) -> Iterator[dict[str, tuple[int, ItemT]]]:
    """`items` (with their places) in rounds holding at most one item per job.
    Two leases on one job (a stale one and perhaps the valid one, or two
    appends of one handler) go in separate statements: a changed row cannot
    say whose lease changed it, and one UPDATE changes a row once."""
    waiting = list(enumerate(items))
    while waiting:
        this_round: dict[str, tuple[int, ItemT]] = {}
        later: list[tuple[int, ItemT]] = []
        for index, item in waiting:
            key = job_id(item)
            if key in this_round:
                later.append((index, item))
            else:
                this_round[key] = (index, item)
        yield this_round
        waiting = later


def _enqueue_events(job_id: str, now: datetime) -> list[JobEvent]:
    return [JobEvent(job_id, sequence, event_type, {}, now) for sequence, event_type in sm.enqueue_events()]


def _bulk_batch(batch: Sequence[Columns], changed: list[Job], matched: int | None = None) -> BulkBatch:
    """The walk goes on below the batch's last job until a batch finds none,
    never trusting a short batch to be the last: on PostgreSQL a row another
    transaction changed while this one waited for its lock drops out of the
    batch (it no longer matches), whether or not the LIMIT is made up."""
    return BulkBatch(
        matched=len(batch) if matched is None else matched,
        changed=changed,
        next_position=batch[-1]["seq"] if batch else None,
    )


class OperatedRepository(ABC):
    """The operations of `JobRepository` that write; an engine adds how a unit
    of work runs (`_write`, `_write_many`, `_sweep`, `_write_on_next_work`)
    and the reads."""

    def __init__(
        self,
        clock: Clock,
        changes: ChangeHub | None,
        steering_rules: steering.Steering,
        jitter: Callable[[], float],
        max_events_per_job: int | None,
    ) -> None:
        """`max_events_per_job`: append_event refuses a job whose log holds that many
        events (its lifecycle events included, which are never refused); None: no limit."""
        self._clock = clock
        self._changes = changes or ChangeHub()
        self._steering = steering_rules
        self._jitter = jitter
        self._max_events = max_events_per_job
        # Where the turn-taking among owners with nothing running goes on
        # (steering.choose); this process's own, which is all fairness needs.
        self._fair_share_cursor = ""
        # The time of the last committed claim; None until the first. See _claim_op.
        self._claim_clock_high_water: datetime | None = None
        self._enqueues: Many[NewJob, tuple[Job, bool]] = Many("enqueue", self._enqueue_rows)
        self._keyed_enqueues: Many[tuple[NewJob, RequestKey], KeyedAnswer] = Many(
            "enqueue_once", self._enqueue_once_rows
        )
        self._successes: Many[Lease, Job] = Many(sm.SUCCEED.name, self._succeed_rows)
        self._brief_successes: Many[Lease, JobStatus] = Many("succeed_status", self._succeed_status_rows)
        self._appends: Many[_Append, JobEvent] = Many("append", self._append_rows)

    @property
    def changes(self) -> ChangeHub:
        return self._changes

    @property
    def steering(self) -> steering.Steering:
        return self._steering

    # ----- what an engine provides -------------------------------------------------------

    @abstractmethod
    async def _write(self, op: Callable[[Rows], T]) -> T:
        """Run `op` in a unit of work of its own (or a savepoint of a shared
        one): what it writes commits whole, or not at all if it raises."""

    @abstractmethod
    async def _write_many(self, many: Many[ItemT, T], item: ItemT) -> T:
        """`many` for `item`, together with whichever other callers' items
        the engine gathers; raises the exception `many` answered with."""

    async def _sweep(self, op: Callable[[Rows], T]) -> T:
        """`_write`, for retention's deletes and bulk batches: an engine may
        run them apart from the claims' writes."""
        return await self._write(op)

    @abstractmethod
    def _write_on_next_work(self, op: Callable[[Rows], T]) -> Waiting[T]:
        """Run `op` in the next write of this process that makes work
        claimable, in that write's unit of work."""

    @abstractmethod
    async def _next_fire_at(self) -> datetime | None:
        """The earliest next fire time of any schedule (a read)."""

    @abstractmethod
    async def _bulk_preview(
        self, job_filter: AdminFilter, below: int | None, limit: int, unretried: bool
    ) -> list[Columns]:
        """`Rows.bulk_batch` as a read that locks nothing (a dry run)."""

    def _watch_other_writers(self) -> None:  # noqa: B027 - most engines have no feed
        """Called before a claim waits on the change hub: an engine whose
        other processes' commits arrive by a feed starts it here."""

    # ----- after a transition -------------------------------------------------------------

    def _written(
        self, rows: Rows, transition: sm.Transition, changed: Sequence[Columns], now: datetime
    ) -> None:
        """Write the events of the branch each changed row took, and wake the
        claimers when one of them made work claimable."""
        events: list[JobEvent] = []
        wake = False
        for row in changed:
            branch = transition.branch_for(row["status"])
            events.extend(
                JobEvent(row["id"], sequence, event_type, payload, now)
                for sequence, event_type, payload in sm.lifecycle_events(branch, row)
            )
            wake = wake or sm.wakes_claimers(transition, branch, self._steering.limits_running)
        if events:
            rows.insert_events(events)
        if wake:
            rows.announce_work()

    # ----- serving an owner -----------------------------------------------------------------

    async def enqueue(self, new_job: NewJob) -> tuple[Job, bool]:
        if not new_job.resource_id:
            # Nothing to look up first: every such enqueue of a batch is one INSERT.
            return await self._write_many(self._enqueues, new_job)
        (answer,) = await self._write(lambda rows: self._enqueue_rows(rows, [new_job]))
        return answer

    async def enqueue_batch(self, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        batch = list(new_jobs)
        return await self._write(lambda rows: self._enqueue_rows(rows, batch))

    def _enqueue_rows(self, rows: Rows, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        """Items without a resource id queue up for one insert; each resource's
        item is inserted alone (the resource's one root job decides), after the
        rows queued before it, so jobs are stored in request order. A resource
        named again later in the batch is answered from its first answer: that
        is its most recent job."""
        now = rows.now()
        answers: list[tuple[Job, bool]] = []
        unkeyed: list[dict[str, Any]] = []
        created: list[str] = []
        by_resource: dict[tuple[str, str, str], Job] = {}
        for new_job in new_jobs:
            row = sm.queued_row(sm.new_job_values(new_job), now)
            if not new_job.resource_id:
                unkeyed.append(row)
                created.append(row["id"])
                answers.append((sm.job_of(row), True))
                continue
            key = (new_job.owner_id, new_job.resource_type, new_job.resource_id)
            if key in by_resource:
                answers.append((by_resource[key], False))
                continue
            if unkeyed:
                rows.insert_jobs(unkeyed)
                unkeyed = []
            if rows.insert_root(row):
                job, is_new = sm.job_of(row), True
                created.append(job.id)
            else:
                job, is_new = sm.job_of(rows.latest_for_resource(*key)), False
            by_resource[key] = job
            answers.append((job, is_new))
        if unkeyed:
            rows.insert_jobs(unkeyed)
        if created:
            rows.insert_events([event for job_id in created for event in _enqueue_events(job_id, now)])
            rows.announce_work()
        return answers

    async def cancel(
        self, owner_id: str, job_id: str, grace_seconds: float = sm.DEFAULT_CANCEL_GRACE_SECONDS
    ) -> Job:
        def op(rows: Rows) -> Job:
            now = rows.now()
            current = rows.owned_job(owner_id, job_id)
            if current is None:
                raise JobNotFound(job_id)
            transition = sm.owner_cancel(
                JobStatus(current["status"]), current["cancel_requested_at"] is not None
            )
            if transition is None:
                return sm.job_of(current)
            inputs = sm.Inputs(now=now, grace_until=now + timedelta(seconds=grace_seconds))
            changed = rows.transition_owned(transition, owner_id, job_id, inputs)
            self._written(rows, transition, [changed], now)
            return sm.job_of(changed)

        return await self._write(op)

    async def retry(self, owner_id: str, job_id: str) -> Job:
        return await self._write(lambda rows: self._retry_rows(rows, owner_id, job_id))

    def _retry_rows(self, rows: Rows, owner_id: str, job_id: str) -> Job:
        now = rows.now()
        source = rows.owned_job(owner_id, job_id)
        if source is None:
            raise JobNotFound(job_id)
        if not sm.can_retry(JobStatus(source["status"])):
            raise RetryNotAllowed(job_id, source["status"])
        row = sm.queued_row({"id": ids.new_job_id(), **sm.retry_values(source)}, now)
        rows.insert_jobs([row])
        rows.insert_events(_enqueue_events(row["id"], now))
        rows.announce_work()
        return sm.job_of(row)

    # ----- idempotent calls (request ids) -------------------------------------------------

    async def enqueue_once(self, new_jobs: Sequence[NewJob], key: RequestKey) -> KeyedAnswer:
        batch = list(new_jobs)
        if len(batch) == 1 and not batch[0].resource_id:
            # The commonest idempotent call (a client sends a request id with
            # every Enqueue): its answer is known before anything is written,
            # so such calls of a batch share their statements, as plain ones do.
            return await self._write_many(self._keyed_enqueues, (batch[0], key))
        return await self._write(lambda rows: self._once(rows, key, lambda: self._enqueue_rows(rows, batch)))

    async def retry_once(self, owner_id: str, job_id: str, key: RequestKey) -> KeyedAnswer:
        return await self._write(
            lambda rows: self._once(rows, key, lambda: [(self._retry_rows(rows, owner_id, job_id), True)])
        )

    def _once(self, rows: Rows, key: RequestKey, act: Callable[[], list[Answer]]) -> KeyedAnswer:
        """Take the key, then act and record the answer; or, when the key is
        taken, answer from its record. All in one unit of work: a call that
        fails leaves neither jobs nor a key behind."""
        if not rows.take_request_keys([(key, [])], rows.now()):
            return self._replay(rows, key)
        answers = act()
        rows.set_request_response(key, idempotency.record(answers))
        return KeyedAnswer(answers, repeated=False)

    @staticmethod
    def _replay(rows: Rows, key: RequestKey) -> KeyedAnswer:
        method, fingerprint, response = rows.request_record(key)
        named = rows.jobs_named(key.owner_id, idempotency.recorded_job_ids(response))
        return idempotency.replay(
            key, method, fingerprint, response, {row["id"]: sm.job_of(row) for row in named}
        )

    def _enqueue_once_rows(
        self, rows: Rows, items: list[tuple[NewJob, RequestKey]]
    ) -> list[KeyedAnswer | Exception]:
        """Single new jobs without a resource key, each under its request id:
        every key goes in with its final answer (the job id is drawn here, and
        such a job is always created); the jobs whose keys went in are inserted
        together; every other call is a repeat, answered from its key's record
        once those jobs are in."""
        now = rows.now()
        firsts: dict[tuple[str, str], dict[str, Any]] = {}
        keys: list[tuple[RequestKey, list[dict[str, Any]]]] = []
        for new_job, key in items:
            ident = (key.owner_id, key.request_id)
            if ident not in firsts:
                firsts[ident] = row = sm.queued_row(sm.new_job_values(new_job), now)
                keys.append((key, idempotency.record([(sm.job_of(row), True)])))
        taken = rows.take_request_keys(keys, now)
        created = [row for ident, row in firsts.items() if ident in taken]
        if created:
            rows.insert_jobs(created)
            rows.insert_events([event for row in created for event in _enqueue_events(row["id"], now)])
            rows.announce_work()
        answers: list[KeyedAnswer | Exception] = []
        for _, key in items:
            ident = (key.owner_id, key.request_id)
            if ident in taken:
                taken.discard(ident)  # the first call with the key; any later one is a repeat
                answers.append(KeyedAnswer([(sm.job_of(firsts[ident]), True)], repeated=False))
                continue
            try:
                answers.append(self._replay(rows, key))
            except (RequestIdReused, RequestResultDeleted) as exc:
                answers.append(exc)
        return answers

    # ----- schedules ------------------------------------------------------------------------

    async def create_schedule(self, new_schedule: schedules.NewSchedule) -> schedules.Schedule:
        return await self._write(
            lambda rows: rows.insert_schedule(schedules.created(new_schedule, rows.now()))
        )

    @staticmethod
    def _owned_schedule(rows: Rows, owner_id: str, schedule_id: str) -> schedules.Schedule:
        found = rows.owned_schedule(owner_id, schedule_id)
        if found is None:
            raise ScheduleNotFound(schedule_id)
        return found

    async def set_schedule_paused(self, owner_id: str, schedule_id: str, paused: bool) -> schedules.Schedule:
        def op(rows: Rows) -> schedules.Schedule:
            current = self._owned_schedule(rows, owner_id, schedule_id)
            if current.paused == paused:
                return current
            changed = schedules.paused_at(current, paused, rows.now())
            rows.store_schedule(changed)
            return changed

        return await self._write(op)

    async def delete_schedule(self, owner_id: str, schedule_id: str) -> None:
        def op(rows: Rows) -> None:
            if not rows.delete_schedule(owner_id, schedule_id):
                raise ScheduleNotFound(schedule_id)

        await self._write(op)

    async def trigger_schedule(self, owner_id: str, schedule_id: str) -> tuple[schedules.Schedule, Job]:
        def op(rows: Rows) -> tuple[schedules.Schedule, Job]:
            now = rows.now()
            current = self._owned_schedule(rows, owner_id, schedule_id)
            job = self._enqueue_firing(rows, current, now)
            changed = schedules.triggered(current, job.id, now)
            rows.store_schedule(changed)
            return changed, job

        return await self._write(op)

    def _enqueue_firing(self, rows: Rows, schedule: schedules.Schedule, fire_at: datetime) -> Job:
        """The firing's job: new, or the one another replica already made for it."""
        ((job, _created),) = self._enqueue_rows(rows, [schedules.firing_job(schedule, fire_at)])
        return job

    async def fire_due_schedules(self) -> schedules.FiringRound:
        outcomes: list[schedules.FiringOutcome] = []
        # A look that finds nothing due costs one indexed read, not a write
        # (on SQLite, the file's write lock) every few seconds.
        upcoming = await self._next_fire_at()
        if upcoming is None or upcoming > self._clock.now():
            return schedules.FiringRound(outcomes, upcoming)
        while True:
            batch = await self._write(self._fire_due_rows)
            outcomes.extend(batch)
            if len(batch) < FIRING_BATCH:
                break
        return schedules.FiringRound(outcomes, await self._next_fire_at())

    def _fire_due_rows(self, rows: Rows) -> list[schedules.FiringOutcome]:
        now = rows.now()
        outcomes = []
        for schedule in rows.due_schedules(now, FIRING_BATCH):
            previous = schedule.last_job_id
            running = (
                schedule.overlap is schedules.OverlapPolicy.SKIP
                and previous is not None
                and rows.job_status(previous) in sm.LIVE_STATUSES
            )
            firing = schedules.plan_firing(schedule, now, running)
            job_id = (
                None if firing.fire_at is None else self._enqueue_firing(rows, schedule, firing.fire_at).id
            )
            rows.store_schedule(schedules.after_firing(schedule, firing, job_id, now))
            outcomes.append(schedules.outcome(schedule, firing, job_id))
        return outcomes

    # ----- retention -----------------------------------------------------------------------

    async def delete_expired(self, finished_before: datetime, limit: int) -> int:
        def op(rows: Rows) -> int:
            doomed = rows.expired_job_ids(finished_before, limit)
            return rows.delete_jobs(doomed) if doomed else 0

        return await self._sweep(op)

    async def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        return await self._sweep(lambda rows: rows.forget_request_ids(created_before, limit))

    # ----- administration, across every owner ----------------------------------------------

    async def bulk_cancel(
        self, job_filter: AdminFilter, below: int | None, limit: int, grace_seconds: float, dry_run: bool
    ) -> BulkBatch:
        if dry_run:
            return _bulk_batch(await self._bulk_preview(job_filter, below, limit, unretried=False), [])

        def op(rows: Rows) -> BulkBatch:
            now = rows.now()
            batch = rows.bulk_batch(job_filter, below, limit, unretried=False, lock=True)
            chosen: dict[sm.Transition, list[Columns]] = {}
            for row in batch:
                transition = sm.owner_cancel(JobStatus(row["status"]), row["cancel_requested_at"] is not None)
                if transition is not None:
                    chosen.setdefault(transition, []).append(row)
            inputs = sm.Inputs(now=now, grace_until=now + timedelta(seconds=grace_seconds))
            changed: list[Job] = []
            for transition, members in chosen.items():
                done = rows.transition_batch(transition, members, inputs)
                self._written(rows, transition, done, now)
                changed.extend(sm.job_of(row) for row in done)
            return _bulk_batch(batch, changed)

        return await self._sweep(op)

    async def bulk_retry(
        self, job_filter: AdminFilter, below: int | None, limit: int, dry_run: bool
    ) -> BulkBatch:
        if dry_run:
            return _bulk_batch(await self._bulk_preview(job_filter, below, limit, unretried=True), [])

        def op(rows: Rows) -> BulkBatch:
            now = rows.now()
            sources = rows.bulk_batch(job_filter, below, limit, unretried=True, lock=True)
            # Asked again now that the sources are locked: on PostgreSQL a
            # concurrent BulkRetry that held them has committed its retries,
            # which the locked read's snapshot predates.
            retried = rows.retried_among([source["id"] for source in sources]) if sources else set()
            new = [
                sm.queued_row({"id": ids.new_job_id(), **sm.retry_values(source)}, now)
                for source in sources
                if sm.can_retry(JobStatus(source["status"])) and source["id"] not in retried
            ]
            if new:
                rows.insert_jobs(new)
                rows.insert_events([event for row in new for event in _enqueue_events(row["id"], now)])
                rows.announce_work()
            # What it retried, not what it walked past.
            return _bulk_batch(sources, [sm.job_of(row) for row in new], matched=len(new))

        return await self._sweep(op)

    async def set_kind_paused(self, kind: str, paused: bool) -> bool:
        def op(rows: Rows) -> bool:
            if paused:
                rows.pause_kind(kind, rows.now())
            elif rows.resume_kind(kind):
                # Its queued jobs are claimable again: waiting claimers, here and
                # on every replica, look now.
                rows.announce_work()
            return paused

        return await self._write(op)

    # ----- claims ----------------------------------------------------------------------------

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        self._watch_other_writers()
        result, started = await self._write(self._claim_op(worker_id, limit, lease_seconds, kinds))
        # Only a committed claim moves the mark, so a rolled-back re-anchor is
        # redone. After a re-anchor nothing is stamped later than `started`.
        self._claim_clock_high_water = started
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
        # The claim rides in the next write that makes work claimable: its
        # unit of work, its commit.
        self._watch_other_writers()
        waiting = self._write_on_next_work(self._claim_op(worker_id, limit, lease_seconds, kinds))
        try:
            outcome = await first_of(waiting.result(), give_up, timeout)
        except asyncio.CancelledError:
            # Nobody will run what a write may already have claimed: give it back.
            late = await asyncio.shield(waiting.withdraw())
            if late is not None:
                await asyncio.shield(self._hand_back(late[0]))
            raise
        if outcome is None:
            # A write may have made it while the wait was being given up: its
            # jobs are leased, so they are this caller's.
            outcome = await waiting.withdraw()
        if outcome is None:
            return None
        result, started = outcome
        self._claim_clock_high_water = started
        return result

    async def _hand_back(self, result: ClaimResult) -> None:
        await asyncio.gather(
            *(self.release(claimed.lease) for claimed in result.jobs), return_exceptions=True
        )

    def _claim_op(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter
    ) -> Callable[[Rows], tuple[ClaimResult, datetime]]:
        high_water = self._claim_clock_high_water

        def op(rows: Rows) -> tuple[ClaimResult, datetime]:
            if self._steering.has_limits:
                # Before the time is read: a claim that waited for another to
                # commit counts leases, and stamps its starts, from after that.
                rows.lock_claims()
            now = rows.now()
            if high_water is None or now < high_water:
                # First claim of this process (perhaps after a snapshot restore), or
                # the wall clock went back since the last one: only then can queued
                # jobs carry stamps from the future. Checking walks every job in
                # backoff, so it stays off the hot path otherwise.
                rows.reanchor_after_clock_step(now)
            view = rows.queue_view(kinds, now)
            if self._steering.has_limits:
                # Counted first, so the starts are stamped (from `counted_at`)
                # close to when their slots were seen free. A job this claim's
                # recovery ends past its deadline still counts: this claim is
                # cautious, the next one sees the slot.
                view.running()
            expired = self._recover_rows(rows, now)
            claimed, rate_wakeup, started = self._lease_due(rows, view, worker_id, limit, lease_seconds, now)
            # A claim that filled its limit is made again at once: no wake-up to find.
            later = None if len(claimed) == limit else rows.next_wakeup(kinds, now)
            result = ClaimResult(
                jobs=claimed,
                next_wakeup_at=min((m for m in (later, rate_wakeup) if m is not None), default=None),
                recovered=expired,
            )
            return result, started

        return op

    def _lease_due(
        self,
        rows: Rows,
        view: Any,
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
        tokens = rows.bucket_tokens(rules.kind_rates, now)
        choice = steering.choose(view, rules, limit, self._fair_share_cursor, tokens)
        self._fair_share_cursor = choice.cursor
        rows.spend_tokens(tokens, choice.rate_spent, now)
        rate_wakeup = steering.rate_wakeup(tokens, choice.rate_spent, rules.kind_rates, now)
        if not choice.job_ids:
            return [], rate_wakeup, now
        # Starts dealt from running counts are stamped after the counts were
        # read. An attempt another process ended is stamped before its commit,
        # so one this claim saw ended carries an earlier time than the starts
        # that took its slot: the event log never shows more running than a
        # limit allowed.
        counted_at = view.counted_at
        started = now if counted_at is None else max(now, counted_at)
        # One token for the whole claim: fencing is per (job id, token), and every
        # claim draws a fresh one, so no other attempt of these jobs can hold it.
        token = ids.new_lease_token()
        expires_at = started + timedelta(seconds=lease_seconds)
        inputs = sm.Inputs(now=started, worker=worker_id, token=token, expires_at=expires_at)
        changed = rows.transition_chosen(sm.CLAIM, choice.job_ids, inputs)
        self._written(rows, sm.CLAIM, changed, started)
        # The rows come back in no order: put them back in the order they were dealt in.
        dealt = {job_id: place for place, job_id in enumerate(choice.job_ids)}
        changed.sort(key=lambda row: dealt[row["id"]])
        claimed = [
            ClaimedJob(
                job=sm.job_of(row),
                payload=row["payload"],
                lease=Lease(job_id=row["id"], token=token, attempt=row["attempt"]),
                lease_expires_at=expires_at,
                checkpoint=row["checkpoint"],
            )
            for row in changed
        ]
        return claimed, rate_wakeup, started

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        return await self._write(lambda rows: self._recover_rows(rows, rows.now()))

    def _recover_rows(self, rows: Rows, now: datetime) -> list[RecoveredJob]:
        """Expired leases first: an attempt whose worker stopped heartbeating
        ended because the worker went away, whatever deadline it also passed;
        what is left overdue still has a live worker, which must be stopped."""
        recovered: list[RecoveredJob] = []
        for transition, lease_expired in ((sm.RECOVER_EXPIRED_LEASE, True), (sm.END_OVERDUE, False)):
            changed = rows.transition_found(transition, sm.Inputs(now=now, jitter=self._jitter()))
            self._written(rows, transition, changed, now)
            recovered.extend(
                RecoveredJob(row["id"], row["kind"], JobStatus(row["status"]), lease_expired=lease_expired)
                for row in changed
            )
        return recovered

    # ----- serving a worker's lease -------------------------------------------------------

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        return (await self._write_many(self._renewals(lease_seconds), lease)).expires_at

    async def heartbeat(self, leases: list[Lease], lease_seconds: float) -> list[LeaseRenewal | None]:
        # Each lease joins the current batch of renewals: however many workers
        # heartbeat at once, a batch is one statement.
        renewals = self._renewals(lease_seconds)
        answers = await asyncio.gather(
            *(self._write_many(renewals, lease) for lease in leases), return_exceptions=True
        )
        for answer in answers:
            if isinstance(answer, BaseException) and not isinstance(answer, LeaseLost):
                raise answer
        return [answer if isinstance(answer, LeaseRenewal) else None for answer in answers]

    def _renewals(self, lease_seconds: float) -> Many[Lease, LeaseRenewal]:
        # Heartbeats of jobs claimed together fall due together: one statement
        # renews every lease of the same length whose heartbeat reached a batch.
        return Many(f"renew:{lease_seconds!r}", functools.partial(self._renew_rows, lease_seconds))

    def _renew_rows(
        self, lease_seconds: float, rows: Rows, leases: list[Lease]
    ) -> list[LeaseRenewal | Exception]:
        now = rows.now()
        expires_at = now + timedelta(seconds=lease_seconds)
        inputs = sm.Inputs(now=now, expires_at=expires_at)
        answers: dict[int, LeaseRenewal | Exception] = {}
        for this_round in _rounds(leases, lambda lease: lease.job_id):
            batch = [lease for _, lease in this_round.values()]
            changed = rows.transition_leases(sm.HEARTBEAT, batch, inputs, brief=True)
            renewed = {row["id"]: row["cancel_requested_at"] is not None for row in changed}
            for job_id, (index, _) in this_round.items():
                answers[index] = (
                    LeaseRenewal(expires_at, renewed[job_id]) if job_id in renewed else LeaseLost(job_id)
                )
        return [answers[index] for index in range(len(leases))]

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        def op(rows: Rows) -> LeaseRenewal:
            now = rows.now()
            expires_at = now + timedelta(seconds=lease_seconds)
            inputs = sm.Inputs(now=now, expires_at=expires_at, checkpoint=checkpoint)
            changed = rows.transition_leases(sm.CHECKPOINT, [lease], inputs, brief=True)
            if not changed:
                raise LeaseLost(lease.job_id)
            return LeaseRenewal(expires_at, changed[0]["cancel_requested_at"] is not None)

        return await self._write(op)

    async def succeed(self, lease: Lease, result: JsonObject | None = None, remember: bool = False) -> Job:
        if result is None and not remember:
            # The common case, and the same statement for every lease: successes
            # that queue together are one UPDATE.
            return await self._write_many(self._successes, lease)
        return await self._finish(sm.SUCCEED, lease, lambda now: sm.Inputs(now=now, result=result), remember)

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        """`succeed`, answering only the status the job ended in (SUCCEEDED, or
        CANCELLED when a cancel request won): what the runtime needs, without
        reading back and building the whole job."""
        if result is None:
            return await self._write_many(self._brief_successes, lease)
        return (await self.succeed(lease, result)).status

    def _succeed_rows(self, rows: Rows, leases: list[Lease]) -> list[Job | Exception]:
        return self._succeed_leases(rows, leases, brief=False, answer=sm.job_of)

    def _succeed_status_rows(self, rows: Rows, leases: list[Lease]) -> list[JobStatus | Exception]:
        return self._succeed_leases(rows, leases, brief=True, answer=lambda row: JobStatus(row["status"]))

    def _succeed_leases(
        self, rows: Rows, leases: list[Lease], brief: bool, answer: Callable[[Columns], T]
    ) -> list[T | Exception]:
        answers: dict[int, T | Exception] = {}
        for this_round in _rounds(leases, lambda lease: lease.job_id):
            now = rows.now()
            batch = [lease for _, lease in this_round.values()]
            changed = rows.transition_leases(sm.SUCCEED, batch, sm.Inputs(now=now), brief=brief)
            self._written(rows, sm.SUCCEED, changed, now)
            done = {row["id"]: answer(row) for row in changed}
            for job_id, (index, _) in this_round.items():
                found = done.get(job_id)
                answers[index] = LeaseLost(job_id) if found is None else found
        return [answers[index] for index in range(len(leases))]

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
                retry_at=sm.requested_retry_at(now, retry_after_seconds),
            )

        return await self._finish(sm.FAIL, lease, inputs, remember)

    async def snooze(self, lease: Lease, delay_seconds: float, remember: bool = False) -> Job:
        def inputs(now: datetime) -> sm.Inputs:
            return sm.Inputs(now=now, retry_at=now + timedelta(seconds=delay_seconds))

        return await self._finish(sm.SNOOZE, lease, inputs, remember)

    async def release(self, lease: Lease) -> Job:
        """Give the attempt back unfinished (the worker is shutting down): the job is
        claimable again at once, and the interrupted attempt does not count."""
        return await self._finish(sm.RELEASE, lease, lambda now: sm.Inputs(now=now))

    async def mark_cancelled(self, lease: Lease, remember: bool = False) -> Job:
        return await self._finish(sm.CONFIRM_CANCEL, lease, lambda now: sm.Inputs(now=now), remember)

    async def _finish(
        self,
        transition: sm.Transition,
        lease: Lease,
        inputs: Callable[[datetime], sm.Inputs],
        remember: bool = False,
    ) -> Job:
        """One fenced transition of the attempt `lease` holds, with its events
        (and, to `remember` it, the write's record in the same unit of work)."""

        def op(rows: Rows) -> Job:
            now = rows.now()
            changed = rows.transition_leases(transition, [lease], inputs(now))
            if not changed:
                raise LeaseLost(lease.job_id)
            self._written(rows, transition, changed, now)
            job = sm.job_of(changed[0])
            if remember:
                rows.keep_worker_write(worker_writes.finished(lease, transition, job, now))
            return job

        return await self._write(op)

    async def append_event(
        self, lease: Lease, event_type: str, payload: JsonObject, request_id: str | None = None
    ) -> JobEvent:
        append = _Append(lease, event_type, payload)
        if request_id is None:
            # Jobs that report progress together append together: every event of a
            # batch takes its sequence in one UPDATE and goes in with one INSERT.
            return await self._write_many(self._appends, append)

        def op(rows: Rows) -> JobEvent:
            stored = rows.worker_write(lease, request_id)
            if stored is not None:
                return worker_writes.replay_append(stored, request_id, event_type, payload)
            (answer,) = self._append_rows(rows, [append])
            if isinstance(answer, Exception):
                raise answer
            rows.keep_worker_write(worker_writes.appended(lease, request_id, answer))
            return answer

        return await self._write(op)

    def _append_rows(self, rows: Rows, appends: list[_Append]) -> list[JobEvent | Exception]:
        now = rows.now()
        answers: dict[int, JobEvent | Exception] = {}
        events: list[JobEvent] = []
        for this_round in _rounds(appends, lambda append: append.lease.job_id):
            leases = [append.lease for _, append in this_round.values()]
            taken = rows.take_event_sequences(leases, self._max_events, now)
            missed = [lease for lease in leases if (lease.job_id, lease.token) not in taken]
            # No sequence for a lease that holds its job: its log is full.
            full = rows.held_leases(missed, now) if missed and self._max_events is not None else set()
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
                event = JobEvent(lease.job_id, sequence, append.event_type, append.payload, now)
                events.append(event)
                answers[index] = event
        if events:
            rows.insert_events(events)
        return [answers[index] for index in range(len(appends))]
