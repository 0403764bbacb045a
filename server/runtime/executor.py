"""Run one claimed attempt: heartbeat, timeout, classify the outcome, record it.

The handler runs in its own task so that a lost lease can stop it; the final write
is shielded so a shutdown that arrives mid-write still records what happened.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import structlog

from leasehold._server import tracing
from leasehold._server.clock import Clock, SystemClock
from leasehold._server.jobs import limits, state_machine
from leasehold._server.jobs.errors import (
    InvalidArgument,
    JobCancelled,
    LeaseLost,
    PermanentError,
    StorageFull,
    StorageUnavailable,
)
from leasehold._server.jobs.records import ClaimedJob, Job, JobStatus, JsonObject, Lease
from leasehold._server.runtime.asyncio_helpers import (
    DEFAULT_MAX_THREADS,
    LOOP_BLOCKED_SECONDS,
    LoopStallMonitor,
    SyncHandlerThreads,
    cancel_and_wait,
)
from leasehold._server.runtime.attempt_store import AttemptStore
from leasehold._server.runtime.context import JobContext, SyncJobContext
from leasehold._server.runtime.registry import AsyncHandler, HandlerRegistry, SyncHandler
from leasehold._server.runtime.storage_retry import while_lease_holds

log = structlog.get_logger("leasehold.runtime")

# A failed attempt whose kind no handler serves (DESIGN §3 Unknown kind).
UNKNOWN_KIND_ERROR_TYPE = "UnknownKind"
# A handler that returned something other than None or a JSON object.
INVALID_RESULT_ERROR_TYPE = "InvalidResult"
# The least wait between renewals that fail as the lease runs out.
RETRY_FLOOR_SECONDS = 0.01


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended, before it is written.

    A failure carries its error text and type (both recorded on the job) and the
    exception itself, whose traceback goes to the log only."""

    kind: str  # "succeeded" | "cancelled" | "failed" | "lease_lost"
    result: JsonObject | None = None  # what a success produced
    error: str | None = None
    error_type: str | None = None
    retryable: bool = True
    exception: BaseException | None = None


