"""`leasehold.v1.JobService` over grpc.aio.

Requests arrive as raw bytes and are decoded here, inside the handler, so a
message protobuf cannot parse (say, a payload nested past the recursion limit)
becomes INVALID_ARGUMENT rather than grpc's own UNKNOWN. The call gate
(call_gate.py) has checked the caller's owner credential before a method runs.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager

import grpc

from leasehold._server.api import method_handlers, validation
from leasehold._server.api.call_gate import CallGate, calling_owner, name_job
from leasehold._server.api.convert import event_to_proto, feed_event_to_proto, job_to_proto, timestamp
from leasehold._server.api.method_handlers import decode
from leasehold._server.api.page_token import PageTokenCodec
from leasehold._server.api.request_keys import request_key
from leasehold._server.api.rpc_outcomes import RpcObserver, unobserved
from leasehold._server.api.trace_context import traceparent_of
from leasehold._server.api.watch_streams import WatchStreams
from leasehold._server.clock import Clock, SystemClock
from leasehold._server.jobs import owner_stats, steering
from leasehold._server.jobs.errors import KindNotServed
from leasehold._server.jobs.idempotency import Method
from leasehold._server.jobs.owner_feed import follow_feed
from leasehold._server.jobs.owner_limits import NO_LIMITS, OwnerQuotas, Wanted
from leasehold._server.jobs.records import JobStatus
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import ServedKinds
from leasehold._server.jobs.state_machine import DEFAULT_CANCEL_GRACE_SECONDS
from leasehold._server.jobs.watch import follow_events
from leasehold.v1 import jobs_pb2

SERVICE = jobs_pb2.DESCRIPTOR.services_by_name["JobService"]
SERVICE_NAME = SERVICE.full_name  # "leasehold.v1.JobService"


class JobServiceServicer:
    def __init__(
        self,
        repository: JobRepository,
        serves: ServedKinds,
        page_tokens: PageTokenCodec,
        cancel_grace_seconds: float = DEFAULT_CANCEL_GRACE_SECONDS,
        clock: Clock | None = None,
        worked: Callable[[str], bool] | None = None,
        watch_streams: Callable[[], AbstractContextManager[object]] | None = None,
        watch_slots: WatchStreams | None = None,
        quotas: OwnerQuotas | None = None,
    ) -> None:
        """`serves(kind)`: whether a local handler or a remote-kind pattern
        serves `kind` (Enqueue and Retry accept only those); `worked(kind)`:
        whether a worker is there to run it now (an in-process handler, or a
        remote worker asking for it), for Get's wait reason; `watch_streams()`:
        held while a WatchEvents stream is open (the metrics' gauge);
        `quotas`: the per-owner limits on kinds and resource types (none
        when not given)."""
        self._repository = repository
        self._clock = clock or SystemClock()
        self._worked = worked or serves
        self._serves = serves
        self._page_tokens = page_tokens
        self._cancel_grace_seconds = cancel_grace_seconds
        self._watch_streams = watch_streams or contextlib.nullcontext
        self._watch_slots = watch_slots or WatchStreams()
        self.quotas = quotas or OwnerQuotas(repository, NO_LIMITS)

    def owner_of(self, context: grpc.aio.ServicerContext) -> str:
        """The calling owner, as the call gate checked it (ScheduleService asks
        the same way)."""
        return calling_owner()

    async def enqueue(self, data: bytes, context: grpc.aio.ServicerContext) -> jobs_pb2.EnqueueResponse:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.EnqueueRequest, data)
        traceparent = traceparent_of(context.invocation_metadata() or (), "Enqueue", owner)
        key = request_key(owner, Method.ENQUEUE, request)
        new_job = validation.new_job(owner, request, self._serves, self._clock.now(), traceparent)
        async with self.quotas.admitting(Wanted.jobs([new_job], batch=False)):
            if key is None:
                job, created = await self._repository.enqueue(new_job)
            else:
                ((job, created),) = (await self._repository.enqueue_once([new_job], key)).answers
        return jobs_pb2.EnqueueResponse(job=job_to_proto(job), created=created)

    async def batch_enqueue(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> jobs_pb2.BatchEnqueueResponse:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.BatchEnqueueRequest, data)
        # Every item is checked before anything is written: one bad item
        # refuses the whole batch, and the batch is then one transaction.
        traceparent = traceparent_of(context.invocation_metadata() or (), "BatchEnqueue", owner)
        key = request_key(owner, Method.BATCH_ENQUEUE, request)
        new_jobs = validation.new_jobs(owner, request, self._serves, self._clock.now(), traceparent)
        async with self.quotas.admitting(Wanted.jobs(new_jobs, batch=True)):
            if key is None:
                answers = await self._repository.enqueue_batch(new_jobs)
            else:
                answers = (await self._repository.enqueue_once(new_jobs, key)).answers
        return jobs_pb2.BatchEnqueueResponse(
            responses=[
                jobs_pb2.EnqueueResponse(job=job_to_proto(job), created=created) for job, created in answers
            ]
        )

    async def get(self, data: bytes, context: grpc.aio.ServicerContext) -> jobs_pb2.GetResponse:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.GetRequest, data)
        job = await self._repository.get(owner, name_job(validation.job_id(request.job_id)))
        if job.status is not JobStatus.QUEUED:
            return jobs_pb2.GetResponse(job=job_to_proto(job))
        occupancy = await self._repository.occupancy(owner, job.kind)
        served = self._worked(job.kind) or occupancy.kind_running > 0
        reason = steering.wait_reason(self._repository.steering, job, self._clock.now(), occupancy, served)
        return jobs_pb2.GetResponse(job=job_to_proto(job, reason))

    async def list(self, data: bytes, context: grpc.aio.ServicerContext) -> jobs_pb2.ListResponse:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.ListRequest, data)
        size = validation.page_size(request.page_size)
        job_filter = validation.job_filter(request)
        after = (
            self._page_tokens.decode(owner, job_filter, request.page_token) if request.page_token else None
        )
        page = await self._repository.list_jobs(owner, job_filter, size, after)
        next_token = (
            self._page_tokens.encode(owner, job_filter, page.next_cursor)
            if page.next_cursor is not None
            else ""
        )
        return jobs_pb2.ListResponse(
            jobs=[job_to_proto(job) for job in page.jobs], next_page_token=next_token
        )

    async def get_stats(self, data: bytes, context: grpc.aio.ServicerContext) -> jobs_pb2.GetStatsResponse:
        owner = self.owner_of(context)
        decode(jobs_pb2.GetStatsRequest, data)
        return stats_to_proto(await self._repository.owner_stats(owner))

    async def cancel(self, data: bytes, context: grpc.aio.ServicerContext) -> jobs_pb2.CancelResponse:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.CancelRequest, data)
        job_id = name_job(validation.job_id(request.job_id))
        job = await self._repository.cancel(owner, job_id, self._cancel_grace_seconds)
        return jobs_pb2.CancelResponse(job=job_to_proto(job))

    async def retry(self, data: bytes, context: grpc.aio.ServicerContext) -> jobs_pb2.RetryResponse:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.RetryRequest, data)
        job_id = name_job(validation.job_id(request.job_id))
        key = request_key(owner, Method.RETRY, request)
        source = await self._repository.get(owner, job_id)
        if not self._serves(source.kind):
            raise KindNotServed(source.kind, self._serves.refusal(source.kind))
        if key is None:
            # Not idempotent: each call makes a new job (the source stays retryable).
            job = await self._repository.retry(owner, job_id)
        else:
            ((job, _),) = (await self._repository.retry_once(owner, job_id, key)).answers
        return jobs_pb2.RetryResponse(job=job_to_proto(job))

    async def watch_events(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.WatchEventsResponse]:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.WatchEventsRequest, data)
        job_id = name_job(validation.job_id(request.job_id))
        after = validation.after_sequence(request.after_sequence)
        slots = self._watch_slots
        # RESOURCE_EXHAUSTED naming the limit, or UNAVAILABLE when draining, before the gauge counts it.
        with slots.slot(owner), self._watch_streams():
            async for event in follow_events(self._repository, owner, job_id, after, slots.draining):
                yield jobs_pb2.WatchEventsResponse(event=event_to_proto(event))

    async def subscribe(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[jobs_pb2.SubscribeResponse]:
        owner = self.owner_of(context)
        request = decode(jobs_pb2.SubscribeRequest, data)
        after, wanted = validation.subscribe_request(request)
        slots = self._watch_slots
        # The watch streams' limits and gauge count these streams too.
        with slots.slot(owner), self._watch_streams():
            async for numbered in follow_feed(
                self._repository, owner, after, wanted, tail=request.tail, stopping=slots.draining
            ):
                yield feed_event_to_proto(numbered)

    def generic_handler(
        self, gate: CallGate, rpc_finished: RpcObserver = unobserved
    ) -> grpc.GenericRpcHandler:
        """Every RPC `leasehold.v1.JobService` declares, bound to the method of the
        same name in snake_case and behind `gate` (the owner role); one missing
        fails here, at start-up."""
        return method_handlers.generic_handler(SERVICE, self, gate, rpc_finished)


def counts_to_proto(counts: owner_stats.JobCounts) -> jobs_pb2.JobCounts:
    return jobs_pb2.JobCounts(
        queued=counts.queued,
        running=counts.running,
        succeeded=counts.succeeded,
        failed=counts.failed,
        cancelled=counts.cancelled,
    )


def stats_to_proto(stats: owner_stats.OwnerStats) -> jobs_pb2.GetStatsResponse:
    return jobs_pb2.GetStatsResponse(
        total=counts_to_proto(stats.total),
        kinds=[
            jobs_pb2.KindJobCounts(kind=kind, counts=counts_to_proto(counts)) for kind, counts in stats.kinds
        ],
        kinds_truncated=stats.kinds_truncated,
        computed_at=timestamp(stats.computed_at),
    )
