"""The storage seam: every engine implements `JobRepository`.

User-facing methods take the owner and must filter by it in the query itself, so a
job of another owner is indistinguishable from a missing one. Worker-facing methods
take a `Lease` and must succeed only while that lease still owns a running,
unexpired attempt (one fenced statement; zero rows means `LeaseLost`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from datetime import datetime
from typing import Protocol

from leasehold._server.jobs.admin import AdminFilter, BulkBatch, LeaseHolder, QueueStats
from leasehold._server.jobs.idempotency import KeyedAnswer, RequestKey
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.owner_limits import OwnedField
from leasehold._server.jobs.owner_stats import OwnerStats
from leasehold._server.jobs.records import (
    ClaimResult,
    FeedHead,
    FeedPage,
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
from leasehold._server.jobs.schedules import FiringRound, NewSchedule, Schedule, SchedulePage
from leasehold._server.jobs.state_machine import DEFAULT_CANCEL_GRACE_SECONDS
from leasehold._server.jobs.steering import Occupancy, Steering
from leasehold._server.jobs.worker_writes import WorkerWrite


class JobRepository(Protocol):
    @property
    def changes(self) -> ChangeHub:
        """Where committed changes are announced (new claimable work, new events)."""
        ...

    async def close(self) -> None: ...

    # ----- serving an owner -------------------------------------------------------

    async def enqueue(self, new_job: NewJob) -> tuple[Job, bool]:
        """Create a queued job; with a resource id, return the resource's latest job
        instead (created = False) when a root job for it already exists."""
        ...

    async def enqueue_batch(self, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        """`enqueue` for each of `new_jobs`, in one transaction: every job is
        created or none is, so a failed batch can simply be sent again. Answers
        come in the order of `new_jobs`. Each item is deduplicated as `enqueue`
        would, against the stored jobs and against the items before it: a
        resource named twice in one batch gets one job, and its second answer is
        that job with created = False."""
        ...

    async def enqueue_once(self, new_jobs: Sequence[NewJob], key: RequestKey) -> KeyedAnswer:
        """`enqueue_batch` under a request id (`idempotency`): the first call with
        `key` acts and records its answer in the same transaction; a repeat is
        answered from that record and writes nothing. Of two calls at once with
        one key, one acts and the other is its repeat. RequestIdReused when the
        key came with another request; RequestResultDeleted when its jobs are gone."""
        ...

    async def get(self, owner_id: str, job_id: str) -> Job: ...

    async def list_jobs(
        self,
        owner_id: str,
        job_filter: JobFilter,
        page_size: int,
        after: PageCursor | None,
    ) -> JobPage: ...

    async def owner_stats(self, owner_id: str) -> OwnerStats:
        """How many of the owner's jobs stand in each status, in all and per
        kind (`owner_stats.assemble`): every job the owner has, counted from an
        index over the owner's own jobs, never a walk of everyone's."""
        ...

    async def cancel(
        self, owner_id: str, job_id: str, grace_seconds: float = DEFAULT_CANCEL_GRACE_SECONDS
    ) -> Job:
        """Cancel a queued job now; ask a running one to stop, and end it
        cancelled if it still runs `grace_seconds` later (its deadline)."""
        ...

    async def retry(self, owner_id: str, job_id: str) -> Job: ...

    async def retry_once(self, owner_id: str, job_id: str, key: RequestKey) -> KeyedAnswer:
        """`retry` under a request id, as `enqueue_once`: one new job however
        often the key is sent (its answer: that job, created = True)."""
        ...

    async def list_events(
        self, owner_id: str, job_id: str, after_sequence: int, limit: int
    ) -> list[JobEvent]:
        """Events with sequence > after_sequence, oldest first; raises JobNotFound."""
        ...

    async def read_feed(self, owner_id: str, after_position: int, limit: int) -> FeedPage:
        """Up to `limit` events of the owner's feed with positions above
        `after_position`, in position order, with retention's mark read at the
        same moment."""
        ...

    async def feed_head(self, owner_id: str) -> FeedHead:
        """Where the owner's feed stands now (0 and 0 for an owner without events)."""
        ...

    # ----- what an owner has, for the per-owner limits (`owner_limits`) -----------

    async def known_values(self, owner_id: str, owned: OwnedField, among: Sequence[str]) -> frozenset[str]:
        """Which of `among` (at most a batch's worth) the owner's jobs already
        have as their kind or resource type: an index probe per value."""
        ...

    async def count_distinct(self, owner_id: str, owned: OwnedField, up_to: int) -> int:
        """How many distinct kinds or (non-empty) resource types the owner's
        jobs have, counted up to `up_to` and no further: an index skip scan
        that stops there, however many jobs the owner has."""
        ...

    async def count_schedules(self, owner_id: str, up_to: int) -> int:
        """How many schedules the owner has, counted up to `up_to`."""
        ...

    @property
    def steering(self) -> Steering:
        """The claim order's limits and weights this repository claims by."""
        ...

    async def occupancy(self, owner_id: str, kind: str) -> Occupancy:
        """Live leases of `kind` and of the owner (every kind), and what the
        kind's rate bucket holds now: what `steering.wait_reason` weighs."""
        ...

    async def queued_by_kind(self) -> list[QueuedKind]:
        """Per kind, the queued jobs whose time has come and the oldest one's due
        time, across every owner and every process: the queue as the database
        holds it, for the metrics. Only kinds with such jobs appear. Read through
        an index of queued jobs, never a walk of every job ever kept."""
        ...

    # ----- administration (AdminService, DESIGN §14), across every owner ------------

    async def queue_stats(self) -> QueueStats:
        """The queue at a glance (`admin.QueueStats`), from index ranges bounded by
        the live queue and the last hour, never a walk of every job kept."""
        ...

    async def list_all_jobs(
        self, job_filter: AdminFilter, page_size: int, after: PageCursor | None
    ) -> JobPage:
        """Jobs of any owner (or of `job_filter.owner_id`), newest first."""
        ...

    async def bulk_cancel(
        self, job_filter: AdminFilter, below: int | None, limit: int, grace_seconds: float, dry_run: bool
    ) -> BulkBatch:
        """One batch of a bulk cancel (`admin.walk`): up to `limit` matching jobs
        below `below`, newest first, each cancelled as `cancel` would, in one
        short transaction; with `dry_run` only counted."""
        ...

    async def bulk_retry(
        self, job_filter: AdminFilter, below: int | None, limit: int, dry_run: bool
    ) -> BulkBatch:
        """One batch of a bulk retry: up to `limit` matching finished jobs that
        have no retry yet, below `below`, newest first, each retried as `retry`
        would (a new queued job), in one short transaction; with `dry_run` only
        counted."""
        ...

    async def lease_holders(
        self, remote_kinds: KindPatterns, worker_ids: Collection[str]
    ) -> list[LeaseHolder]:
        """The workers holding live leases of running jobs (on every process),
        ordered by worker id, counting only jobs whose kind `remote_kinds`
        matches or whose worker is one of `worker_ids`: remote workers, never
        an in-process runtime. Read from the running jobs' index range."""
        ...

    async def newest_position(self) -> int:
        """A place in the insertion order above every job stored now: a bulk
        action walks below it, so jobs made after it began (its own retries
        among them) are never part of it."""
        ...

    async def set_kind_paused(self, kind: str, paused: bool) -> bool:
        """Pause (claims on every process skip the kind) or resume it; doing
        again what is already so changes nothing. Returns `paused`."""
        ...

    # ----- schedules (DESIGN §12), owner-scoped like jobs -------------------------

    async def create_schedule(self, new_schedule: NewSchedule) -> Schedule:
        """Store a schedule; ScheduleExists when the owner has one of that id."""
        ...

    async def get_schedule(self, owner_id: str, schedule_id: str) -> Schedule:
        """The owner's schedule; ScheduleNotFound for an unknown id and for
        another owner's alike."""
        ...

    async def list_schedules(self, owner_id: str, page_size: int, after: str | None) -> SchedulePage:
        """The owner's schedules ordered by schedule_id, those after `after`."""
        ...

    async def set_schedule_paused(self, owner_id: str, schedule_id: str, paused: bool) -> Schedule:
        """Pause (no next firing), or resume from the next fire time after now."""
        ...

    async def delete_schedule(self, owner_id: str, schedule_id: str) -> None:
        """Remove the schedule; the jobs it made stay."""
        ...

    async def trigger_schedule(self, owner_id: str, schedule_id: str) -> tuple[Schedule, Job]:
        """One firing now, whatever the schedule's pause and overlap say; its
        next fire time is unchanged."""
        ...

    async def fire_due_schedules(self) -> FiringRound:
        """Fire every schedule whose next fire time has come (`schedules.plan_firing`),
        each firing's job in the transaction that moves its schedule on; returns
        what each decision did and the earliest next fire time left. Safe from every process at once: a
        firing enqueues one job, however many ask."""
        ...

    # ----- retention ----------------------------------------------------------------

    async def delete_expired(self, finished_before: datetime, limit: int) -> int:
        """Delete up to `limit` terminal jobs that completed before
        `finished_before`, with their events, in one transaction; returns how
        many. A job with a resource key goes only together with every other job
        of its key, once all of them have expired. Queued and running jobs are
        never deleted."""
        ...

    async def forget_request_ids(self, created_before: datetime, limit: int) -> int:
        """Delete the `limit` oldest request id records made before
        `created_before` (and any made at the same instant as the last of them)
        in one transaction; returns how many. Their jobs stay."""
        ...

    # ----- serving a worker --------------------------------------------------------

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        """End overdue attempts and recover expired leases, then lease up to
        `limit` available jobs of the kinds `kinds` admits, in one transaction."""
        ...

    async def claim_with_next_work(
        self,
        worker_id: str,
        limit: int,
        lease_seconds: float,
        kinds: KindFilter,
        give_up: asyncio.Event,
        timeout: float,
    ) -> ClaimResult | None:
        """`claim`, made by the next write of this process that makes work
        claimable (an enqueue, a retry coming back, a lease handed back), in that
        write's own transaction, so a job enqueued while a worker is idle starts
        after one commit, not two. None if `give_up` is set or `timeout` seconds
        pass first: nothing was claimed. Work committed by other processes does
        not fulfil it; their notifications wake the caller's own claim instead.
        A caller cancelled while its claim was being made gets nothing, and
        whatever that claim leased is handed back (queued again at once)."""
        ...

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        """End every attempt past its deadline (`state_machine.END_OVERDUE`) and
        recover every expired lease (`state_machine.RECOVER_EXPIRED_LEASE`),
        outside any claim; returns both, expired leases first. Safe to run from
        every process at once: each is recovered once."""
        ...

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        """Extend the lease; returns the new expiry."""
        ...

    async def heartbeat(self, leases: list[Lease], lease_seconds: float) -> list[LeaseRenewal | None]:
        """Extend many leases together (one statement per batch of the storage
        writer); per lease, its renewal, or None when it is lost (expired,
        stale, or past the attempt's deadline)."""
        ...

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        """Keep `checkpoint` (a checked JSON object) as how far the attempt got,
        replacing the one before, and renew the lease as a heartbeat would, in
        one fenced statement (`state_machine.CHECKPOINT`): LeaseLost when the
        lease is lost or past the attempt's deadline, and then nothing is kept.
        The checkpoint outlives the attempt (a retry, a recovered lease, a
        snooze) and reaches the next claim's `ClaimedJob.checkpoint`; a manual
        `retry` makes a job without one."""
        ...

    async def succeed(self, lease: Lease, result: JsonObject | None = None, remember: bool = False) -> Job:
        """Finish the attempt, keeping `result` (a checked JSON object) as what the
        job produced; a pending cancel request wins (the job ends cancelled, with
        no result). With `remember`, the write also stores its record
        (`worker_writes.finished`) in its own transaction, as `fail`, `snooze`
        and `mark_cancelled` do: what a repeat of it is answered from."""
        ...

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        """`succeed`, answering only the status the job ended in (SUCCEEDED, or
        CANCELLED when a cancel request won): all the in-process runtime needs,
        so an engine may skip reading back and building the whole job."""
        ...

    async def fail(
        self,
        lease: Lease,
        error: str,
        retryable: bool = True,
        error_type: str | None = None,
        retry_after_seconds: float | None = None,
        remember: bool = False,
    ) -> Job:
        """Record a failed attempt (its message, and the exception type that raised
        it): back to queued while attempts remain, it is retryable and no cancel
        was requested (after the backoff, or `retry_after_seconds`), otherwise failed."""
        ...

    async def snooze(self, lease: Lease, delay_seconds: float, remember: bool = False) -> Job:
        """Put the job back in the queue for `delay_seconds`, the attempt not
        counted; a pending cancel request ends it cancelled instead."""
        ...

    async def release(self, lease: Lease) -> Job:
        """Hand an unfinished attempt back (the worker is shutting down): queued
        again at once, the interrupted attempt not counted."""
        ...

    async def mark_cancelled(self, lease: Lease, remember: bool = False) -> Job:
        """The handler observed a cancel request and stopped."""
        ...

    async def append_event(
        self, lease: Lease, event_type: str, payload: JsonObject, request_id: str | None = None
    ) -> JobEvent:
        """Add an event to the attempt's job. With a `request_id`, in one
        transaction: a record of this token and request id is answered by
        `worker_writes.replay_append` (nothing is written, even if the lease has
        since gone); otherwise the event is added and its record stored."""
        ...

    async def worker_write(self, lease: Lease, request_key: str) -> WorkerWrite | None:
        """The record `lease`'s token left under `request_key`
        (`worker_writes.FINISH_KEY` for its finishing write), or None. Records
        go with their job (retention)."""
        ...

    async def cancel_requested(self, lease: Lease) -> bool:
        """Whether the attempt should stop; raises LeaseLost if it no longer owns the job."""
        ...
