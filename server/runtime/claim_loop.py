"""The claim loop: keep every execution slot busy, sleep only when there is
nothing to do, and wake on new work instead of polling for it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from dataclasses import dataclass

import structlog

from leasehold._server.clock import Clock
from leasehold._server.defaults import DEFAULT_CONCURRENCY
from leasehold._server.jobs.errors import StorageFull, StorageUnavailable
from leasehold._server.jobs.records import ClaimedJob, ClaimResult
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import NO_PATTERNS, KindFilter, KindPatterns
from leasehold._server.runtime.asyncio_helpers import cancel_and_wait
from leasehold._server.runtime.executor import AttemptExecutor
from leasehold._server.runtime.registry import HandlerRegistry
from leasehold._server.runtime.rescuer import log_lease_expired

log = structlog.get_logger("leasehold.runtime")

MIN_LEASE_SECONDS = 6.0
MIN_POLL_SECONDS = 0.05
MAX_LEASE_SECONDS = 86_400.0
MAX_POLL_SECONDS = 3_600.0
MIN_RESCUE_SECONDS = 0.05
# How long stop() lets a claim already in flight finish before cancelling it.
CLAIMER_STOP_SECONDS = 5.0


@dataclass(frozen=True)
class RuntimeSettings:
    concurrency: int = DEFAULT_CONCURRENCY
    lease_seconds: float = 30.0
    # A safety net only: wake-ups come from commits. It also bounds how late a
    # job enqueued by another process sharing the database is noticed.
    poll_seconds: float = 1.0
    # How often the rescuer recovers expired leases, apart from claims; None
    # means a quarter of the lease (see `rescue_interval`).
    rescue_seconds: float | None = None

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError("concurrency: must be at least 1")
        if not MIN_LEASE_SECONDS <= self.lease_seconds <= MAX_LEASE_SECONDS:  # also refuses NaN
            raise ValueError(
                f"lease_seconds: must be between {MIN_LEASE_SECONDS:g} and {MAX_LEASE_SECONDS:g}"
            )
        if not MIN_POLL_SECONDS <= self.poll_seconds <= MAX_POLL_SECONDS:
            raise ValueError(f"poll_seconds: must be between {MIN_POLL_SECONDS:g} and {MAX_POLL_SECONDS:g}")
        # Longer than the lease makes no sense: an expired job would wait longer
        # for its rescue than the lease it outlived.
        rescue, lease, least = self.rescue_seconds, self.lease_seconds, MIN_RESCUE_SECONDS
        if rescue is not None and not least <= rescue <= lease:  # also refuses NaN
            raise ValueError(f"rescue_seconds: must be between {least:g} and the lease ({lease:g})")

    @property
    def rescue_interval(self) -> float:
        """The rescuer's period: a quarter of the lease unless set, so an expired
        lease waits at most that long for its rescue on a replica that is busy."""
        return self.lease_seconds / 4 if self.rescue_seconds is None else self.rescue_seconds


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Runtime:
    def __init__(
        self,
        repository: JobRepository,
        registry: HandlerRegistry,
        clock: Clock,
        settings: RuntimeSettings | None = None,
        worker_id: str | None = None,
        remote_kinds: KindPatterns = NO_PATTERNS,
    ) -> None:
        self._repository = repository
        # Remote workers' kinds are never run here; every other kind is, even one
        # no handler serves any more (its attempt then fails, saying so).
        self._kinds = KindFilter(excluding=remote_kinds)
        self._registry = registry
        self._clock = clock
        self._settings = settings or RuntimeSettings()
        self.worker_id = worker_id or default_worker_id()
        # A thread per slot at most: sync handlers never wait for a thread.
        self._executor = AttemptExecutor(
            repository,
            registry,
            self._settings.lease_seconds,
            clock=clock,
            max_threads=self._settings.concurrency,
        )
        self._claimer: asyncio.Task[None] | None = None
        # Attempts until their outcome is written; `_busy_slots` counts those
        # whose handler still runs, which is what a slot holds.
        self._running: set[asyncio.Task[None]] = set()
        self._busy_slots = 0
        self._wake = asyncio.Event()
        self._stopping = False

    @property
    def active_jobs(self) -> int:
        return len(self._running)

    async def start(self) -> None:
        """Start claiming. Calling it again while running does nothing."""
        if self._claimer is not None and not self._claimer.done():
            return
        self._claimer = asyncio.create_task(self._claim_loop(), name="leasehold-claimer")

    @property
    def attempts(self) -> frozenset[asyncio.Task[None]]:
        """The attempts now running, each done once its outcome is written: what
        a drain waits on."""
        return frozenset(self._running)

    async def stop_claiming(self) -> None:
        """Claim nothing more; attempts already running go on."""
        claimer, self._claimer = self._claimer, None
        if claimer is not None:
            # Let a claim in flight commit and start its jobs, so every leased job
            # has a handler that can hand it back, rather than a lease nobody holds.
            self._stopping = True
            self._wake.set()
            done, _ = await asyncio.wait({claimer}, timeout=CLAIMER_STOP_SECONDS)
            if not done:
                await cancel_and_wait(claimer)
            self._stopping = False

    async def stop(self, grace_seconds: float = 0.0) -> None:
        """Stop claiming, give running handlers `grace_seconds` to finish, then cancel
        them. A cancelled attempt is handed back (queued again at once, not counted);
        if even that cannot be written, its lease expires and the next claim
        recovers it, which is what at-least-once promises."""
        await self.stop_claiming()
        if self._running and grace_seconds > 0:
            await asyncio.wait(self._running, timeout=grace_seconds)
        for task in list(self._running):
            task.cancel()
        if self._running:
            await asyncio.gather(*self._running, return_exceptions=True)

    async def _claim_loop(self) -> None:
        # One signal for every reason to look again: new work committed, or a
        # slot freed.
        with self._repository.changes.watch_work(self._wake):
            while not self._stopping:
                delay = await self._claim_free_slots()
                if delay <= 0 or self._stopping:
                    continue
                if self._free_slots() > 0:
                    # Idle slots: the next write of this process that makes work
                    # claims for them in its own commit, so a job enqueued now
                    # starts one commit after its Enqueue, not two. Anything else
                    # that wakes the loop (another process's work, a freed slot,
                    # the delay) gives the wait up for a claim of its own.
                    await self._claim_with_next_work(delay)
                    continue
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a
                # cancel that arrives as the wake-up fires, and stop() would hang.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(delay):
                        await self._wake.wait()

    def _free_slots(self) -> int:
        return self._settings.concurrency - self._busy_slots

    async def _claim_free_slots(self) -> float:
        """Claim for every free slot; returns how long to wait before looking again."""
        poll = self._settings.poll_seconds
        # Clear before looking: a slot freed or a commit made after this point
        # sets it again, so no wake-up can fall between the claim and the wait.
        self._wake.clear()
        if self._stopping:
            return 0.0
        free = self._free_slots()
        if free <= 0:
            return poll
        try:
            result = await self._repository.claim(
                self.worker_id, free, self._settings.lease_seconds, self._kinds
            )
        except (StorageUnavailable, StorageFull) as exc:
            log.warning("runtime.claim_failed", error=str(exc))
            return poll
        except Exception as exc:  # keep the claimer alive; the next poll tries again
            log.error("runtime.claim_failed", error_class=type(exc).__name__, exc_info=exc)
            return poll
        self._start(result)
        if len(result.jobs) == free:
            return 0.0  # every slot got a job; there may be more waiting
        if result.next_wakeup_at is None:
            return poll
        until_due = (result.next_wakeup_at - self._clock.now()).total_seconds()
        return max(0.0, min(poll, until_due))

    async def _claim_with_next_work(self, timeout: float) -> None:
        try:
            result = await self._repository.claim_with_next_work(
                self.worker_id,
                self._free_slots(),
                self._settings.lease_seconds,
                self._kinds,
                self._wake,
                timeout,
            )
        except (StorageUnavailable, StorageFull) as exc:
            log.warning("runtime.claim_failed", error=str(exc))
            return
        except Exception as exc:  # keep the claimer alive; the next poll tries again
            log.error("runtime.claim_failed", error_class=type(exc).__name__, exc_info=exc)
            return
        if result is not None:
            self._start(result)

    def _start(self, result: ClaimResult) -> None:
        log_lease_expired(result.expired_job_ids)
        for claimed in result.jobs:
            self._busy_slots += 1
            task = asyncio.create_task(self._attempt(claimed), name=f"leasehold-attempt-{claimed.job.id}")
            self._running.add(task)
            task.add_done_callback(self._attempt_ended)

    async def _attempt(self, claimed: ClaimedJob) -> None:
        """One attempt in its slot. The slot is free as soon as the handler has
        stopped, before the outcome is written: the claim for it is then queued
        beside the outcome and the two share one commit, where freeing it after
        the outcome's commit would cost every job a commit of its own claim."""
        freed = False

        def free_slot() -> None:
            nonlocal freed
            if not freed:
                freed = True
                self._busy_slots -= 1
                self._wake.set()

        try:
            await self._executor.execute(claimed, free_slot)
        finally:
            free_slot()

    def _attempt_ended(self, task: asyncio.Task[None]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("runtime.attempt_crashed", error=repr(task.exception()))