class AttemptExecutor:
    """Runs attempts against any `AttemptStore`: the local repository in-process,
    or WorkerService in `leasehold worker`, so handlers behave the same in both.

    An async handler runs in the attempt's own task (no task of its own: a lost
    lease or the deadline cancels the attempt's task, and the executor tells that
    cancel from a shutdown's by counting its own). A sync handler runs in a worker
    thread of a pool of at most `max_threads`, so the event loop keeps serving
    while it computes; a thread cannot be stopped, so a cancel reaches it only at
    `raise_if_cancelled()`, and after a timeout or a lost lease whatever it still
    does is refused by the lease fence.

    An attempt whose lease has not been renewed by a sixth of what was left of
    it before it expires (the database or the server cannot be reached, say)
    is stopped as a lost lease. Once it expires, the job may be recovered and
    claimed elsewhere; stopping first is what keeps the two attempts from
    running at once. `clock` reads the expiries the store hands out."""

    def __init__(
        self,
        repository: AttemptStore,
        registry: HandlerRegistry,
        lease_seconds: float,
        *,
        clock: Clock | None = None,
        max_threads: int = DEFAULT_MAX_THREADS,
        loop_blocked_seconds: float = LOOP_BLOCKED_SECONDS,
    ) -> None:
        self._repository = repository
        self._registry = registry
        self._lease_seconds = lease_seconds
        self._clock = clock or SystemClock()
        self._threads = SyncHandlerThreads(max_threads)
        self._stalls = LoopStallMonitor(loop_blocked_seconds)

    @property
    def heartbeat_seconds(self) -> float:
        return self._lease_seconds / 3

    def seconds_held(self, expires_at: datetime) -> float:
        """How long an attempt may run on a lease that expires at `expires_at`
        without another renewal: until a sixth of what is left of it (at most
        a sixth of a whole lease) before. The margin covers the claim's own
        latency (the expiry was stamped before this process read it) and a
        handler's moment to stop."""
        left = (expires_at - self._clock.now()).total_seconds()
        return left - min(max(left, 0.0), self._lease_seconds) / 6

    async def execute(self, claimed: ClaimedJob, handler_done: Callable[[], None] | None = None) -> None:
        """Run one attempt to its recorded end. `handler_done` is called once the
        handler has stopped and before its outcome is written: the runtime frees
        the slot there, so the slot's next claim can share the outcome's commit.
        The attempt is one span (`tracing`), the child of the job's traceparent."""
        with tracing.attempt_span(claimed.job) as span:
            await self._execute(claimed, handler_done, span)

    async def _execute(
        self, claimed: ClaimedJob, handler_done: Callable[[], None] | None, span: tracing.AttemptSpan
    ) -> None:
        job = claimed.job
        log.info("job.started", job_id=job.id, kind=job.kind, attempt=job.attempt)
        in_thread = self._registry.is_sync(job.kind)
        task = asyncio.current_task()
        assert task is not None
        watch = _Watch(self, claimed, task)
        self._stalls.attempt_started(job.kind, in_thread)
        try:
            outcome = await self._invoke(claimed, in_thread)
        except asyncio.CancelledError as exc:
            if not watch.absorb_own_cancels():
                # Shutting down: hand the attempt back so the job runs again at once,
                # here after a restart or on another worker, without waiting out the lease.
                await watch.stop()
                span.ended("released")
                await asyncio.shield(self._release(claimed))
                raise
            # The watch stopped the attempt (a lost lease, or its deadline): it
            # ends here, and is recorded as such below.
            outcome = Outcome("lease_lost")
            watch.stopped_with = exc
        finally:
            self._stalls.attempt_ended(job.kind, in_thread)
            await watch.stop()
        watch.absorb_own_cancels()  # a handler that swallowed the watch's cancel
        if watch.reason == "lease_lost":
            outcome = Outcome("lease_lost")
        elif watch.reason == "timeout":
            outcome = watch.timeout_outcome()
        if handler_done is not None:
            handler_done()
        span.ended(outcome.kind, outcome.error_type)
        await asyncio.shield(self._record(claimed, outcome))

    def _context(self, claimed: ClaimedJob) -> JobContext:
        job = claimed.job
        return JobContext(
            job_id=job.id,
            owner_id=job.owner_id,
            kind=job.kind,
            payload=claimed.payload,
            attempt=job.attempt,
            _lease=claimed.lease,
            _repository=self._repository,
            _lease_seconds=self._lease_seconds,
            last_checkpoint=claimed.checkpoint,
            parent_results=claimed.parent_results,
        )

    async def _invoke(self, claimed: ClaimedJob, in_thread: bool) -> Outcome:
        job = claimed.job
        handler = self._registry.handler(job.kind)
        if handler is None:
            return Outcome(
                "failed",
                error=f"no handler is registered for kind {job.kind!r}",
                error_type=UNKNOWN_KIND_ERROR_TYPE,
            )
        if job.cancel_requested_at is not None:
            # Requested before this attempt began (say, during a shutdown that
            # handed the job back): the claim read it, so no query is needed.
            return Outcome("cancelled")
        context = self._context(claimed)
        try:
            if in_thread:
                returned = await self._threads.run(cast(SyncHandler, handler), SyncJobContext.of(context))
                if inspect.isawaitable(returned):
                    return _awaitable_returned(returned)
            else:
                returned = await cast(AsyncHandler, handler)(context)
        except JobCancelled:
            return Outcome("cancelled")
        except LeaseLost:
            return Outcome("lease_lost")
        except PermanentError as exc:
            return _failed(exc, retryable=False)
        except Exception as exc:
            return _failed(exc)
        except asyncio.CancelledError as exc:
            if _this_task_is_cancelled():
                raise  # lease lost, timed out or shutting down
            return _failed(exc)  # the handler's own, e.g. from a future someone cancelled
        return _succeeded(returned)

    async def _heartbeat(self, claimed: ClaimedJob, watch: _Watch) -> None:
        """Renew every third of the lease. A renewal not answered by the time
        the lease as last renewed is nearly out (`_Watch.lease_until`) stops
        the attempt: the database or the server may be out of reach, and once
        the lease expires the job may be recovered and run elsewhere. Until
        then, each try comes no later than halfway to that moment."""
        job = claimed.job
        loop = asyncio.get_running_loop()
        while True:
            try:
                async with asyncio.timeout_at(watch.lease_until):
                    expires_at = await self._repository.renew(claimed.lease, self._lease_seconds)
            except TimeoutError:
                _lease_unrenewed(job, watch)
                return
            except (StorageUnavailable, StorageFull) as exc:
                # The lease may still be valid: try again while it may be.
                log.warning("job.heartbeat_failed", job_id=job.id, error_class=type(exc).__name__)
                if loop.time() >= watch.lease_until:
                    _lease_unrenewed(job, watch)
                    return
            except Exception as exc:
                # LeaseLost, or a failure that leaves the lease in doubt: either way
                # the handler no longer has the right to finish.
                if not isinstance(exc, LeaseLost):
                    log.error("job.heartbeat_failed", job_id=job.id, error_class=type(exc).__name__)
                watch.stop_attempt("lease_lost")
                return
            else:
                watch.renewed(expires_at)
            left = watch.lease_until - loop.time()
            await asyncio.sleep(min(self.heartbeat_seconds, max(left / 2, RETRY_FLOOR_SECONDS)))

    async def _release(self, claimed: ClaimedJob) -> None:
        job = claimed.job
        try:
            await self._repository.release(claimed.lease)
            log.info("job.released", job_id=job.id, kind=job.kind, attempt=job.attempt)
        except (LeaseLost, StorageUnavailable, StorageFull) as exc:
            # Not handed back: its lease expires and the next claim recovers it.
            log.warning("job.release_failed", job_id=job.id, error_class=type(exc).__name__)

    async def _record(self, claimed: ClaimedJob, outcome: Outcome) -> None:
        job = claimed.job
        fields = {"job_id": job.id, "kind": job.kind, "attempt": job.attempt}
        try:
            await while_lease_holds(
                lambda: self._write_outcome(claimed.lease, outcome, fields),
                self._lease_seconds,
                **fields,
                outcome=outcome.kind,
            )
        except LeaseLost:
            log.warning("job.lease_lost", **fields, outcome=outcome.kind)
        except (StorageUnavailable, StorageFull) as exc:
            # Not written: the lease will expire and the attempt will be retried.
            log.error("job.record_failed", **fields, outcome=outcome.kind, error_class=type(exc).__name__)

    async def _write_outcome(self, lease: Lease, outcome: Outcome, fields: dict[str, object]) -> None:
        if outcome.kind == "succeeded":
            status = await self._repository.succeed_status(lease, outcome.result)
            if status is JobStatus.CANCELLED:
                log.info("job.cancelled", **fields)
            else:
                log.info("job.completed", **fields)
        elif outcome.kind == "cancelled":
            await self._repository.mark_cancelled(lease)
            log.info("job.cancelled", **fields)
        elif outcome.kind == "failed":
            done = await self._repository.fail(
                lease, outcome.error or "", outcome.retryable, error_type=outcome.error_type
            )
            _log_failure(outcome, fields, final=done.status is not JobStatus.QUEUED)
        else:
            log.warning("job.lease_lost", **fields)


