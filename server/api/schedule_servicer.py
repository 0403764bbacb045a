"""`leasehold.v1.ScheduleService` over grpc.aio.

Owner-scoped exactly like JobService: the call gate checks the owner
credential before anything else (a worker credential is no owner), and another owner's schedule answers as
a missing one does (`ScheduleNotFound`, one status for both).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import grpc

from leasehold._server.api import method_handlers, schedule_validation, validation
from leasehold._server.api.call_gate import CallGate
from leasehold._server.api.convert import job_to_proto, schedule_to_proto
from leasehold._server.api.method_handlers import decode
from leasehold._server.api.page_token import PageTokenCodec
from leasehold._server.api.rpc_outcomes import RpcObserver, unobserved
from leasehold._server.clock import Clock
from leasehold._server.jobs.errors import KindNotServed
from leasehold._server.jobs.owner_limits import NO_LIMITS, OwnerQuotas, Wanted
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import ServedKinds
from leasehold.v1 import schedules_pb2

SERVICE = schedules_pb2.DESCRIPTOR.services_by_name["ScheduleService"]
SCHEDULE_SERVICE_NAME = SERVICE.full_name  # "leasehold.v1.ScheduleService"
# What a schedule page token is bound to, besides its owner.
_PAGE_SCOPE = "schedules"


class ScheduleServiceServicer:
    def __init__(
        self,
        repository: JobRepository,
        owner_of: Callable[[grpc.aio.ServicerContext], str],
        serves: ServedKinds,
        page_tokens: PageTokenCodec,
        clock: Clock,
        on_change: Callable[[], None] = lambda: None,
        quotas: OwnerQuotas | None = None,
    ) -> None:
        """`owner_of`: JobService's own owner resolution; `on_change()`: a
        schedule's next fire time may have moved (the timer looks again);
        `quotas`: the per-owner limits (JobService's own, so that a schedule
        and an Enqueue inventing kinds at once are counted together)."""
        self._repository = repository
        self._owner_of = owner_of
        self._serves = serves
        self._page_tokens = page_tokens
        self._clock = clock
        self._on_change = on_change
        self._quotas = quotas or OwnerQuotas(repository, NO_LIMITS)

    async def create_schedule(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.CreateScheduleResponse:
        owner = self._owner_of(context)
        request = decode(schedules_pb2.CreateScheduleRequest, data)
        # In a thread: a cron rule is the caller's to write, and even bounded, its
        # evaluation is CPU that other callers' calls must not queue behind.
        new = await asyncio.to_thread(
            schedule_validation.new_schedule, owner, request, self._serves, self._clock.now()
        )
        async with self._quotas.admitting(Wanted.schedule(owner, new.template.kind)):
            schedule = await self._repository.create_schedule(new)
        self._on_change()
        return schedules_pb2.CreateScheduleResponse(schedule=schedule_to_proto(schedule))

    async def get_schedule(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.GetScheduleResponse:
        owner = self._owner_of(context)
        request = decode(schedules_pb2.GetScheduleRequest, data)
        schedule_id = schedule_validation.schedule_id(request.schedule_id)
        schedule = await self._repository.get_schedule(owner, schedule_id)
        return schedules_pb2.GetScheduleResponse(schedule=schedule_to_proto(schedule))

    async def list_schedules(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.ListSchedulesResponse:
        owner = self._owner_of(context)
        request = decode(schedules_pb2.ListSchedulesRequest, data)
        size = validation.page_size(request.page_size)
        after = (
            self._page_tokens.decode_position(owner, _PAGE_SCOPE, request.page_token)
            if request.page_token
            else None
        )
        page = await self._repository.list_schedules(owner, size, after)
        next_token = (
            self._page_tokens.encode_position(owner, _PAGE_SCOPE, page.next_cursor)
            if page.next_cursor is not None
            else ""
        )
        return schedules_pb2.ListSchedulesResponse(
            schedules=[schedule_to_proto(schedule) for schedule in page.schedules],
            next_page_token=next_token,
        )

    async def pause_schedule(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.PauseScheduleResponse:
        owner = self._owner_of(context)
        request = decode(schedules_pb2.PauseScheduleRequest, data)
        schedule_id = schedule_validation.schedule_id(request.schedule_id)
        schedule = await self._repository.set_schedule_paused(owner, schedule_id, True)
        return schedules_pb2.PauseScheduleResponse(schedule=schedule_to_proto(schedule))

    async def resume_schedule(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.ResumeScheduleResponse:
        owner = self._owner_of(context)
        request = decode(schedules_pb2.ResumeScheduleRequest, data)
        schedule_id = schedule_validation.schedule_id(request.schedule_id)
        schedule = await self._repository.set_schedule_paused(owner, schedule_id, False)
        self._on_change()
        return schedules_pb2.ResumeScheduleResponse(schedule=schedule_to_proto(schedule))

    async def delete_schedule(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.DeleteScheduleResponse:
        owner = self._owner_of(context)
        request = decode(schedules_pb2.DeleteScheduleRequest, data)
        schedule_id = schedule_validation.schedule_id(request.schedule_id)
        await self._repository.delete_schedule(owner, schedule_id)
        return schedules_pb2.DeleteScheduleResponse()

    async def trigger_schedule(
        self, data: bytes, context: grpc.aio.ServicerContext
    ) -> schedules_pb2.TriggerScheduleResponse:
        owner = self._owner_of(context)
        request = decode(schedules_pb2.TriggerScheduleRequest, data)
        schedule_id = schedule_validation.schedule_id(request.schedule_id)
        current = await self._repository.get_schedule(owner, schedule_id)
        if not self._serves(current.template.kind):  # as Retry refuses it
            raise KindNotServed(current.template.kind, self._serves.refusal(current.template.kind))
        schedule, job = await self._repository.trigger_schedule(owner, schedule_id)
        return schedules_pb2.TriggerScheduleResponse(
            schedule=schedule_to_proto(schedule), job=job_to_proto(job)
        )

    def generic_handler(
        self, gate: CallGate, rpc_finished: RpcObserver = unobserved
    ) -> grpc.GenericRpcHandler:
        return method_handlers.generic_handler(SERVICE, self, gate, rpc_finished)
