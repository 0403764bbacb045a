"""ScheduleService calls, shared by `Client` (schedules belong to the caller)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from leasehold.client._convert import struct
from leasehold.client._pages import every_item
from leasehold.client._session import Session
from leasehold.v1 import jobs_pb2, schedules_pb2, schedules_pb2_grpc


class ScheduleCalls:
    def __init__(self, session: Session) -> None:
        self._schedule_session = session
        self._schedules = schedules_pb2_grpc.ScheduleServiceStub(session.channel)

    async def create_schedule(
        self,
        schedule_id: str,
        cron: str,
        kind: str,
        payload: Mapping[str, Any] | None = None,
        *,
        time_zone: str = "",
        max_attempts: int = 0,
        timeout_seconds: int = 0,
        priority: int = 0,
        retry_policy: jobs_pb2.RetryPolicy | None = None,
        overlap: schedules_pb2.OverlapPolicy = schedules_pb2.OVERLAP_POLICY_UNSPECIFIED,
        catchup_window_seconds: int = 0,
        paused: bool = False,
    ) -> schedules_pb2.Schedule:
        """Create a schedule. Not retried after UNAVAILABLE: CreateSchedule carries
        no request_id; a repeat would answer ALREADY_EXISTS, so the caller decides."""
        job = schedules_pb2.ScheduleJob(
            kind=kind,
            payload=struct(payload),
            max_attempts=max_attempts,
            timeout_seconds=timeout_seconds,
            priority=priority,
            retry_policy=retry_policy,
        )
        request = schedules_pb2.CreateScheduleRequest(
            schedule_id=schedule_id,
            cron=cron,
            time_zone=time_zone,
            job=job,
            overlap=overlap,
            catchup_window_seconds=catchup_window_seconds,
            paused=paused,
        )
        session = self._schedule_session
        response: schedules_pb2.CreateScheduleResponse = await self._schedules.CreateSchedule(
            request, metadata=session.metadata, timeout=session.retry.attempt_timeout_seconds
        )
        return response.schedule

    async def get_schedule(self, schedule_id: str) -> schedules_pb2.Schedule:
        response: schedules_pb2.GetScheduleResponse = await self._schedule_session.read(
            self._schedules.GetSchedule, schedules_pb2.GetScheduleRequest(schedule_id=schedule_id)
        )
        return response.schedule

    async def list_schedules_page(
        self, *, page_token: str = "", page_size: int = 0
    ) -> schedules_pb2.ListSchedulesResponse:
        request = schedules_pb2.ListSchedulesRequest(page_token=page_token, page_size=page_size)
        response: schedules_pb2.ListSchedulesResponse = await self._schedule_session.read(
            self._schedules.ListSchedules, request
        )
        return response

    async def list_schedules(self, *, page_size: int = 0) -> AsyncIterator[schedules_pb2.Schedule]:
        async for schedule in every_item(
            lambda token: self.list_schedules_page(page_token=token, page_size=page_size),
            lambda page: page.schedules,
        ):
            yield schedule

    async def pause_schedule(self, schedule_id: str) -> schedules_pb2.Schedule:
        response: schedules_pb2.PauseScheduleResponse = await self._schedule_session.write(
            self._schedules.PauseSchedule, schedules_pb2.PauseScheduleRequest(schedule_id=schedule_id)
        )
        return response.schedule

    async def resume_schedule(self, schedule_id: str) -> schedules_pb2.Schedule:
        response: schedules_pb2.ResumeScheduleResponse = await self._schedule_session.write(
            self._schedules.ResumeSchedule, schedules_pb2.ResumeScheduleRequest(schedule_id=schedule_id)
        )
        return response.schedule

    async def delete_schedule(self, schedule_id: str) -> None:
        """Not retried: a repeat after a lost answer would say NOT_FOUND for a delete
        that succeeded."""
        session = self._schedule_session
        await self._schedules.DeleteSchedule(
            schedules_pb2.DeleteScheduleRequest(schedule_id=schedule_id),
            metadata=session.metadata,
            timeout=session.retry.attempt_timeout_seconds,
        )

    async def trigger_schedule(self, schedule_id: str) -> schedules_pb2.TriggerScheduleResponse:
        """One firing now. Not retried: a repeat would fire twice."""
        session = self._schedule_session
        response: schedules_pb2.TriggerScheduleResponse = await self._schedules.TriggerSchedule(
            schedules_pb2.TriggerScheduleRequest(schedule_id=schedule_id),
            metadata=session.metadata,
            timeout=session.retry.attempt_timeout_seconds,
        )
        return response
