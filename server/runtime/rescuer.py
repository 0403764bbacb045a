"""The rescuer: expired leases recovered on a timer, not only inside a claim.

A claim recovers expired leases before it leases new work, but a replica whose
slots are all busy does not claim, and a kind that only remote workers serve may
never be claimed here at all. Without a timer, a job whose worker stalled or died
would then stay `running` until some slot freed somewhere. The rescuer runs on
every replica; the repository makes that safe (each expired lease is recovered
once, however many processes ask at the same moment).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import structlog

from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.maintenance import Maintenance

log = structlog.get_logger("leasehold.runtime")


def log_lease_expired(job_ids: Iterable[str]) -> None:
    """Log each recovered lease the same way whoever recovered it (a claim or the
    rescuer): an expiry means a worker stalled or died, so it is a warning."""
    for job_id in job_ids:
        log.warning("job.lease_expired", job_id=job_id)


class Rescuer(Maintenance):
    """Calls `repository.recover_expired_leases()` at start (leases that ran out
    while no process was up come back at once), then every `interval_seconds`,
    a failed round included (it logs `runtime.rescue_failed`).

    The recovered jobs' new state is announced on the repository's change hub by
    the engine, which wakes idle claimers; the rescuer itself only logs."""

    name = "rescue"

    def __init__(self, repository: JobRepository, interval_seconds: float) -> None:
        if not 0 < interval_seconds < math.inf:  # also refuses NaN
            raise ValueError("interval_seconds: must be a positive number of seconds")
        super().__init__()
        self._repository = repository
        self._interval = interval_seconds
        self.retry_seconds = interval_seconds

    async def run_once(self) -> list[str]:
        """Recover every expired lease now; returns the recovered job ids. Storage
        errors reach the caller (the timer logs them and tries again later)."""
        recovered = [job.job_id for job in await self._repository.recover_expired_leases()]
        log_lease_expired(recovered)
        return recovered

    async def round(self) -> float:
        await self.run_once()
        return self._interval
