"""Run a handler without a server, for its unit tests.

    from leasehold.testing import JobEnvironment
    from leasehold.worker import JobContext

    async def greet(ctx: JobContext) -> None:
        await ctx.append_event("greeted", {"name": ctx.payload["name"]})

    async def test_greet() -> None:
        run = await JobEnvironment().run(greet, {"name": "Ada"})
        assert run.status == "succeeded"
        assert run.handler_events == [("greeted", {"name": "Ada"})]

`JobEnvironment.run` enqueues one job, and claims and executes its attempts with
the service's own in-process runtime code over an in-memory job store that
passes the same contract suite as the databases. So every rule the service
applies is applied here, by the same code: the payload is validated and
converted as Enqueue does, a raise is a failed attempt retried with backoff
until `max_attempts`, `PermanentError` fails at once, `ctx.raise_if_cancelled()`
stops at a requested cancel, a handler that returns after a cancel request still
ends cancelled, and the event log (`JobRun.events`) is the log WatchEvents would
show, lifecycle events included.

Checkpoints work as in the service: `await ctx.checkpoint(state)` stores it for
the next attempt's `ctx.last_checkpoint`, and `JobRun.checkpoint` is the last one
saved. To test resuming without first running the attempt that stopped, pass
`checkpoint=` to `run`: the first attempt begins with it, as if an earlier
attempt had saved it.

    async def copy_pages(ctx: JobContext) -> None:
        start = (ctx.last_checkpoint or {}).get("page", 0)
        for page in range(start, ctx.payload["pages"]):
            await ctx.append_event("copied", {"page": page})
            await ctx.checkpoint({"page": page + 1})

    run = await JobEnvironment().run(copy_pages, {"pages": 3}, checkpoint={"page": 2})
    assert run.handler_events == [("copied", {"page": 2})]

Time is a `ManualClock`: the environment moves it through each retry's backoff
instead of sleeping, so a test of three attempts takes no longer than the
handler's own code. Only `timeout_seconds` is real time, as in the service
(an attempt's deadline runs on the event loop's clock).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import NamedTuple

from google.protobuf import struct_pb2

from leasehold._server.api import validation
from leasehold._server.clock import ManualClock
from leasehold._server.jobs import limits
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import (
    ClaimResult,
    Job,
    JobEvent,
    JsonObject,
    Lease,
    LeaseRenewal,
    NewJob,
)
from leasehold._server.jobs.routing import ANY_KIND, KindFilter, ServedKinds
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold._server.runtime.executor import AttemptExecutor
from leasehold._server.runtime.registry import Handler, HandlerRegistry
from leasehold.v1 import jobs_pb2

__all__ = ["Event", "JobEnvironment", "JobRun", "ManualClock"]

OWNER_ID = "leasehold-testing"
WORKER_ID = "leasehold-testing-worker"
# Far more than one job's log can hold in a test.
_ALL_EVENTS = 1_000_000


class Event(NamedTuple):
    """One entry of a job's event log; compares equal to a `(type, payload)` tuple."""

    type: str
    payload: JsonObject


@dataclass(frozen=True)
class JobRun:
    """How a job ended, and its whole event log."""

    job_id: str
    status: str  # "succeeded" | "failed" | "cancelled"
    attempts: int  # attempts counted against max_attempts
    error_message: str | None  # the last failed attempt's error, unless the job succeeded
    error_type: str | None  # the exception class the service recorded with it
    events: list[Event]  # every event, lifecycle ones (types starting "job.") included, in order
    result: JsonObject | None = None  # what the handler returned, if the job succeeded
    checkpoint: JsonObject | None = None  # the last checkpoint saved (`ctx.checkpoint`), if any

    @property
    def handler_events(self) -> list[Event]:
        """Only the events the handler appended itself."""
        return [event for event in self.events if not event.type.startswith(limits.RESERVED_EVENT_PREFIX)]


