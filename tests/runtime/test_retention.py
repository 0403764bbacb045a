"""The retention sweeper and the schedule timer, on every engine, on the manual
clock: what `serve` runs on every replica."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta

import pytest
import structlog

from leasehold._server.clock import ManualClock
from leasehold._server.config import Settings, describe_duration, parse_duration
from leasehold._server.jobs.errors import JobNotFound
from leasehold._server.jobs.idempotency import REQUEST_ID_WINDOW, Method, RequestKey
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.schedules import FiringRound
from leasehold._server.runtime.retention import RETENTION_SHARE, RetentionSweeper, rest_after
from leasehold._server.runtime.schedule_timer import HELD_ROW_REST_SECONDS, ScheduleTimer
from tests.contract.helpers import claim_one, enqueue
from tests.contract.test_schedules import fired, schedule
from tests.support import OWNER


async def test_a_sweep_deletes_every_expired_job_batch_by_batch(
    repository: JobRepository, clock: ManualClock
) -> None:
    finished = []
    for _ in range(7):
        job_id = await enqueue(repository)
        await repository.succeed((await claim_one(repository)).lease)
        finished.append(job_id)
    clock.advance(3600)
    kept = await enqueue(repository)
    sweeper = RetentionSweeper(repository, clock, retention_seconds=1800, batch=3)
    assert await sweeper.sweep() == 7
    for job_id in finished:
        with pytest.raises(JobNotFound):
            await repository.get(OWNER, job_id)
    await repository.get(OWNER, kept)
    assert await sweeper.sweep() == 0


async def test_a_sweep_keeps_what_finished_within_the_retention(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    await repository.succeed((await claim_one(repository)).lease)
    clock.advance(1799)
    assert await RetentionSweeper(repository, clock, retention_seconds=1800).sweep() == 0
    await repository.get(OWNER, job_id)


@pytest.mark.parametrize("took", [0.0005, 0.013, 0.2])
def test_a_sweep_rests_so_that_deleting_takes_its_share_of_the_time(took: float) -> None:
    rest = rest_after(took)
    assert took / (took + rest) == pytest.approx(RETENTION_SHARE)
    assert RETENTION_SHARE <= 0.1  # what the retention benchmark's claim p99 needs


def test_a_sweepers_retention_is_not_negative() -> None:
    with pytest.raises(ValueError, match="0 keeps every job"):
        RetentionSweeper(None, ManualClock(), retention_seconds=-1)  # type: ignore[arg-type]


async def test_without_a_retention_a_round_keeps_jobs_but_forgets_request_ids_past_the_window(
    repository: JobRepository, clock: ManualClock
) -> None:
    key = RequestKey(OWNER, "req-1", Method.ENQUEUE, "a" * 64)
    new_job = NewJob(owner_id=OWNER, kind="example.echo", payload={})
    first = (await repository.enqueue_once([new_job], key)).answers[0][0]
    await repository.succeed((await claim_one(repository)).lease)
    sweeper = RetentionSweeper(repository, clock, retention_seconds=0, batch=3)
    clock.advance(REQUEST_ID_WINDOW.total_seconds() - 1)
    await sweeper.round()
    assert (await repository.enqueue_once([new_job], key)).repeated  # still within the window

    clock.advance(2)
    await sweeper.round()

    again = await repository.enqueue_once([new_job], key)
    assert not again.repeated and again.answers[0][0].id != first.id
    await repository.get(OWNER, first.id)  # the finished job is kept


async def test_forgetting_request_ids_goes_batch_by_batch(
    repository: JobRepository, clock: ManualClock
) -> None:
    new_job = NewJob(owner_id=OWNER, kind="example.echo", payload={})
    for n in range(7):
        await repository.enqueue_once([new_job], RequestKey(OWNER, f"req-{n}", Method.ENQUEUE, "a" * 64))
        clock.advance(1)
    clock.advance(REQUEST_ID_WINDOW.total_seconds())
    sweeper = RetentionSweeper(repository, clock, retention_seconds=1800, batch=3)

    assert await sweeper.forget_request_ids() == 7
    assert await sweeper.forget_request_ids() == 0


async def test_the_schedule_timer_sleeps_until_the_next_fire_time_at_most_its_poll(
    repository: JobRepository, clock: ManualClock
) -> None:
    timer = ScheduleTimer(repository, clock, poll_seconds=5)
    assert await timer.round() == 5  # nothing scheduled
    await repository.create_schedule(schedule(cron="* * * * *"))
    clock.advance(58)
    assert await timer.round() == pytest.approx(2)
    clock.advance(3)
    assert await timer.round() == 5  # fired; the next is 59 s away
    assert len(await fired(repository)) == 1


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0), ("30s", 30), ("15m", 900), ("12h", 43_200), ("7d", 604_800)],
)
def test_durations(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds
    assert describe_duration(seconds) == (text if seconds else "keep forever")


@pytest.mark.parametrize("text", ["", "7", "7w", "-1d", "1.5h", "0s", "d", "7 d", "99999d"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_the_default_retention_is_seven_days() -> None:
    assert Settings().retention_seconds == timedelta(days=7).total_seconds()
    with pytest.raises(ValueError, match="retention"):
        Settings(retention_seconds=-1)


async def test_the_timer_logs_firings_and_skips_by_schedule_owner_and_job_never_the_payload(
    repository: JobRepository, clock: ManualClock
) -> None:
    new = schedule(cron="0 * * * *")
    secret = "payload-secret-3f1c"
    await repository.create_schedule(replace(new, template=replace(new.template, payload={"s": secret})))
    clock.advance(3 * 3600 + 5)  # 01:00 and 02:00 skipped, 03:00 fired
    with structlog.testing.capture_logs() as records:
        await ScheduleTimer(repository, clock).round()
    (job,) = await fired(repository)
    by_event = {record["event"]: record for record in records}
    assert by_event["schedule.fired"] == {
        "event": "schedule.fired",
        "log_level": "info",
        "owner_id": OWNER,
        "schedule_id": "nightly",
        "fire_at": "2026-01-01T03:00:00+00:00",
        "job_id": job.id,
    }
    assert by_event["schedule.skipped"]["firings"] == 2
    assert by_event["schedule.skipped"]["reason"] == "catchup_window"
    assert secret not in repr(records)


async def test_the_timer_rests_while_another_replica_holds_a_due_schedule(clock: ManualClock) -> None:
    """PostgreSQL skips a due row another replica has locked, so the round ends
    with that schedule still due; asking again at once would spin the loop."""

    class HeldElsewhere:
        async def fire_due_schedules(self) -> FiringRound:
            return FiringRound([], clock.now() - timedelta(seconds=1))

    timer = ScheduleTimer(HeldElsewhere(), clock)  # type: ignore[arg-type]
    assert await timer.round() == HELD_ROW_REST_SECONDS > 0
