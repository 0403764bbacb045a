"""Schedules above the engines: what `schedules.plan_firing` decides, stored
with the firing's job in one unit of work."""

from __future__ import annotations

from datetime import datetime

from leasehold._server.jobs import schedules
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.errors import (
    ScheduleNotFound,
)
from leasehold._server.jobs.operations.owner import OwnerOperations
from leasehold._server.jobs.operations.rows import Rows
from leasehold._server.jobs.records import (
    Job,
)

# Due schedules fired per unit of work.
FIRING_BATCH = 50


class ScheduleOperations(OwnerOperations):
    """Create, pause, delete, trigger and fire schedules: each firing's job is
    enqueued in the unit of work that moves its schedule on."""

    async def create_schedule(self, new_schedule: schedules.NewSchedule) -> schedules.Schedule:
        return await self._write(
            lambda rows: rows.insert_schedule(schedules.created(new_schedule, rows.now()))
        )

    @staticmethod
    def _owned_schedule(rows: Rows, owner_id: str, schedule_id: str) -> schedules.Schedule:
        found = rows.owned_schedule(owner_id, schedule_id)
        if found is None:
            raise ScheduleNotFound(schedule_id)
        return found

    async def set_schedule_paused(self, owner_id: str, schedule_id: str, paused: bool) -> schedules.Schedule:
        def op(rows: Rows) -> schedules.Schedule:
            current = self._owned_schedule(rows, owner_id, schedule_id)
            if current.paused == paused:
                return current
            changed = schedules.paused_at(current, paused, rows.now())
            rows.store_schedule(changed)
            return changed

        return await self._write(op)

    async def delete_schedule(self, owner_id: str, schedule_id: str) -> None:
        def op(rows: Rows) -> None:
            if not rows.delete_schedule(owner_id, schedule_id):
                raise ScheduleNotFound(schedule_id)

        await self._write(op)

    async def trigger_schedule(self, owner_id: str, schedule_id: str) -> tuple[schedules.Schedule, Job]:
        def op(rows: Rows) -> tuple[schedules.Schedule, Job]:
            now = rows.now()
            current = self._owned_schedule(rows, owner_id, schedule_id)
            job = self._enqueue_firing(rows, current, now, now)
            changed = schedules.triggered(current, job.id, now)
            rows.store_schedule(changed)
            return changed, job

        return await self._write(op)

    def _enqueue_firing(
        self, rows: Rows, schedule: schedules.Schedule, fire_at: datetime, now: datetime
    ) -> Job:
        """The firing's job: new, or the one another replica already made for it."""
        ((job, _created),) = self._enqueue_rows(rows, [schedules.firing_job(schedule, fire_at)], now)
        return job

    async def fire_due_schedules(self) -> schedules.FiringRound:
        outcomes: list[schedules.FiringOutcome] = []
        # A look that finds nothing due costs one indexed read, not a write
        # (on SQLite, the file's write lock) every few seconds.
        upcoming = await self._next_fire_at()
        if upcoming is None or upcoming > self._clock.now():
            return schedules.FiringRound(outcomes, upcoming)
        while True:
            batch = await self._write(self._fire_due_rows)
            outcomes.extend(batch)
            if len(batch) < FIRING_BATCH:
                break
        return schedules.FiringRound(outcomes, await self._next_fire_at())

    def _fire_due_rows(self, rows: Rows) -> list[schedules.FiringOutcome]:
        now = rows.now()
        outcomes = []
        for schedule in rows.due_schedules(now, FIRING_BATCH):
            previous = schedule.last_job_id
            running = (
                schedule.overlap is schedules.OverlapPolicy.SKIP
                and previous is not None
                and rows.job_status(previous) in sm.LIVE_STATUSES
            )
            firing = schedules.plan_firing(schedule, now, running)
            job_id = (
                None
                if firing.fire_at is None
                else self._enqueue_firing(rows, schedule, firing.fire_at, now).id
            )
            rows.store_schedule(schedules.after_firing(schedule, firing, job_id, now))
            outcomes.append(schedules.outcome(schedule, firing, job_id))
        return outcomes
