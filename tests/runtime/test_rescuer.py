"""The rescuer (DESIGN §9): expired leases are recovered on a timer, with no claim.

Each test stalls a worker the simple way: it claims a job through the repository
and then never renews it, and the manual clock moves past the lease. Nothing in
these tests claims again, so whatever recovers the job is the rescuer. The timer
itself runs on the event loop's clock (interval 0.05 s here); outcomes are waited
for on the change hub or by reading the repository with a deadline, never by
sleeping a fixed time and then asserting.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from structlog.testing import capture_logs

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import state_machine
from leasehold._server.jobs.errors import StorageUnavailable
from leasehold._server.jobs.records import JobStatus, RecoveredJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold._server.runtime.rescuer import Rescuer
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types
from tests.support import OWNER

TICK = 0.05  # the shortest rescue interval the settings allow


async def stalled_job(repository: JobRepository, clock: ManualClock, **fields: object) -> str:
    """A job claimed by a worker that then stalls: its lease is over by now."""
    job_id = await enqueue(repository, **fields)
    await claim_one(repository, "stalled-worker")
    clock.advance(LEASE + 1)
    return job_id


@asynccontextmanager
async def rescuing(repository: JobRepository, interval: float = TICK) -> AsyncIterator[Rescuer]:
    rescuer = Rescuer(repository, interval)
    await rescuer.start()
    try:
        yield rescuer
    finally:
        await rescuer.stop()


async def wait_for_event(
    repository: JobRepository, job_id: str, event_type: str, timeout: float = 10.0
) -> None:
    """Until the job's log holds `event_type`: woken by the job's committed events,
    with a slow re-read as the safety net."""
    async with asyncio.timeout(timeout):
        with repository.changes.watch_job(job_id) as changed:
            while event_type not in await event_types(repository, job_id):
                changed.take()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await changed.wait()


def rescuer_tasks() -> list[asyncio.Task[object]]:
    return [task for task in asyncio.all_tasks() if task.get_name() == "leasehold-rescue"]


# ----- run_once: what one round recovers ------------------------------------------------


async def test_run_once_requeues_a_stalled_job_without_any_claim(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await stalled_job(repository, clock)

    with capture_logs() as logs:
        recovered = await Rescuer(repository, TICK).run_once()

    assert recovered == [job_id]
    job = await repository.get(OWNER, job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 1)  # nobody claimed it again
    assert await event_types(repository, job_id) == ["job.queued", "job.started", "job.lease_expired"]
    assert [(r["event"], r["log_level"], r["job_id"]) for r in logs] == [
        ("job.lease_expired", "warning", job_id)
    ]


async def test_run_once_fails_a_stalled_job_with_no_attempts_left(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await stalled_job(repository, clock, max_attempts=1)

    assert await Rescuer(repository, TICK).run_once() == [job_id]

    job = await repository.get(OWNER, job_id)
    assert job.status is JobStatus.FAILED
    assert job.error_message == state_machine.LEASE_EXPIRED_ERROR_TEXT
    assert (await event_types(repository, job_id))[-2:] == ["job.lease_expired", "job.failed"]


async def test_run_once_cancels_a_stalled_job_whose_cancel_was_pending(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    await claim_one(repository, "stalled-worker")
    await repository.cancel(OWNER, job_id)
    clock.advance(LEASE + 1)

    assert await Rescuer(repository, TICK).run_once() == [job_id]

    assert (await repository.get(OWNER, job_id)).status is JobStatus.CANCELLED
    assert (await event_types(repository, job_id))[-2:] == ["job.lease_expired", "job.cancelled"]


async def test_run_once_leaves_a_live_lease_alone(repository: JobRepository, clock: ManualClock) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository, "live-worker")
    clock.advance(LEASE - 1)

    assert await Rescuer(repository, TICK).run_once() == []

    job = await repository.get(OWNER, job_id)
    assert (job.status, job.attempt) == (JobStatus.RUNNING, 1)
    assert await repository.cancel_requested(claimed.lease) is False  # the lease still holds


async def test_a_second_round_recovers_nothing_more(repository: JobRepository, clock: ManualClock) -> None:
    job_id = await stalled_job(repository, clock)
    rescuer = Rescuer(repository, TICK)

    assert await rescuer.run_once() == [job_id]
    assert await rescuer.run_once() == []
    assert (await event_types(repository, job_id)).count("job.lease_expired") == 1


# ----- the timer --------------------------------------------------------------------------


async def test_the_timer_recovers_with_nobody_calling_run_once(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await stalled_job(repository, clock)

    async with rescuing(repository):
        await wait_for_event(repository, job_id, "job.lease_expired")

    assert (await repository.get(OWNER, job_id)).status is JobStatus.QUEUED


async def test_the_timer_goes_on_recovering_leases_that_expire_later(
    repository: JobRepository, clock: ManualClock
) -> None:
    async with rescuing(repository):
        job_id = await stalled_job(repository, clock)
        await wait_for_event(repository, job_id, "job.lease_expired")
        await claim_one(repository, "another-stalled-worker")  # the same job, attempt 2
        clock.advance(LEASE + 1)

        async with asyncio.timeout(10):
            while (await event_types(repository, job_id)).count("job.lease_expired") < 2:
                await asyncio.sleep(0.01)

    job = await repository.get(OWNER, job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 2)


class FailingOnce:
    """The real repository, except that the first recovery raises `error`: fault
    injection around a real engine."""

    def __init__(self, inner: JobRepository, error: Exception) -> None:
        self._inner = inner
        self._error: Exception | None = error
        self.calls = 0

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        self.calls += 1
        error, self._error = self._error, None
        if error is not None:
            raise error
        return await self._inner.recover_expired_leases()


@pytest.mark.parametrize(
    ("error", "level", "traceback"),
    [
        (StorageUnavailable("database is locked"), "warning", False),
        (RuntimeError("a bug in the engine"), "error", True),
    ],
    ids=["storage", "unexpected"],
)
async def test_a_failed_round_is_logged_and_the_timer_goes_on(
    repository: JobRepository, clock: ManualClock, error: Exception, level: str, traceback: bool
) -> None:
    job_id = await stalled_job(repository, clock)
    flaky = FailingOnce(repository, error)

    with capture_logs() as logs:
        async with rescuing(flaky):  # type: ignore[arg-type]
            await wait_for_event(repository, job_id, "job.lease_expired")

    assert flaky.calls >= 2
    (failed,) = [r for r in logs if r["event"] == "runtime.rescue_failed"]
    assert failed["log_level"] == level
    assert ("exc_info" in failed) is traceback
    assert str(error) in str(failed.get("error") or failed.get("exc_info"))
    assert [r["job_id"] for r in logs if r["event"] == "job.lease_expired"] == [job_id]


# ----- start and stop ---------------------------------------------------------------------


class Stuck:
    """The real repository, except that a recovery never returns (a database that
    hangs); `entered` is set once the rescuer is inside the call."""

    def __init__(self, inner: JobRepository) -> None:
        self._inner = inner
        self.entered = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def recover_expired_leases(self) -> list[RecoveredJob]:
        self.entered.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_stop_ends_the_task_even_in_the_middle_of_a_recovery(repository: JobRepository) -> None:
    stuck = Stuck(repository)
    rescuer = Rescuer(stuck, TICK)  # type: ignore[arg-type]
    await rescuer.start()
    (task,) = rescuer_tasks()
    await asyncio.wait_for(stuck.entered.wait(), 10)

    async with asyncio.timeout(5):  # not wait_for: its own task would give the cancel time
        await rescuer.stop()

    assert task.done() and task.cancelled()
    assert rescuer_tasks() == []
    await rescuer.stop()  # stopping again is harmless


async def test_start_is_idempotent_and_a_stopped_rescuer_starts_again(
    repository: JobRepository, clock: ManualClock
) -> None:
    rescuer = Rescuer(repository, TICK)
    await rescuer.start()
    await rescuer.start()
    assert len(rescuer_tasks()) == 1
    await rescuer.stop()
    assert rescuer_tasks() == []

    job_id = await stalled_job(repository, clock)
    await rescuer.start()
    try:
        await wait_for_event(repository, job_id, "job.lease_expired")
    finally:
        await rescuer.stop()


# ----- settings ---------------------------------------------------------------------------


def test_the_rescue_interval_defaults_to_a_quarter_of_the_lease() -> None:
    assert RuntimeSettings().rescue_interval == 7.5
    assert RuntimeSettings(lease_seconds=6).rescue_interval == 1.5
    assert RuntimeSettings(lease_seconds=6, rescue_seconds=6).rescue_interval == 6
    assert RuntimeSettings(rescue_seconds=0.05).rescue_interval == 0.05


@pytest.mark.parametrize("seconds", [0.01, 0.0, -1.0, 30.5, math.nan, math.inf])
def test_a_rescue_interval_outside_0_05_to_the_lease_is_refused(seconds: float) -> None:
    with pytest.raises(ValueError, match="rescue_seconds"):
        RuntimeSettings(lease_seconds=30, rescue_seconds=seconds)


@pytest.mark.parametrize("seconds", [0.0, -1.0, math.nan, math.inf])
def test_a_rescuer_needs_a_positive_interval(seconds: float) -> None:
    with pytest.raises(ValueError, match="interval_seconds"):
        Rescuer(None, seconds)  # type: ignore[arg-type]