class JobEnvironment:
    """Runs jobs one at a time on its own manual clock (`clock`).

    `lease_seconds` is the service's `--lease-seconds` (30 unless given): a
    handler that moves `clock` past it loses its lease, exactly as a stalled
    worker would, and the job's next attempt recovers it.
    """

    def __init__(self, clock: ManualClock | None = None, *, lease_seconds: float = 30.0) -> None:
        self.clock = clock or ManualClock()
        self._lease_seconds = RuntimeSettings(lease_seconds=lease_seconds).lease_seconds
        self._running: tuple[MemoryJobRepository, str] | None = None

    async def run(
        self,
        handler: Handler | HandlerRegistry,
        payload: JsonObject | None = None,
        *,
        kind: str = "test.kind",
        max_attempts: int = 3,
        timeout_seconds: int = 900,
        cancel_after_events: int | None = None,
        checkpoint: JsonObject | None = None,
    ) -> JobRun:
        """Enqueue a job of `kind` and run its attempts to the end.

        `handler` is the handler itself, or a `HandlerRegistry` (say, the one
        your module's `register()` filled) that serves `kind`. A cancel is
        requested once the handler has appended `cancel_after_events` events
        of its own, or whenever `cancel()` is awaited while the job runs.
        With `checkpoint`, the first attempt's `ctx.last_checkpoint` is it, as
        if an earlier attempt had saved it (checked as `ctx.checkpoint` checks).
        Raises ValueError for what Enqueue would refuse (INVALID_ARGUMENT).
        """
        if self._running is not None:
            raise RuntimeError("a JobEnvironment runs one job at a time; use one environment per job")
        registry = handler if isinstance(handler, HandlerRegistry) else _serving(kind, handler)
        new_job = _validated(kind, payload or {}, max_attempts, timeout_seconds, registry, self.clock)
        repository = _CancellingRepository(self.clock, cancel_after_events)
        if checkpoint is not None:
            _checked_checkpoint(checkpoint)
        job, _ = await repository.enqueue(new_job)
        repository.job_id = job.id
        repository.saved_checkpoint = checkpoint
        self._running = (repository, job.id)
        try:
            job = await self._run_attempts(repository, registry, job)
            events = await repository.list_events(OWNER_ID, job.id, 0, _ALL_EVENTS)
            saved = repository.saved_checkpoint
        finally:
            self._running = None
            await repository.close()
        return JobRun(
            job_id=job.id,
            status=job.status.value,
            attempts=job.attempt,
            error_message=job.error_message,
            error_type=job.error_type,
            events=[Event(event.type, event.payload) for event in events],
            result=job.result,
            checkpoint=saved,
        )

    async def cancel(self) -> None:
        """Request a cancel of the job being run, as the owner's Cancel does: a
        running handler sees it at its next `ctx.raise_if_cancelled()` (and
        ends cancelled even if it returns), a job waiting for its retry is
        cancelled at once. Call it from the handler or from another task."""
        if self._running is None:
            raise RuntimeError("cancel() needs a job running in this environment")
        repository, job_id = self._running
        await repository.cancel(OWNER_ID, job_id)

    async def _run_attempts(
        self, repository: MemoryJobRepository, registry: HandlerRegistry, job: Job
    ) -> Job:
        """What the service's claim loop does for one job, with the clock moved
        to the next moment something can happen instead of waiting for it."""
        executor = AttemptExecutor(repository, registry, self._lease_seconds)
        while not job.status.is_terminal:
            result = await repository.claim(WORKER_ID, 1, self._lease_seconds)
            for claimed in result.jobs:
                await executor.execute(claimed)
            if not result.jobs:
                if result.next_wakeup_at is None:  # cannot happen to a job that is not finished
                    raise AssertionError(f"job {job.id} is {job.status.value} with nothing due")
                self.clock.advance(max(0.0, (result.next_wakeup_at - self.clock.now()).total_seconds()))
            job = await repository.get(OWNER_ID, job.id)
        return job


class _CancellingRepository(MemoryJobRepository):
    """The in-memory store, plus the owner's cancel request once the handler
    has appended `after_events` events (when given)."""

    def __init__(self, clock: ManualClock, after_events: int | None) -> None:
        super().__init__(clock)
        self.job_id = ""
        self._after_events = after_events
        self._appended = 0
        # The last checkpoint saved: `run(checkpoint=...)`'s until an attempt
        # saves one. Only the seed is served from here (the store holds what
        # attempts save), so an attempt that saves nothing passes it on.
        self.saved_checkpoint: JsonObject | None = None

    async def claim(
        self, worker_id: str, limit: int, lease_seconds: float, kinds: KindFilter = ANY_KIND
    ) -> ClaimResult:
        result = await super().claim(worker_id, limit, lease_seconds, kinds)
        seed = self.saved_checkpoint
        if seed is None or all(claimed.checkpoint is not None for claimed in result.jobs):
            return result
        seeded = [
            claimed if claimed.checkpoint is not None else replace(claimed, checkpoint=_as_stored(seed))
            for claimed in result.jobs
        ]
        return replace(result, jobs=seeded)

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        renewal = await super().save_checkpoint(lease, checkpoint, lease_seconds)
        self.saved_checkpoint = _as_stored(checkpoint)
        return renewal

    async def append_event(
        self, lease: Lease, event_type: str, payload: JsonObject, request_id: str | None = None
    ) -> JobEvent:
        event = await super().append_event(lease, event_type, payload, request_id)
        self._appended += 1
        if self._appended == self._after_events:
            await self.cancel(OWNER_ID, self.job_id)
        return event


def _as_stored(value: JsonObject) -> JsonObject:
    """A copy of `value`, as the next attempt would read it back."""
    copied: JsonObject = json.loads(json.dumps(value))
    return copied


def _checked_checkpoint(checkpoint: JsonObject) -> None:
    try:
        limits.check_payload(checkpoint, field="checkpoint")
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None


def _serving(kind: str, handler: Handler) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register(kind, handler)  # refuses an invalid kind with ValueError
    return registry


def _validated(
    kind: str,
    payload: JsonObject,
    max_attempts: int,
    timeout_seconds: int,
    registry: HandlerRegistry,
    clock: ManualClock,
) -> NewJob:
    """The job as the service's Enqueue would take it: the same checks, and the
    payload converted the way it reaches a handler after travelling as a
    `google.protobuf.Struct`."""
    try:
        limits.check_payload(payload)  # names what is wrong before protobuf would choke on it
        struct = struct_pb2.Struct()
        struct.update(payload)
        request = jobs_pb2.EnqueueRequest(
            kind=kind, payload=struct, max_attempts=max_attempts, timeout_seconds=timeout_seconds
        )
        return validation.new_job(OWNER_ID, request, ServedKinds(registry), clock.now())
    except InvalidArgument as exc:
        raise ValueError(str(exc)) from None
