"""The rescuer: expired leases recovered on a timer, not only inside a claim.

A claim recovers expired leases before it leases new work, but a replica whose
slots are all busy does not claim, and a kind that only remote workers serve may
never be claimed here at all. Without a timer, a job whose worker stalled or died
would then stay `running` until some slot freed somewhere. The rescuer runs on
every replica; the repository makes that safe (each expired lease is recovered
once, however many processes ask at the same moment).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable

import structlog

from leasehold._server.jobs.errors import StorageFull, StorageUnavailable
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.asyncio_helpers import cancel_and_wait

log = structlog.get_logger("leasehold.runtime")


def log_lease_expired(job_ids: Iterable[str]) -> None:
    """Log each recovered lease the same way whoever recovered it (a claim or the
    rescuer): an expiry means a worker stalled or died, so it is a warning."""
    for job_id in job_ids:
        log.warning("job.lease_expired", job_id=job_id)


class Rescuer:
    """Calls `repository.recover_expired_leases()` every `interval_seconds`.

    The recovered jobs' new state is announced on the repository's change hub by
    the engine, which wakes idle claimers; the rescuer itself only logs."""

    def __init__(self, repository: JobRepository, interval_seconds: float) -> None:
        if not 0 < interval_seconds < math.inf:  # also refuses NaN
            raise ValueError("interval_seconds: must be a positive number of seconds")
        self._repository = repository
        self._interval = interval_seconds
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Start the timer. Calling it again while running does nothing."""
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.create_task(self._loop(), name="leasehold-rescuer")

    async def stop(self) -> None:
        """Stop the timer, even in the middle of a recovery: the storage writer
        commits that write or not on its own (if it commits, only the log lines are
        lost; the jobs' event logs have it), so there is nothing to wait for."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def run_once(self) -> list[str]:
        """Recover every expired lease now; returns the recovered job ids. Storage
        errors reach the caller (the timer logs them and tries again later)."""
        recovered = [job.job_id for job in await self._repository.recover_expired_leases()]
        log_lease_expired(recovered)
        return recovered

    async def _loop(self) -> None:
        # Sleep first: at start-up the claim loop's first claim recovers anyway.
        while True:
            await asyncio.sleep(self._interval)
            await self._run_logging_errors()

    async def _run_logging_errors(self) -> None:
        """One round that never ends the timer: the next round tries again, which
        is the right answer to a database that is briefly away or full."""
        try:
            await self.run_once()
        except (StorageUnavailable, StorageFull) as exc:
            log.warning("runtime.rescue_failed", error=str(exc))
        except Exception as exc:  # a bug must not stop every later recovery
            log.error("runtime.rescue_failed", error_class=type(exc).__name__, exc_info=exc)
