"""What a handler sees of its job."""

from __future__ import annotations

from dataclasses import dataclass, field

from leasehold._server.jobs import limits
from leasehold._server.jobs.errors import JobCancelled
from leasehold._server.jobs.records import JobEvent, JsonObject, Lease
from leasehold._server.runtime.attempt_store import AttemptStore
from leasehold._server.runtime.storage_retry import while_lease_holds


@dataclass(frozen=True)
class JobContext:
    """The running attempt, as its handler may use it.

    Every write goes through the attempt's lease, so once the lease is lost the
    handler's `append_event` raises `LeaseLost` instead of writing. A transient
    storage error (in a write or in the cancel check) is retried while the lease
    holds, so a handler sees one only when the database stays unavailable for
    longer than that.
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
