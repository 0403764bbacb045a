"""`AttemptStore` over WorkerService: the remote worker's side of the seam.

Each write is one fenced call naming the job and its lease token; renewals and
cancel checks are answered from the batched heartbeats (heartbeats.py) without
a call. A lease already known to be lost raises LeaseLost before any call, so a
fenced-out worker sends nothing more for that job.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, TypeVar

from leasehold._server.api.convert import dict_to_struct
from leasehold._server.clock import Clock
from leasehold._server.jobs.records import Job, JobEvent, JobStatus, JsonObject, Lease, LeaseRenewal
from leasehold._server.remote.calls import auth_metadata, mapped
from leasehold._server.remote.convert import job_from_proto
from leasehold._server.remote.finishing import FinishBatcher
from leasehold._server.remote.heartbeats import LeaseBook
from leasehold._server.runtime.storage_retry import while_lease_holds
from leasehold.v1 import jobs_pb2, worker_pb2, worker_pb2_grpc

T = TypeVar("T")

# How long one write may take before it is treated as unavailable and retried.
# The executor retries a finishing write while the lease holds; a retry of one
# that did land (its reply lost) is answered by a protocol-2 server with the
# job as the first left it, and refused as ABORTED by a protocol-1 server:
# never applied twice either way.
WRITE_TIMEOUT_SECONDS = 10.0
# A released attempt is claimable again after the shortest snooze the protocol
# allows: "at once", as the in-process release means.
RELEASE_DELAY_SECONDS = 1.0


class RemoteAttemptStore:
    """Implements `leasehold._server.runtime.attempt_store.AttemptStore`."""

    def __init__(
        self,
        stub: worker_pb2_grpc.WorkerServiceStub,
        leases: LeaseBook,
        token: str | None,
        clock: Clock,
    ) -> None:
        self._stub = stub
        self._leases = leases
        self._metadata = auth_metadata(token)
        self._clock = clock
        # Set once the server is known to offer Finish ("batch_finish").
        self.finisher: FinishBatcher | None = None

    def finish_in_batches(self) -> None:
        """Send finishing writes through Finish from now on."""
        self.finisher = FinishBatcher(
            lambda request, timeout: self._stub.Finish(request, metadata=self._metadata, timeout=timeout),
            WRITE_TIMEOUT_SECONDS,
        )

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        """The server decides the lease length; `lease_seconds` is not sent."""
        return self._leases.renewed(lease)

    async def cancel_requested(self, lease: Lease) -> bool:
        return self._leases.cancel_requested(lease)

    async def save_checkpoint(
        self, lease: Lease, checkpoint: JsonObject, lease_seconds: float
    ) -> LeaseRenewal:
        """Sent at once, as a Heartbeat of this lease carrying it (`LeaseBook`);
        the server decides the lease length, so `lease_seconds` is not sent."""
        return await self._leases.save_checkpoint(lease, checkpoint, WRITE_TIMEOUT_SECONDS)

    async def succeed(self, lease: Lease, result: JsonObject | None = None) -> Job:
        request = worker_pb2.CompleteRequest(
            job_id=lease.job_id,
            lease_token=lease.token,
            result=None if result is None else dict_to_struct(result),
        )
        return await self._finish(lease, worker_pb2.Outcome(complete=request), self._stub.Complete)

    async def succeed_status(self, lease: Lease, result: JsonObject | None = None) -> JobStatus:
        """WorkerService answers with the whole job either way."""
        return (await self.succeed(lease, result)).status

    async def fail(
        self, lease: Lease, error: str, retryable: bool = True, error_type: str | None = None
    ) -> Job:
        request = worker_pb2.FailRequest(
            job_id=lease.job_id,
            lease_token=lease.token,
            error_message=error,
            error_type=error_type or "",
            non_retryable=not retryable,
        )
        return await self._finish(lease, worker_pb2.Outcome(fail=request), self._stub.Fail)

    async def release(self, lease: Lease) -> Job:
        """A Snooze: back in the queue, the interrupted attempt not counted."""
        request = worker_pb2.SnoozeRequest(
            job_id=lease.job_id, lease_token=lease.token, delay_seconds=RELEASE_DELAY_SECONDS
        )
        return await self._finish(lease, worker_pb2.Outcome(snooze=request), self._stub.Snooze)

    async def mark_cancelled(self, lease: Lease) -> Job:
        request = worker_pb2.ConfirmCancelRequest(job_id=lease.job_id, lease_token=lease.token)
        return await self._finish(lease, worker_pb2.Outcome(confirm_cancel=request), self._stub.ConfirmCancel)

    async def _finish(
        self, lease: Lease, outcome: worker_pb2.Outcome, single: Callable[..., Awaitable[Any]]
    ) -> Job:
        """Through Finish with the outcomes ending beside it when the server
        offers it, else the outcome's own call."""
        if self.finisher is None:
            request = getattr(outcome, str(outcome.WhichOneof("outcome")))
            response = await self._write(lease, single, request)
            return self._job(lease, response.job)
        self._leases.held(lease)  # LeaseLost without a call once the lease is known gone
        return self._job(lease, await self.finisher.finish(outcome, lease.job_id))

    async def append_event(self, lease: Lease, event_type: str, payload: JsonObject) -> JobEvent:
        """The reply carries only the sequence; the event's time is this
        worker's clock, an approximation of the server's stamp.

        The append is retried here, after UNAVAILABLE or a deadline, while the
        lease is still held, and every try carries one request_id: a try that
        landed although its reply was lost is answered with its sequence
        instead of adding the event twice (a protocol-1 server ignores the
        field). The executor's own retry, were this one to give up, would be a
        new append, so this one lasts as long as the lease."""
        request = worker_pb2.AppendEventRequest(
            job_id=lease.job_id,
            lease_token=lease.token,
            type=event_type,
            payload=dict_to_struct(payload),
            request_id=uuid.uuid4().hex,
        )
        response: worker_pb2.AppendEventResponse = await while_lease_holds(
            lambda: self._write(lease, self._stub.AppendEvent, request),
            self._seconds_left(lease),
            job_id=lease.job_id,
            event_type=event_type,
        )
        return JobEvent(lease.job_id, response.sequence, event_type, payload, self._clock.now())

    def _seconds_left(self, lease: Lease) -> float:
        """How long the lease holds as the last heartbeat reply said."""
        return max(0.0, (self._leases.held(lease).expires_at - self._clock.now()).total_seconds())

    async def _write(self, lease: Lease, method: Callable[..., Awaitable[T]], request: object) -> T:
        self._leases.held(lease)  # LeaseLost without a call once the lease is known gone
        return await mapped(
            method(request, metadata=self._metadata, timeout=WRITE_TIMEOUT_SECONDS), lease.job_id
        )

    def _job(self, lease: Lease, message: jobs_pb2.Job) -> Job:
        return job_from_proto(message, self._leases.owner_of(lease))
