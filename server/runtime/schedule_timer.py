"""The schedule timer: fires due schedules on every replica.

Any replica may fire a schedule and none double-fires it (the repository's
`fire_due_schedules` enqueues one job per firing, however many replicas ask),
so every replica runs this. It sleeps until the earliest next fire time, but
never longer than `SCHEDULE_POLL_SECONDS`, so a schedule created or resumed on
another replica, or left by a replica that died, fires on time here.
"""

from __future__ import annotations

import structlog

from leasehold._server.clock import Clock
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.schedules import SCHEDULE_POLL_SECONDS
from leasehold._server.runtime.maintenance import Maintenance

log = structlog.get_logger("leasehold.runtime")


class ScheduleTimer(Maintenance):
    name = "schedule_timer"

    def __init__(
        self, repository: JobRepository, clock: Clock, poll_seconds: float = SCHEDULE_POLL_SECONDS
    ) -> None:
        super().__init__()
        self._repository = repository
        self._clock = clock
        self._poll = poll_seconds

    async def round(self) -> float:
        upcoming = await self._repository.fire_due_schedules()
        if upcoming is None:
            return self._poll
        return min(self._poll, (upcoming - self._clock.now()).total_seconds())
