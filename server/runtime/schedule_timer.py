"""The schedule timer: fires due schedules on every replica.

Any replica may fire a schedule and none double-fires it (the repository's
`fire_due_schedules` enqueues one job per firing, however many replicas ask),
so every replica runs this. It sleeps until the earliest next fire time, but
never longer than `SCHEDULE_POLL_SECONDS`, so a schedule created or resumed on
another replica, or left by a replica that died, fires on time here.

A schedule still due after a round is one whose row another replica holds
(PostgreSQL's claim of due rows skips locked ones): that replica is firing it,
so this one rests `HELD_ROW_REST_SECONDS` rather than asking again at once.
"""

from __future__ import annotations

import structlog

from leasehold._server.clock import Clock
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.schedules import SCHEDULE_POLL_SECONDS, FiringOutcome
from leasehold._server.runtime.maintenance import Maintenance

log = structlog.get_logger("leasehold.runtime")

HELD_ROW_REST_SECONDS = 0.25


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
        fired = await self._repository.fire_due_schedules()
        for outcome in fired.outcomes:
            log_firing(outcome)
        if fired.next_fire_at is None:
            return self._poll
        until_next = (fired.next_fire_at - self._clock.now()).total_seconds()
        if until_next <= 0:
            return HELD_ROW_REST_SECONDS
        return min(self._poll, until_next)


def log_firing(outcome: FiringOutcome) -> None:
    """One line per firing decision, naming the schedule, its owner and the job
    (never the template's payload). A firing another replica enqueued first is
    logged by both: the job id is the same."""
    if outcome.fire_at is not None:
        log.info(
            "schedule.fired",
            owner_id=outcome.owner_id,
            schedule_id=outcome.schedule_id,
            fire_at=outcome.fire_at.isoformat(),
            job_id=outcome.job_id,
        )
    if outcome.skipped:
        log.info(
            "schedule.skipped",
            owner_id=outcome.owner_id,
            schedule_id=outcome.schedule_id,
            firings=outcome.skipped,
            reason=outcome.skip_reason.value if outcome.skip_reason else None,
        )
