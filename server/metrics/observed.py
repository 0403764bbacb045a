"""`ObservedRepository`: the one layer that counts what this process did.

Every job write of this process passes through the `JobRepository` protocol
(the runtime, the servicers, the rescuer, the timers), so wrapping it counts
each enqueue, finish, failed attempt, lease recovery, lost-lease refusal and
storage error once, on every engine, without a counter in any engine. Only the
kind and the status are recorded: never an owner, a payload or a result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

from leasehold._server.clock import Clock
from leasehold._server.jobs.admin import AdminFilter, BulkBatch
from leasehold._server.jobs.errors import LeaseLost, StorageClosed, StorageFull, StorageUnavailable
from leasehold._server.jobs.idempotency import KeyedAnswer, RequestKey
from leasehold._server.jobs.notifications import ChangeHub
from leasehold._server.jobs.records import (
    ClaimResult,
    Job,
    JobStatus,
    JsonObject,
    Lease,
    LeaseRenewal,
    NewJob,
    QueuedKind,
    RecoveredJob,
)
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import ANY_KIND, KindFilter
from leasehold._server.jobs.schedules import Schedule
from leasehold._server.jobs.state_machine import DEFAULT_CANCEL_GRACE_SECONDS
from leasehold._server.jobs.steering import Steering
from leasehold._server.metrics.instruments import Metrics

T = TypeVar("T")

# Attempts started here whose end is not seen yet. A remote worker that
# vanishes after another replica recovered its job leaves an entry behind;
# the oldest go first past this many.
MAX_TRACKED_ATTEMPTS = 100_000


class _Attempt(NamedTuple):
    token: str
    started_at: datetime
    kind: str


class ObservedRepository:
    """A `JobRepository` that records its outcomes in `metrics`, then answers
    exactly as `inner` does (same values, same exceptions).

    Only the members whose answers are counted are written out below; every
    other member of the protocol is the inner repository's own, reached through
    `__getattr__` with its storage errors counted, so a member added to the
    protocol is forwarded without being listed here."""

    def __init__(self, inner: JobRepository, metrics: Metrics, clock: Clock) -> None:
        self._inner = inner
        self._metrics = metrics
        self._clock = clock
        # Attempts claimed here and not yet ended, by job id: for the run time,
        # and for the kind a `succeed_status` is counted under.
        self._attempts: dict[str, _Attempt] = {}
        # How many times the queue was read: the scrape cache's tests count it.
        self.queue_reads = 0

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        if name not in PROTOCOL_MEMBERS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        method = getattr(self._inner, name)
        if name in _WORKER_WRITES:

            async def fenced(lease: Lease, *args: Any, **kwargs: Any) -> Any:
                return await self._fenced(lease, method(lease, *args, **kwargs))

            return fenced

        async def observed(*args: Any, **kwargs: Any) -> Any:
            return await self._observe(method(*args, **kwargs))

        return observed

    async def _observe(self, call: Awaitable[T]) -> T:
        try:
            return await call
        except LeaseLost:
            self._metrics.stale_writes_rejected.inc()
            raise
        except StorageClosed:
            raise  # this process is stopping: not the database's fault
        except (StorageUnavailable, StorageFull):
            self._metrics.storage_errors.inc()
            raise

    async def _fenced(self, lease: Lease, call: Awaitable[T]) -> T:
        """A worker write: a lost lease also ends this process's record of it."""
        try:
            return await self._observe(call)
        except LeaseLost:
            self._attempts.pop(lease.job_id, None)
            raise

    # ----- what is counted ----------------------------------------------------------

    def _enqueued(self, job: Job) -> None:
        self._metrics.enqueued(job.kind)

    def _finished(self, kind: str, status: str) -> None:
        self._metrics.finished(kind, status)

    def _claimed(self, result: ClaimResult | None) -> ClaimResult | None:
        if result is None:
            return None
        self._recovered(result.recovered)
        for claimed in result.jobs:
            job = claimed.job
            self._metrics.job_wait.observe(max(0.0, (job.updated_at - job.available_at).total_seconds()))
            if len(self._attempts) >= MAX_TRACKED_ATTEMPTS:
                del self._attempts[next(iter(self._attempts))]
            self._attempts[job.id] = _Attempt(claimed.lease.token, job.updated_at, job.kind)
        return result

    def _recovered(self, recovered: list[RecoveredJob]) -> list[RecoveredJob]:
        for job in recovered:
            self._attempts.pop(job.job_id, None)
            if job.lease_expired:
                self._metrics.lease_recovered(job.kind)
            elif job.status is not JobStatus.CANCELLED:
                # Ended past its timeout while its worker held the lease: a failed
                # attempt, as the executor counts an in-process timeout (past a
                # cancel's grace it ends cancelled, which is no failure).
                self._metrics.attempt_failed(job.kind)
            if job.status.is_terminal:
                self._finished(job.kind, job.status.value)
        return recovered

    def _attempt_ended(self, lease: Lease, job: Job, ran: bool = True) -> Job:
        self._ended(lease, job.kind, job.status, job.updated_at, ran)
        return job

    def _ended(self, lease: Lease, kind: str, status: JobStatus, at: datetime, ran: bool = True) -> None:
        attempt = self._attempts.pop(lease.job_id, None)
        if ran and attempt is not None and attempt.token == lease.token:
            self._metrics.job_run.observe(max(0.0, (at - attempt.started_at).total_seconds()))
        if status.is_terminal:
            self._finished(kind, status.value)

    # ----- the members whose answers are counted ----------------------------------------

    @property
    def changes(self) -> ChangeHub:
        return self._inner.changes

    @property
    def steering(self) -> Steering:
        return self._inner.steering

    async def enqueue(self, new_job: NewJob) -> tuple[Job, bool]:
        job, created = await self._observe(self._inner.enqueue(new_job))
        if created:
            self._enqueued(job)
        return job, created

    async def enqueue_batch(self, new_jobs: Sequence[NewJob]) -> list[tuple[Job, bool]]:
        answers = await self._observe(self._inner.enqueue_batch(new_jobs))
        for job, created in answers:
            if created:
                self._enqueued(job)
        return answers

    async def enqueue_once(self, new_jobs: Sequence[NewJob], key: RequestKey) -> KeyedAnswer:
        answered = await self._observe(self._inner.enqueue_once(new_jobs, key))
        self._enqueued_first(answered)
        return answered

    def _enqueued_first(self, answered: KeyedAnswer) -> None:
        """A repeat answers with the first call's `created` flags; only the first call enqueued."""
        if answered.repeated:
            return
        for job, created in answered.answers:
            if created:
                self._enqueued(job)

    async def cancel(
        self, owner_id: str, job_id: str, grace_seconds: float = DEFAULT_CANCEL_GRACE_SECONDS
    ) -> Job:
        asked_at = self._clock.now()
        job = await self._observe(self._inner.cancel(owner_id, job_id, grace_seconds))
        # A job cancelled before this call comes back unchanged: only one this
        # call ended (a queued job) counts.
        if job.status.is_terminal and job.completed_at is not None and job.completed_at >= asked_at:
            self._finished(job.kind, job.status.value)
        return job

    async def retry(self, owner_id: str, job_id: str) -> Job:
        job = await self._observe(self._inner.retry(owner_id, job_id))
        self._enqueued(job)  # a retry is a new job
        return job

    async def retry_once(self, owner_id: str, job_id: str, key: RequestKey) -> KeyedAnswer:
        answered = await self._observe(self._inner.retry_once(owner_id, job_id, key))
        self._enqueued_first(answered)
        return answered

    async def queued_by_kind(self) -> list[QueuedKind]:
        self.queue_reads += 1
        return await self._observe(self._inner.queued_by_kind())

    async def bulk_cancel(
        self, job_filter: AdminFilter, below: int | None, limit: int, grace_seconds: float, dry_run: bool
    ) -> BulkBatch:
        batch = await self._observe(self._inner.bulk_cancel(job_filter, below, limit, grace_seconds, dry_run))
        for job in batch.changed:  # as `cancel` counts: a queued job it ended
            if job.status.is_terminal:
                self._finished(job.kind, job.status.value)
        return batch

    async def bulk_retry(
        self, job_filter: AdminFilter, below: int | None, limit: int, dry_run: bool
    ) -> BulkBatch:
        batch = await self._observe(self._inner.bulk_retry(job_filter, below, limit, dry_run))
        for job in batch.changed:  # as `retry` counts: each a new job
            self._enqueued(job)
        return batch

    async def trigger_schedule(self, owner_id: str, schedule_id: str) -> tuple[Schedule, Job]:
        schedule, job = await self._observe(self._inner.trigger_schedule(owner_id, schedule_id))
        self._enqueued(job)
        return schedule, job

    # `fire_due_schedules` is forwarded uncounted: a firing's outcome names its
    # job but not its kind, and may be a job another replica enqueued first.

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        result = await self._observe(self._inner.claim(worker_id, limit, lease_seconds, kinds))
        self._claimed(result)
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
        return self._claimed(
            await self._observe(
                self._inner.claim_with_next_work(worker_id, limit, lease_seconds, kinds, give_up, timeout)
            )
        )

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        return self._recovered(await self._observe(self._inner.recover_expired_leases()))

    async def heartbeat(self, leases: list[Lease], lease_seconds: float) -> list[LeaseRenewal | None]:
        renewals = await self._observe(self._inner.heartbeat(leases, lease_seconds))
        for lease, renewal in zip(leases, renewals, strict=True):
            if renewal is None:  # a renewal the fence refused
                self._metrics.stale_writes_rejected.inc()
                self._attempts.pop(lease.job_id, None)
        return renewals

    async def succeed(self, lease: Lease, result: JsonObject | None = None, remember: bool = False) -> Job:
        return self._attempt_ended(
            lease, await self._fenced(lease, self._inner.succeed(lease, result, remember))
        )

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        attempt = self._attempts.get(lease.job_id)
        if attempt is None or attempt.token != lease.token:
            # An attempt not claimed here (or no longer tracked): only the whole
            # job names the kind its end is counted under.
            return (await self.succeed(lease, result)).status
        status = await self._fenced(lease, self._inner.succeed_status(lease, result))
        self._ended(lease, attempt.kind, status, self._clock.now())
        return status

    async def fail(
        self,
        lease: Lease,
        error: str,
        retryable: bool = True,
        error_type: str | None = None,
        retry_after_seconds: float | None = None,
        remember: bool = False,
    ) -> Job:
        job = await self._fenced(
            lease, self._inner.fail(lease, error, retryable, error_type, retry_after_seconds, remember)
        )
        self._metrics.attempt_failed(job.kind)
        return self._attempt_ended(lease, job)

    async def snooze(self, lease: Lease, delay_seconds: float, remember: bool = False) -> Job:
        return self._attempt_ended(
            lease, await self._fenced(lease, self._inner.snooze(lease, delay_seconds, remember))
        )

    async def release(self, lease: Lease) -> Job:
        # Handed back unfinished: not a run.
        return self._attempt_ended(lease, await self._fenced(lease, self._inner.release(lease)), ran=False)

    async def mark_cancelled(self, lease: Lease, remember: bool = False) -> Job:
        return self._attempt_ended(
            lease, await self._fenced(lease, self._inner.mark_cancelled(lease, remember))
        )


# Every member of the protocol; those `ObservedRepository` does not write out
# are forwarded by its `__getattr__`.
PROTOCOL_MEMBERS = frozenset(name for name in vars(JobRepository) if not name.startswith("_"))
# Forwarded worker writes, whose first argument is the attempt's lease.
_WORKER_WRITES = frozenset({"renew", "save_checkpoint", "append_event", "cancel_requested"})
