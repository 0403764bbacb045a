"""What running one attempt needs from storage, and nothing more.

The executor and the handler's `JobContext` only ever touch the attempt they
hold, through its lease. Typing them against this narrow protocol, rather than
the whole `JobRepository`, lets the same executor run an attempt whose writes go
to the local database (the in-process runtime: `JobRepository` satisfies this as
it is) or over WorkerService to a server (`leasehold worker`). That is what keeps
the handler API identical in both places: one executor, two stores.
"""

from __future__ import annotations

from datetime import datetime
from typing import Protocol

from leasehold._server.jobs.records import Job, JobEvent, JobStatus, JsonObject, Lease, LeaseRenewal


class AttemptStore(Protocol):
    """The fenced writes of one running attempt. Every method raises `LeaseLost`
    once the lease no longer owns the job, `StorageUnavailable` or `StorageFull`
    when the write may succeed if retried while the lease holds."""

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        """Extend the lease (by `lease_seconds` where the store decides the
        length); returns the new expiry."""
        ...

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        """Store `checkpoint` (already checked against the limits) for the job's
        next attempt, renewing the lease with it; returns once it is stored."""
        ...

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        """Finish the attempt with `result`; a pending cancel request wins. Only
        the status it ended in comes back: all the executor needs, so a store
        may skip reading back the whole job."""
        ...

    async def fail(
        self, lease: Lease, error: str, retryable: bool = True, error_type: str | None = None
    ) -> Job:
        """Record a failed attempt: retried while attempts remain and it is retryable."""
        ...

    async def release(self, lease: Lease) -> Job:
        """Hand an unfinished attempt back (shutting down); the attempt is not counted."""
        ...

    async def mark_cancelled(self, lease: Lease) -> Job:
        """The handler observed a cancel request and stopped."""
        ...

    async def append_event(self, lease: Lease, event_type: str, payload: JsonObject) -> JobEvent:
        """Add an event to the job's log (already checked against the limits)."""
        ...

    async def cancel_requested(self, lease: Lease) -> bool:
        """Whether the attempt should stop."""
        ...