class _Watch:
    """One timer per attempt, for the things that may end it from outside.

    It fires first one heartbeat interval in (or halfway to `lease_until`, if
    the lease came with little left), when it starts the heartbeat task (most
    jobs end sooner, so they cost no heartbeat task to create and cancel), and
    then at the attempt's deadline, when it cancels the attempt's task as a
    lost lease does. `reason` says which of the two stopped it, if either did."""

    def __init__(self, executor: AttemptExecutor, claimed: ClaimedJob, task: asyncio.Task[Any]) -> None:
        self._executor = executor
        self._claimed = claimed
        self._task = task
        self._loop = task.get_loop()
        now = self._loop.time()
        self._deadline = now + claimed.job.timeout_seconds
        # Until when (loop time) the lease, as last renewed, may be relied on.
        held = executor.seconds_held(claimed.lease_expires_at)
        self.lease_until = now + held
        self._heartbeat: asyncio.Task[None] | None = None
        self._own_cancels = 0
        self.reason: str | None = None  # "lease_lost" | "timeout"
        # The CancelledError the handler was stopped with: where it was then.
        self.stopped_with: BaseException | None = None
        self._timer: asyncio.TimerHandle | None = self._loop.call_at(
            min(now + min(executor.heartbeat_seconds, max(0.0, held) / 2), self._deadline), self._fire
        )

    def _fire(self) -> None:
        self._timer = None
        if self._loop.time() >= self._deadline:
            self.stop_attempt("timeout")
            return
        if self._heartbeat is None:
            beat = self._executor._heartbeat(self._claimed, self)
            self._heartbeat = self._loop.create_task(beat, name=f"leasehold-heartbeat-{self._claimed.job.id}")
        self._timer = self._loop.call_at(self._deadline, self._fire)

    def renewed(self, expires_at: datetime) -> None:
        """The lease now runs to `expires_at`."""
        self.lease_until = self._loop.time() + self._executor.seconds_held(expires_at)

    def stop_attempt(self, reason: str) -> None:
        """End the attempt from outside; the first reason given is the one that counts."""
        if self.reason is not None or self._task.done():
            return
        self.reason = reason
        self._own_cancels += 1
        self._task.cancel()

    def absorb_own_cancels(self) -> bool:
        """Take back the cancels this watch aimed at the attempt's task. False if
        someone else (a shutdown) cancelled it too, which then still stands."""
        for _ in range(self._own_cancels):
            self._task.uncancel()
        self._own_cancels = 0
        return self.reason is not None and self._task.cancelling() == 0

    def timeout_outcome(self) -> Outcome:
        # The traceback of the cancel that stopped the handler (where it was
        # when time ran out) is the logged error's cause.
        error = TimeoutError(state_machine.TIMEOUT_ERROR_TEXT)
        error.__cause__ = self.stopped_with
        return Outcome(
            "failed",
            error=state_machine.TIMEOUT_ERROR_TEXT,
            error_type=state_machine.TIMEOUT_ERROR_TYPE,
            exception=error,
        )

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._heartbeat is not None:
            heartbeat, self._heartbeat = self._heartbeat, None
            await cancel_and_wait(heartbeat)


