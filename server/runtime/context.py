"""What a handler sees of its job: `JobContext` for an async handler,
`SyncJobContext` (the same fields, blocking methods) for a sync one."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from leasehold._server.jobs import limits
from leasehold._server.jobs.errors import JobCancelled
from leasehold._server.jobs.records import JobEvent, JsonObject, Lease
from leasehold._server.runtime.attempt_store import AttemptStore
from leasehold._server.runtime.storage_retry import while_lease_holds

T = TypeVar("T")


@dataclass(frozen=True)
class JobContext:
    """The running attempt, as its handler may use it.

    Every write goes through the attempt's lease, so once the lease is lost the
    handler's `append_event` and `checkpoint` raise `LeaseLost` instead of
    writing. A transient
    storage error (in a write or in the cancel check) is retried while the lease
    holds, so a handler sees one only when the database stays unavailable for
    longer than that.

    `parent_results` holds what the jobs this one depends on returned (its
    Enqueue's `depends_on` and `depends_on_refs`), by parent job id, in the
    order the job names its parents, so a step of a graph reads its inputs
    without calling the service. Only a parent that succeeded with a result is
    there, within 4 MiB in all (serialized as JSON): each result is at most
    256 KiB, but a hundred of them would not fit in one claim, so the results
    are taken in the parents' order while they fit, and one that does not fit
    in what is left is left out (read it with Get).
    Under `on_parent_failure` RUN, a parent that failed or was cancelled is
    absent too. It is read when the attempt is claimed and does not change.
    """

    job_id: str
    owner_id: str
    kind: str
    # Out of repr, like everything below it: a context that reaches a log or a
    # traceback shows neither the payload nor the lease token.
    payload: JsonObject = field(repr=False)
    attempt: int
    _lease: Lease = field(repr=False)
    # Any AttemptStore: the local repository, or WorkerService for a remote worker.
    _repository: AttemptStore = field(repr=False)
    _lease_seconds: float = field(repr=False)
    # The last checkpoint an earlier attempt saved, or None: where this attempt
    # may resume. It stays what the attempt began with (a checkpoint this
    # attempt saves is the next attempt's), so a handler reads one fixed value.
    last_checkpoint: JsonObject | None = field(default=None, repr=False)
    # Parent job id -> its result, within 4 MiB in all
    # (`dependencies.PARENT_RESULTS_LIMIT_BYTES`; see above); empty for a job
    # without parents. Out of repr: results are the owner's data.
    parent_results: Mapping[str, JsonObject] = field(default_factory=dict, repr=False)

    async def checkpoint(self, state: JsonObject) -> None:
        """Save `state` (a JSON object, at most 256 KiB, as a payload) as how far
        this attempt got, replacing the checkpoint saved before. When this
        returns it is stored: however this attempt ends (a raise, a crash, a
        lost lease), the job's next attempt finds it in `last_checkpoint`. A
        lost lease raises `LeaseLost` and saves nothing."""
        limits.check_payload(state, field="checkpoint")
        await while_lease_holds(
            lambda: self._repository.save_checkpoint(self._lease, state, self._lease_seconds),
            self._lease_seconds,
            job_id=self.job_id,
        )

    async def append_event(self, event_type: str, payload: JsonObject | None = None) -> JobEvent:
        """Append an event to the job's log. Types starting with `job.` are reserved."""
        limits.check_event_type(event_type)
        body: JsonObject = {} if payload is None else payload
        limits.check_payload(body)
        return await while_lease_holds(
            lambda: self._repository.append_event(self._lease, event_type, body),
            self._lease_seconds,
            job_id=self.job_id,
            event_type=event_type,
        )

    async def raise_if_cancelled(self) -> None:
        """Call at safe points: raises JobCancelled once a cancel was requested."""
        requested = await while_lease_holds(
            lambda: self._repository.cancel_requested(self._lease), self._lease_seconds, job_id=self.job_id
        )
        if requested:
            raise JobCancelled(self.job_id)


@dataclass(frozen=True)
class SyncJobContext:
    """The running attempt as a sync handler (`def handler(ctx)`) sees it.

    The handler runs in a worker thread; its `append_event`, `checkpoint` and
    `raise_if_cancelled` run the `JobContext`'s on the event loop and block the
    thread until they are done, so they are fenced, retried and ordered exactly
    as an async handler's. A thread cannot be stopped from outside: it learns of
    a cancel request at `raise_if_cancelled()`, and once its attempt has ended (a
    timeout, a lost lease, a shutdown) these methods raise `LeaseLost`, and
    whatever it returns is discarded."""

    job_id: str
    owner_id: str
    kind: str
    payload: JsonObject = field(repr=False)
    attempt: int
    _context: JobContext = field(repr=False)
    _loop: asyncio.AbstractEventLoop = field(repr=False)
    # As `JobContext.last_checkpoint`.
    last_checkpoint: JsonObject | None = field(default=None, repr=False)
    # As `JobContext.parent_results`: by parent job id, within 4 MiB in all.
    parent_results: Mapping[str, JsonObject] = field(default_factory=dict, repr=False)

    @classmethod
    def of(cls, context: JobContext) -> SyncJobContext:
        """The sync view of `context`, on the running loop (where it is made)."""
        return cls(
            job_id=context.job_id,
            owner_id=context.owner_id,
            kind=context.kind,
            payload=context.payload,
            attempt=context.attempt,
            _context=context,
            _loop=asyncio.get_running_loop(),
            last_checkpoint=context.last_checkpoint,
            parent_results=context.parent_results,
        )

    def append_event(self, event_type: str, payload: JsonObject | None = None) -> JobEvent:
        """Append an event to the job's log (types starting with `job.` are
        reserved); returns once it is committed."""
        return self._on_loop(self._context.append_event(event_type, payload))

    def checkpoint(self, state: JsonObject) -> None:
        """Save `state` as how far this attempt got (as `JobContext.checkpoint`);
        returns once it is stored."""
        self._on_loop(self._context.checkpoint(state))

    def raise_if_cancelled(self) -> None:
        """Call at safe points: raises JobCancelled once a cancel was requested."""
        self._on_loop(self._context.raise_if_cancelled())

    def _on_loop(self, operation: Coroutine[Any, Any, T]) -> T:
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is self._loop:
            operation.close()
            # Blocking here would wait for the loop this very call is holding up.
            raise RuntimeError("a SyncJobContext is for sync handlers, which run in a worker thread")
        return asyncio.run_coroutine_threadsafe(operation, self._loop).result()
