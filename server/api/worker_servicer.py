"""`leasehold.v1.WorkerService` over grpc.aio: remote workers in any language.

Every write a remote worker makes is one of the state machine's transitions,
made by the same repository methods the in-process runtime uses, fenced by the
same lease token: a lost or stale lease, and a job id the token does not hold
(unknown ids included), are all `LeaseLost` → ABORTED alike, so a worker learns
nothing about jobs it does not hold. The one exception is a repeat of a write
the same token already made (`worker_writes`): a finishing write is answered
with the job as the first left it, an AppendEvent with a request_id with the
first one's sequence, so a worker whose reply was lost may simply send again.
The call gate has checked the worker credential before the request is even
decoded; a worker credential limited to some kind patterns may claim only
those kinds (PERMISSION_DENIED naming `kinds[i]` otherwise: the claim is
refused, not quietly narrowed, so a misconfigured worker learns at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import grpc

import leasehold
from leasehold._server.api import method_handlers, validation, worker_validation
from leasehold._server.api.call_gate import CallGate, caller
from leasehold._server.api.convert import dict_to_struct, job_to_proto, timestamp
from leasehold._server.api.method_handlers import decode
from leasehold._server.api.rpc_outcomes import RpcObserver, unobserved
from leasehold._server.auth.identity import KindsNotPermitted
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs import worker_writes
from leasehold._server.jobs.errors import InvalidArgument, LeaseLost
from leasehold._server.jobs.records import ClaimedJob, Job, Lease, LeaseRenewal
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindPatterns
from leasehold._server.remote.attempts import RemoteAttempts
from leasehold._server.remote.presence import WorkerPresence
from leasehold._server.remote.roster import WorkerRoster
from leasehold._server.runtime.long_poll import LongPollClaimer
from leasehold.v1 import worker_pb2

SERVICE = worker_pb2.DESCRIPTOR.services_by_name["WorkerService"]
WORKER_SERVICE_NAME = SERVICE.full_name  # "leasehold.v1.WorkerService"
# Protocol 2 only adds; a worker that asks for nothing (every version-1
# worker) is answered 1, so one that checks for exactly 1 keeps working.
PROTOCOL_VERSION = 2
# What one ClaimResponse carries at most (its first job always goes): under
# the 4 MiB a gRPC client reads by default, with room for the `held` list.
CLAIM_RESPONSE_BYTES = 3 * 1024 * 1024 + 512 * 1024


def negotiated_protocol(spoken: int) -> int:
    """The protocol to speak with a worker that speaks up to `spoken` (0: 1)."""
    return max(1, min(spoken or 1, PROTOCOL_VERSION))


FEATURES = (
    "append_request_id",
    "batch_finish",
    "batch_heartbeat",
    "cancel_grace",
    "checkpoints",
    "claim_held_leases",
    "idempotent_finish",
    "long_poll",
    "results",
    "server_timeouts",
    "snooze",
)


@dataclass(frozen=True)
class FinishingWrite:
    """A finishing write, read and checked, not yet made: what a single call
    and one outcome of a Finish both come to."""

    lease: Lease
    transition: sm.Transition
    write: Callable[[], Awaitable[Job]]


class WorkerServiceServicer:
    def __init__(
        self,
        repository: JobRepository,
        remote_kinds: KindPatterns,
        claimer: LongPollClaimer,
        lease_seconds: float,
        presence: WorkerPresence,
        roster: WorkerRoster,
        attempts: RemoteAttempts,
    ) -> None:
        """`roster`: where each Claim's worker is noted for ListWorkers (the
        admin servicer reads the same one); `attempts`: the leases this replica
        hands out, which a drain waits for."""
        self._repository = repository
        self._presence = presence
        self._roster = roster
        self._attempts = attempts
        self._remote_kinds = remote_kinds
        self._claimer = claimer
        self._lease_seconds = lease_seconds

    async def claim(self, data: bytes, context: grpc.aio.ServicerContext) -> worker_pb2.ClaimResponse:
        message = decode(worker_pb2.ClaimRequest, data)
        request = worker_validation.claim(message, self._remote_kinds)
        identity = caller()
        for index, kind in enumerate(message.kinds):
            if not identity.may_claim(kind):
                raise KindsNotPermitted(f"kinds[{index}]", kind)
        kinds = request.kinds.only or ()
        with self._presence.claiming(kinds), self._roster.claiming(request.worker_id, kinds):
            # A caller that goes away while this waits cancels it, and the
            # claimer hands back what it took. Once the answer is on its way
            # nothing more is heard of a cancel (grpc.aio tells only a handler
            # still running), so jobs in an answer the caller never read come
            # back when their lease lapses.
            outcome = await self._claimer.claim(request)
        sent, extra = self._within_response_bound(outcome.jobs)
        if extra:
            # They would take the answer past what a worker's gRPC stack reads
            # by default: claimable again at once, their attempts uncounted.
            await asyncio.shield(self._claimer.hand_back(extra))
        for claimed, _ in sent:
            self._attempts.claimed(claimed.job.id, claimed.lease.token, claimed.lease_expires_at)
        return worker_pb2.ClaimResponse(
            jobs=[proto for _, proto in sent],
            held=[
                worker_pb2.LeaseState(
                    job_id=news.job_id, cancel_requested=news.cancel_requested, lost=news.lost
                )
                for news in outcome.held
            ],
        )

    def _within_response_bound(
        self, jobs: list[ClaimedJob]
    ) -> tuple[list[tuple[ClaimedJob, worker_pb2.ClaimedJob]], list[ClaimedJob]]:
        """The claimed jobs whose messages fit in `CLAIM_RESPONSE_BYTES`
        together (the first always goes), and the rest. A job carries its
        payload, its checkpoint and its parents' results: a fan-out's children
        each carry the same large result, and a few of them would pass 4 MiB."""
        sent: list[tuple[ClaimedJob, worker_pb2.ClaimedJob]] = []
        size = 0
        for index, claimed in enumerate(jobs):
            proto = self._claimed_to_proto(claimed)
            size += proto.ByteSize()
            if sent and size > CLAIM_RESPONSE_BYTES:
                return sent, jobs[index:]
            sent.append((claimed, proto))
        return sent, []

    def _claimed_to_proto(self, claimed: ClaimedJob) -> worker_pb2.ClaimedJob:
        return worker_pb2.ClaimedJob(
            job=job_to_proto(claimed.job),
            checkpoint=None if claimed.checkpoint is None else dict_to_struct(claimed.checkpoint),
            payload=dict_to_struct(claimed.payload),
            owner_id=claimed.job.owner_id,
            lease_token=claimed.lease.token,
            lease_expires_at=timestamp(claimed.lease_expires_at),
            heartbeat_interval_seconds=self._lease_seconds / 3,
            traceparent=claimed.job.traceparent or "",
            parent_results={
                parent_id: dict_to_struct(result) for parent_id, result in claimed.parent_results.items()
            },
        )

    async def heartbeat(self, data: bytes, context: grpc.aio.ServicerContext) -> worker_pb2.HeartbeatResponse:
        refs = worker_validation.heartbeat(decode(worker_pb2.HeartbeatRequest, data))
        leases = [ref.lease for ref in refs]
        renewals = await self._renew(refs)
        states = []
        for lease, renewal in zip(leases, renewals, strict=True):
            if renewal is None:
                self._attempts.ended(lease.job_id, lease.token)
                states.append(worker_pb2.LeaseState(job_id=lease.job_id, lost=True))
            else:
                self._attempts.renewed(lease.job_id, lease.token, renewal.expires_at)
                states.append(
                    worker_pb2.LeaseState(
                        job_id=lease.job_id,
                        lease_expires_at=timestamp(renewal.expires_at),
                        cancel_requested=renewal.cancel_requested,
                    )
                )
        return worker_pb2.HeartbeatResponse(states=states)

    async def _renew(self, refs: list[worker_validation.HeartbeatRef]) -> list[LeaseRenewal | None]:
        """Renew every lease of a Heartbeat; one carrying a checkpoint is saved
        with its renewal in one fenced write (so a stale lease's checkpoint is
        refused with it), the rest renew together in one batch."""
        plain = [index for index, ref in enumerate(refs) if ref.checkpoint is None]
        saving = [index for index, ref in enumerate(refs) if ref.checkpoint is not None]
        renewals: list[LeaseRenewal | None] = [None] * len(refs)
        batch, saved = await asyncio.gather(
            self._repository.heartbeat([refs[index].lease for index in plain], self._lease_seconds)
            if plain
            else _nothing(),
            asyncio.gather(*(self._save_checkpoint(refs[index]) for index in saving)),
        )
        for index, renewal in zip(plain, batch, strict=True):
            renewals[index] = renewal
        for index, renewal in zip(saving, saved, strict=True):
            renewals[index] = renewal
        return renewals

    async def _save_checkpoint(self, ref: worker_validation.HeartbeatRef) -> LeaseRenewal | None:
        assert ref.checkpoint is not None
        try:
            return await self._repository.save_checkpoint(ref.lease, ref.checkpoint, self._lease_seconds)
        except LeaseLost:
            return None

    async def append_event(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> worker_pb2.AppendEventResponse:
        request = decode(worker_pb2.AppendEventRequest, data)
        lease = worker_validation.lease(request.job_id, request.lease_token)
        event_type = worker_validation.event_type(request.type)
        payload = worker_validation.struct("payload", request.payload)
        request_id = validation.request_id(request.request_id)
        event = await self._repository.append_event(lease, event_type, payload, request_id)
        return worker_pb2.AppendEventResponse(
            sequence=event.sequence, cancel_requested=await self._cancel_requested(lease)
        )

    async def _cancel_requested(self, lease: Lease) -> bool:
        """Whether the owner asked the job to stop, read after the append (reads
        of concurrent appends are batched into one). A lease gone by then (a
        repeated append of a job since finished) has nothing left to stop."""
        try:
            return await self._repository.cancel_requested(lease)
        except LeaseLost:
            return False

    async def complete(self, data: bytes, context: grpc.aio.ServicerContext) -> worker_pb2.CompleteResponse:
        job = await self._finishing(self._complete(decode(worker_pb2.CompleteRequest, data)))
        return worker_pb2.CompleteResponse(job=job_to_proto(job))

    async def fail(self, data: bytes, context: grpc.aio.ServicerContext) -> worker_pb2.FailResponse:
        job = await self._finishing(self._fail(decode(worker_pb2.FailRequest, data)))
        return worker_pb2.FailResponse(job=job_to_proto(job))

    async def snooze(self, data: bytes, context: grpc.aio.ServicerContext) -> worker_pb2.SnoozeResponse:
        job = await self._finishing(self._snooze(decode(worker_pb2.SnoozeRequest, data)))
        return worker_pb2.SnoozeResponse(job=job_to_proto(job))

    async def confirm_cancel(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> worker_pb2.ConfirmCancelResponse:
        job = await self._finishing(self._confirm_cancel(decode(worker_pb2.ConfirmCancelRequest, data)))
        return worker_pb2.ConfirmCancelResponse(job=job_to_proto(job))

    async def finish(self, data: bytes, context: grpc.aio.ServicerContext) -> worker_pb2.FinishResponse:
        """Every outcome is read before any is written; each then takes the path
        of its single call, all at once, so the writer commits them together."""
        outcomes = worker_validation.finish(decode(worker_pb2.FinishRequest, data))
        writes: list[tuple[str, FinishingWrite | InvalidArgument]] = []
        for index, outcome in enumerate(outcomes):
            which = outcome.WhichOneof("outcome")
            job_id = getattr(outcome, str(which)).job_id
            try:
                writes.append((job_id, self._outcome_write(outcome, which)))
            except InvalidArgument as invalid:
                field = f"outcomes[{index}].{which}.{invalid.field}"
                writes.append((job_id, InvalidArgument(field, invalid.description)))
        results = await asyncio.gather(*(self._finish_one(job_id, write) for job_id, write in writes))
        return worker_pb2.FinishResponse(results=results)

    def _outcome_write(self, outcome: worker_pb2.Outcome, which: str | None) -> FinishingWrite:
        if which == "complete":
            return self._complete(outcome.complete)
        if which == "fail":
            return self._fail(outcome.fail)
        if which == "snooze":
            return self._snooze(outcome.snooze)
        assert which == "confirm_cancel"  # worker_validation.finish refused an empty outcome
        return self._confirm_cancel(outcome.confirm_cancel)

    async def _finish_one(
        self, job_id: str, write: FinishingWrite | InvalidArgument
    ) -> worker_pb2.OutcomeResult:
        """One outcome's answer: what its single call would have answered, as
        a result rather than a status. Storage errors still fail the whole
        call, which the worker retries as a whole."""
        if isinstance(write, InvalidArgument):
            violation = worker_pb2.FieldViolation(field=write.field, description=write.description)
            return worker_pb2.OutcomeResult(job_id=job_id, invalid=violation)
        try:
            job = await self._finishing(write)
        except LeaseLost:
            return worker_pb2.OutcomeResult(job_id=job_id, lost=True)
        return worker_pb2.OutcomeResult(job_id=job_id, job=job_to_proto(job))

    def _complete(self, request: worker_pb2.CompleteRequest) -> FinishingWrite:
        lease = worker_validation.lease(request.job_id, request.lease_token)
        result = worker_validation.struct("result", request.result) if request.HasField("result") else None
        return FinishingWrite(
            lease, sm.SUCCEED, lambda: self._repository.succeed(lease, result, remember=True)
        )

    def _fail(self, request: worker_pb2.FailRequest) -> FinishingWrite:
        lease = worker_validation.lease(request.job_id, request.lease_token)
        error_type = worker_validation.error_type(request.error_type)
        retry_after = worker_validation.seconds(
            "retry_after_seconds", request.retry_after_seconds, zero_allowed=True
        )
        return FinishingWrite(
            lease,
            sm.FAIL,
            lambda: self._repository.fail(
                lease,
                request.error_message or "the worker reported a failure without a message",
                retryable=not request.non_retryable,
                error_type=error_type or None,
                retry_after_seconds=retry_after,
                remember=True,
            ),
        )

    def _snooze(self, request: worker_pb2.SnoozeRequest) -> FinishingWrite:
        lease = worker_validation.lease(request.job_id, request.lease_token)
        delay = worker_validation.seconds("delay_seconds", request.delay_seconds, zero_allowed=False)
        assert delay is not None
        return FinishingWrite(lease, sm.SNOOZE, lambda: self._repository.snooze(lease, delay, remember=True))

    def _confirm_cancel(self, request: worker_pb2.ConfirmCancelRequest) -> FinishingWrite:
        lease = worker_validation.lease(request.job_id, request.lease_token)
        return FinishingWrite(
            lease, sm.CONFIRM_CANCEL, lambda: self._repository.mark_cancelled(lease, remember=True)
        )

    async def _finishing(self, write: FinishingWrite) -> Job:
        """A write that ends the attempt: once it is written, or the lease turns
        out to be gone, a drain no longer waits for the attempt. A repeat of a
        write that took effect is answered as the first was
        (`worker_writes.finish_once`)."""
        lease = write.lease
        try:
            job = await worker_writes.finish_once(self._repository, lease, write.transition, write.write)
        except LeaseLost:
            self._attempts.ended(lease.job_id, lease.token)
            raise
        self._attempts.ended(lease.job_id, lease.token)
        return job

    async def get_server_info(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> worker_pb2.GetServerInfoResponse:
        request = decode(worker_pb2.GetServerInfoRequest, data)
        return worker_pb2.GetServerInfoResponse(
            server_version=leasehold.__version__,
            protocol_version=negotiated_protocol(request.protocol_version),
            features=FEATURES,
        )

    def generic_handler(
        self, gate: CallGate, rpc_finished: RpcObserver = unobserved
    ) -> grpc.GenericRpcHandler:
        return method_handlers.generic_handler(SERVICE, self, gate, rpc_finished)


async def _nothing() -> list[LeaseRenewal | None]:
    """No batch to renew: a Heartbeat whose every lease carries a checkpoint."""
    return []