def _lease_unrenewed(job: Job, watch: _Watch) -> None:
    log.warning("job.lease_unrenewed", job_id=job.id, kind=job.kind, attempt=job.attempt)
    watch.stop_attempt("lease_lost")


def _this_task_is_cancelled() -> bool:
    """Whether a cancel is aimed at the running task itself (as opposed to a
    CancelledError some awaited code raised on its own)."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _succeeded(returned: object) -> Outcome:
    """A handler that returned: None produces no result, a JSON object within
    the payload limits is the job's result, and anything else fails the attempt
    (a bug in the handler, said plainly rather than stored half-right)."""
    if returned is None:
        return Outcome("succeeded")
    try:
        if not isinstance(returned, dict):
            raise InvalidArgument("result", f"must be a JSON object or None, not {type(returned).__name__}")
        limits.check_payload(returned, field="result")
    except InvalidArgument as exc:
        return Outcome(
            "failed",
            error=f"the handler returned an invalid result: {exc}",
            error_type=INVALID_RESULT_ERROR_TYPE,
        )
    return Outcome("succeeded", result=returned)


def _awaitable_returned(returned: object) -> Outcome:
    """A plain function that returned a coroutine (a lambda around an async
    one, say): it was registered as sync, so nothing would ever run it."""
    if inspect.iscoroutine(returned):
        returned.close()
    return Outcome(
        "failed",
        error="the handler returned an awaitable: register an async def handler to have it awaited",
        error_type=INVALID_RESULT_ERROR_TYPE,
        retryable=False,
    )


def _failed(exc: BaseException, retryable: bool = True) -> Outcome:
    """A handler's exception as a failed attempt. Its type is the class's
    `__name__` (`KeyError`, `MyError`; not module-qualified), the name a caller
    reading `Job.error_type` most likely knows it by."""
    return Outcome(
        "failed",
        error=limits.error_text(exc),
        error_type=type(exc).__name__,  # bounded where it is stored (limits.storable_error_type)
        retryable=retryable,
        exception=exc,
    )


def _log_failure(outcome: Outcome, fields: dict[str, object], *, final: bool) -> None:
    """`job.failed` with the traceback: a warning while the job will be retried,
    an error once it has failed for good. structlog's format_exc_info renders
    the plain traceback (file, line, code), never local variables, so a payload
    a handler holds in a local does not reach the log; the exception's own text
    does, as it does `error_message` (handlers raise errors safe to show)."""
    level = log.error if final else log.warning
    level(
        "job.failed",
        **fields,
        error_class=outcome.error_type,
        final=final,
        exc_info=outcome.exception,
    )
