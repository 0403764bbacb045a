"""Run one claimed attempt: heartbeat, timeout, classify the outcome, record it.

The handler runs in its own task so that a lost lease can stop it; the final write
is shielded so a shutdown that arrives mid-write still records what happened.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import structlog

from leasehold._server.jobs import limits, state_machine
from leasehold._server.jobs.errors import (
    InvalidArgument,
    JobCancelled,
    LeaseLost,
    PermanentError,
    StorageFull,
    StorageUnavailable,
)
from leasehold._server.jobs.records import ClaimedJob, JobStatus, JsonObject, Lease
from leasehold._server.runtime.attempt_store import AttemptStore
from leasehold._server.runtime.context import JobContext
from leasehold._server.runtime.registry import HandlerRegistry
from leasehold._server.runtime.storage_retry import while_lease_holds
from leasehold._server.runtime.tasks import cancel_and_wait

log = structlog.get_logger("leasehold.runtime")

# A failed attempt whose kind no handler serves (DESIGN §3 Unknown kind).
UNKNOWN_KIND_ERROR_TYPE = "UnknownKind"
# A handler that returned something other than None or a JSON object.
INVALID_RESULT_ERROR_TYPE = "InvalidResult"


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
    or WorkerService in `leasehold worker`, so handlers behave the same in both."""

    def __init__(self, repository: AttemptStore, registry: HandlerRegistry, lease_seconds: float) -> None:
        self._repository = repository
        self._registry = registry
        self._lease_seconds = lease_seconds

    @property
    def heartbeat_seconds(self) -> float:
        return self._lease_seconds / 3

    async def execute(self, claimed: ClaimedJob) -> None:
        job = claimed.job
        log.info("job.started", job_id=job.id, kind=job.kind, attempt=job.attempt)
        handler_task = asyncio.create_task(self._invoke(claimed), name=f"leasehold-job-{job.id}")
        lease_lost = asyncio.Event()
        heartbeat = _Heartbeat(
            self.heartbeat_seconds, lambda: self._heartbeat(claimed, handler_task, lease_lost), job.id
        )
        try:
            outcome = await handler_task
        except asyncio.CancelledError:
            if _this_task_is_cancelled():
                # Shutting down: hand the attempt back so the job runs again at once,
                # here after a restart or on another worker, without waiting out the lease.
                await heartbeat.stop()
                await asyncio.shield(self._release(claimed))
                raise
            if not lease_lost.is_set():
                raise  # not ours to handle
            # The heartbeat found the lease gone and stopped the handler: the attempt
            # ends here, and is logged as such below.
            outcome = Outcome("lease_lost")
        finally:
            await heartbeat.stop()
        if lease_lost.is_set():
            outcome = Outcome("lease_lost")
        await asyncio.shield(self._record(claimed, outcome))

    async def _invoke(self, claimed: ClaimedJob) -> Outcome:
        job = claimed.job
        handler = self._registry.handler(job.kind)
        if handler is None:
            return Outcome(
                "failed",
                error=f"no handler is registered for kind {job.kind!r}",
                error_type=UNKNOWN_KIND_ERROR_TYPE,
            )
        context = JobContext(
            job_id=job.id,
            owner_id=job.owner_id,
            kind=job.kind,
            payload=claimed.payload,
            attempt=job.attempt,
            _lease=claimed.lease,
            _repository=self._repository,
            _lease_seconds=self._lease_seconds,
        )
        if job.cancel_requested_at is not None:
            # Requested before this attempt began (say, during a shutdown that
            # handed the job back): the claim read it, so no query is needed.
            return Outcome("cancelled")
        deadline = asyncio.timeout(job.timeout_seconds)
        try:
            async with deadline:
                returned = await handler(context)
        except JobCancelled:
            return Outcome("cancelled")
        except LeaseLost:
            return Outcome("lease_lost")
        except TimeoutError as exc:
            if deadline.expired():
                # The traceback shows where the handler was when time ran out.
                return Outcome(
                    "failed",
                    error=state_machine.TIMEOUT_ERROR_TEXT,
                    error_type=state_machine.TIMEOUT_ERROR_TYPE,
                    exception=exc,
                )
            return _failed(exc)
        except PermanentError as exc:
            return _failed(exc, retryable=False)
        except Exception as exc:
            return _failed(exc)
        except asyncio.CancelledError as exc:
            if _this_task_is_cancelled():
                raise  # lease lost or shutting down
            return _failed(exc)  # the handler's own, e.g. from a future someone cancelled
        return _succeeded(returned)

    async def _heartbeat(
        self, claimed: ClaimedJob, handler_task: asyncio.Task[Outcome], lease_lost: asyncio.Event
    ) -> None:
        while True:
            try:
                await self._repository.renew(claimed.lease, self._lease_seconds)
            except (StorageUnavailable, StorageFull) as exc:
                # The lease may still be valid; keep trying until it is not.
                log.warning("job.heartbeat_failed", job_id=claimed.job.id, error_class=type(exc).__name__)
            except Exception as exc:
                # LeaseLost, or a failure that leaves the lease in doubt: either way
                # the handler no longer has the right to finish.
                if not isinstance(exc, LeaseLost):
                    log.error("job.heartbeat_failed", job_id=claimed.job.id, error_class=type(exc).__name__)
                lease_lost.set()
                handler_task.cancel()
                return
            await asyncio.sleep(self.heartbeat_seconds)

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
            done = await self._repository.succeed(lease, outcome.result)
            if done.status is JobStatus.CANCELLED:
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


class _Heartbeat:
    """Renews the lease every `interval`, starting one interval in. Most jobs end
    sooner: until then it is a timer, not a task, so they cost no heartbeat task
    to create and cancel."""

    def __init__(self, interval: float, beat: Callable[[], Coroutine[Any, Any, None]], job_id: str) -> None:
        self._task: asyncio.Task[None] | None = None
        self._beat = beat
        self._name = f"leasehold-heartbeat-{job_id}"
        self._timer = asyncio.get_running_loop().call_later(interval, self._start)

    def _start(self) -> None:
        self._task = asyncio.create_task(self._beat(), name=self._name)

    async def stop(self) -> None:
        self._timer.cancel()
        if self._task is not None:
            await cancel_and_wait(self._task)


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
