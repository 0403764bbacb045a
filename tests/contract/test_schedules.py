"""Schedules and retention, on every engine, on the manual clock (DESIGN §12).

Firings are driven by hand: the clock is moved to a fire time (plus a little
lateness, as a real timer has) and `fire_due_schedules` is called, as the
schedule timer would. What fired is read back as the jobs whose resource is
`leasehold.schedule` / `<id>@<fire time>`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.cron import CronRule
from leasehold._server.jobs.errors import JobNotFound, ScheduleExists, ScheduleNotFound
from leasehold._server.jobs.records import Job, JobFilter, JobStatus, PageCursor
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.schedules import (
    SCHEDULE_RESOURCE_TYPE,
    JobTemplate,
    NewSchedule,
    OverlapPolicy,
    SkipReason,
    rfc3339,
)
from tests.contract.helpers import claim_one, enqueue
from tests.support import OTHER_OWNER, OWNER

LATE = 2.0  # seconds a timer wakes after a fire time


def schedule(
    schedule_id: str = "nightly",
    cron: str = "* * * * *",
    zone: str = "UTC",
    overlap: OverlapPolicy = OverlapPolicy.ALLOW,
    window: int = 0,
    paused: bool = False,
    owner: str = OWNER,
) -> NewSchedule:
    return NewSchedule(
        owner_id=owner,
        schedule_id=schedule_id,
        rule=CronRule.parse(cron, zone),
        template=JobTemplate(kind="example.echo", payload={"from": schedule_id}, priority=2),
        overlap=overlap,
        catchup_window_seconds=window,
        paused=paused,
    )


def move_to(clock: ManualClock, moment: datetime) -> None:
    clock.advance((moment - clock.now()).total_seconds())


async def fired(repository: JobRepository, owner: str = OWNER) -> list[Job]:
    """Every job a schedule enqueued for `owner`, oldest first."""
    found: list[Job] = []
    cursor: PageCursor | None = None
    while True:
        page = await repository.list_jobs(owner, JobFilter(resource_type=SCHEDULE_RESOURCE_TYPE), 500, cursor)
        found.extend(page.jobs)
        if page.next_cursor is None:
            return found[::-1]
        cursor = page.next_cursor


def fire_times(jobs: list[Job], schedule_id: str = "nightly") -> list[str]:
    return [job.resource_id.removeprefix(f"{schedule_id}@") for job in jobs]


async def drive(repository: JobRepository, clock: ManualClock, until: datetime) -> None:
    """Fire every firing up to `until`, each `LATE` seconds after its time."""
    while True:
        upcoming = (await repository.fire_due_schedules()).next_fire_at
        if upcoming is None or upcoming > until:
            return
        move_to(clock, upcoming + timedelta(seconds=LATE))


@pytest.mark.parametrize(
    ("cron", "zone", "span"),
    [
        ("* * * * *", "UTC", timedelta(hours=3)),
        ("30 * * * *", "UTC", timedelta(days=3)),
        ("0 9 * * 1-5", "America/New_York", timedelta(days=366)),
        ("0 12 L * *", "Europe/Berlin", timedelta(days=366)),
    ],
    ids=["every-minute", "hourly-at-30", "weekdays-9-new-york", "last-day-of-month"],
)
async def test_firings_follow_the_rule(
    repository: JobRepository, clock: ManualClock, cron: str, zone: str, span: timedelta
) -> None:
    start = clock.now()
    await repository.create_schedule(schedule(cron=cron, zone=zone))
    await drive(repository, clock, start + span)
    expected = [rfc3339(moment) for moment in CronRule.parse(cron, zone).firings(start, start + span)]
    assert fire_times(await fired(repository)) == expected
    assert len(expected) > 2
    # Each job is the template's, under the firing's resource key.
    job = (await fired(repository))[0]
    assert (job.kind, job.priority, job.resource_type) == ("example.echo", 2, SCHEDULE_RESOURCE_TYPE)


async def test_a_schedule_shows_its_last_firing_and_next_fire_time(
    repository: JobRepository, clock: ManualClock
) -> None:
    created = await repository.create_schedule(schedule(cron="*/5 * * * *"))
    assert created.next_fire_at == clock.now() + timedelta(minutes=5)
    assert (created.last_fire_at, created.last_job_id) == (None, None)
    move_to(clock, created.next_fire_at + timedelta(seconds=LATE))
    fired_round = await repository.fire_due_schedules()
    assert fired_round.next_fire_at == created.next_fire_at + timedelta(minutes=5)
    after = await repository.get_schedule(OWNER, "nightly")
    (job,) = await fired(repository)
    assert (after.last_fire_at, after.last_job_id) == (created.next_fire_at, job.id)
    (outcome,) = fired_round.outcomes
    assert (outcome.schedule_id, outcome.fire_at, outcome.job_id, outcome.skipped) == (
        "nightly",
        created.next_fire_at,
        job.id,
        0,
    )
    assert after.next_fire_at == created.next_fire_at + timedelta(minutes=5)
    # Asking again before the next fire time fires nothing.
    await repository.fire_due_schedules()
    assert len(await fired(repository)) == 1


@pytest.mark.parametrize(
    ("window", "expected_jobs"),
    [(0, 0), (3600, 1)],
    ids=["window-0", "window-1h"],
)
async def test_a_restart_after_3_hours_catches_up_by_the_window(
    repository: JobRepository, clock: ManualClock, window: int, expected_jobs: int
) -> None:
    """Hourly at :00, down from 00:30 to 03:40: the firings of 01:00, 02:00 and
    03:00 were missed. With no window all three are skipped; with an hour, the
    latest (03:00, 40 minutes late) is enqueued once and the other two skipped."""
    start = clock.now()  # 00:00
    await repository.create_schedule(schedule(cron="0 * * * *", window=window))
    move_to(clock, start + timedelta(hours=3, minutes=40))
    await repository.fire_due_schedules()
    await repository.fire_due_schedules()  # a second replica, or a second look: nothing more
    jobs = await fired(repository)
    assert fire_times(jobs) == ["2026-01-01T03:00:00Z"][:expected_jobs]
    after = await repository.get_schedule(OWNER, "nightly")
    assert after.skipped_firings == 3 - expected_jobs
    assert after.last_skip_reason is SkipReason.CATCHUP_WINDOW
    assert after.last_skipped_fire_at == start + timedelta(hours=2 if expected_jobs else 3)
    assert after.next_fire_at == start + timedelta(hours=4)
    # And it goes on as before.
    move_to(clock, start + timedelta(hours=4, seconds=LATE))
    await repository.fire_due_schedules()
    assert fire_times(await fired(repository))[-1] == "2026-01-01T04:00:00Z"


async def test_a_firing_reached_late_but_within_the_on_time_allowance_is_enqueued(
    repository: JobRepository, clock: ManualClock
) -> None:
    """A window of 0 does not mean a timer that wakes a few seconds late skips:
    within ON_TIME_SECONDS a firing is on time."""
    start = clock.now()
    await repository.create_schedule(schedule(cron="0 * * * *", window=0))
    move_to(clock, start + timedelta(hours=1, seconds=14))
    await repository.fire_due_schedules()
    assert fire_times(await fired(repository)) == ["2026-01-01T01:00:00Z"]


async def test_overlap_skip_passes_over_firings_while_the_last_job_runs(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Every minute, and the first firing's job runs for 3 minutes: the three
    firings during its run are skipped and never queued; the next one after it
    ends is enqueued."""
    start = clock.now()
    await repository.create_schedule(schedule(cron="* * * * *", overlap=OverlapPolicy.SKIP))
    move_to(clock, start + timedelta(minutes=1, seconds=LATE))
    await repository.fire_due_schedules()
    (claimed,) = (await repository.claim("w1", 1, lease_seconds=600)).jobs
    for minute in (2, 3, 4):
        move_to(clock, start + timedelta(minutes=minute, seconds=LATE))
        await repository.fire_due_schedules()
    during = await repository.get_schedule(OWNER, "nightly")
    assert (during.skipped_firings, during.last_skip_reason) == (3, SkipReason.OVERLAP)
    assert during.last_skipped_fire_at == start + timedelta(minutes=4)
    assert len(await fired(repository)) == 1
    await repository.succeed(claimed.lease)
    move_to(clock, start + timedelta(minutes=5, seconds=LATE))
    await repository.fire_due_schedules()
    assert fire_times(await fired(repository)) == ["2026-01-01T00:01:00Z", "2026-01-01T00:05:00Z"]


async def test_overlap_allow_enqueues_while_the_last_job_is_still_queued(
    repository: JobRepository, clock: ManualClock
) -> None:
    start = clock.now()
    await repository.create_schedule(schedule(cron="* * * * *", overlap=OverlapPolicy.ALLOW))
    await drive(repository, clock, start + timedelta(minutes=3))
    jobs = await fired(repository)
    assert [job.status for job in jobs] == [JobStatus.QUEUED] * 3
    assert (await repository.get_schedule(OWNER, "nightly")).skipped_firings == 0


async def test_pause_stops_firings_and_resume_does_not_catch_them_up(
    repository: JobRepository, clock: ManualClock
) -> None:
    start = clock.now()
    await repository.create_schedule(schedule(cron="* * * * *", window=3600))
    paused = await repository.set_schedule_paused(OWNER, "nightly", True)
    assert paused.paused and paused.next_fire_at is None
    move_to(clock, start + timedelta(minutes=10, seconds=30))
    await repository.fire_due_schedules()
    assert await fired(repository) == []
    resumed = await repository.set_schedule_paused(OWNER, "nightly", False)
    assert resumed.next_fire_at == start + timedelta(minutes=11)
    await repository.fire_due_schedules()
    assert await fired(repository) == []
    # Pausing twice changes nothing.
    assert (await repository.set_schedule_paused(OWNER, "nightly", False)).updated_at == resumed.updated_at


async def test_a_schedule_created_paused_never_fires_until_resumed(
    repository: JobRepository, clock: ManualClock
) -> None:
    created = await repository.create_schedule(schedule(paused=True))
    assert created.paused and created.next_fire_at is None
    move_to(clock, clock.now() + timedelta(hours=1))
    await repository.fire_due_schedules()
    assert await fired(repository) == []


async def test_trigger_fires_once_now_whatever_pause_and_overlap_say(
    repository: JobRepository, clock: ManualClock
) -> None:
    await repository.create_schedule(schedule(cron="0 0 1 1 *", overlap=OverlapPolicy.SKIP, paused=True))
    clock.advance(90.5)
    first_schedule, first = await repository.trigger_schedule(OWNER, "nightly")
    clock.advance(1)
    _, second = await repository.trigger_schedule(OWNER, "nightly")
    assert first.resource_id == "nightly@2026-01-01T00:01:30.500000Z"
    assert first.id != second.id and first.status is JobStatus.QUEUED
    assert (first_schedule.last_job_id, first_schedule.last_fire_at) == (
        first.id,
        clock.now() - timedelta(seconds=1),
    )
    assert first_schedule.paused and first_schedule.next_fire_at is None
    assert [job.id for job in await fired(repository)] == [first.id, second.id]


async def test_delete_removes_the_schedule_and_keeps_its_jobs(
    repository: JobRepository, clock: ManualClock
) -> None:
    start = clock.now()
    await repository.create_schedule(schedule())
    await drive(repository, clock, start + timedelta(minutes=2))
    made = await fired(repository)
    await repository.delete_schedule(OWNER, "nightly")
    with pytest.raises(ScheduleNotFound):
        await repository.get_schedule(OWNER, "nightly")
    with pytest.raises(ScheduleNotFound):
        await repository.delete_schedule(OWNER, "nightly")
    move_to(clock, start + timedelta(minutes=5))
    await repository.fire_due_schedules()
    assert [job.id for job in await fired(repository)] == [job.id for job in made]
    assert len(made) == 2


async def test_schedules_are_owner_scoped(repository: JobRepository, clock: ManualClock) -> None:
    await repository.create_schedule(schedule())
    # The same id is another owner's own.
    theirs = await repository.create_schedule(schedule(owner=OTHER_OWNER))
    assert theirs.owner_id == OTHER_OWNER
    with pytest.raises(ScheduleExists):
        await repository.create_schedule(schedule())
    await repository.delete_schedule(OTHER_OWNER, "nightly")
    for call in (
        repository.get_schedule(OTHER_OWNER, "nightly"),
        repository.set_schedule_paused(OTHER_OWNER, "nightly", True),
        repository.trigger_schedule(OTHER_OWNER, "nightly"),
        repository.delete_schedule(OTHER_OWNER, "nightly"),
    ):
        with pytest.raises(ScheduleNotFound):
            await call
    assert (await repository.list_schedules(OTHER_OWNER, 10, None)).schedules == []
    assert [s.schedule_id for s in (await repository.list_schedules(OWNER, 10, None)).schedules] == [
        "nightly"
    ]


async def test_list_schedules_pages_in_id_order(repository: JobRepository) -> None:
    for name in ("c", "a", "e", "b", "d"):
        await repository.create_schedule(schedule(schedule_id=name))
    first = await repository.list_schedules(OWNER, 2, None)
    assert [s.schedule_id for s in first.schedules] == ["a", "b"] and first.next_cursor == "b"
    second = await repository.list_schedules(OWNER, 2, first.next_cursor)
    third = await repository.list_schedules(OWNER, 2, second.next_cursor)
    assert [s.schedule_id for s in second.schedules + third.schedules] == ["c", "d", "e"]
    assert third.next_cursor is None
    stored = first.schedules[0]
    assert (stored.cron, stored.time_zone, stored.template.payload) == ("* * * * *", "UTC", {"from": "a"})


# ----- retention ----------------------------------------------------------------------------


async def _finish(repository: JobRepository, clock: ManualClock, count: int, **fields: object) -> list[str]:
    ids = [await enqueue(repository, **fields) for _ in range(count)]
    for _ in ids:
        claimed = await claim_one(repository)
        await repository.succeed(claimed.lease)
    return ids


async def test_retention_deletes_exactly_the_expired_terminal_jobs_and_their_events(
    repository: JobRepository, clock: ManualClock
) -> None:
    old = await _finish(repository, clock, 3)
    cancelled = await enqueue(repository)
    await repository.cancel(OWNER, cancelled)
    clock.advance(3600)
    recent = await _finish(repository, clock, 2)
    running_id = await enqueue(repository)
    running = await claim_one(repository)
    assert running.job.id == running_id
    queued = await enqueue(repository)
    clock.advance(60)
    cutoff = clock.now() - timedelta(minutes=30)
    assert await repository.delete_expired(cutoff, 2) == 2  # a batch is at most its limit
    assert await repository.delete_expired(cutoff, 100) == 2
    assert await repository.delete_expired(cutoff, 100) == 0
    for job_id in (*old, cancelled):
        with pytest.raises(JobNotFound):
            await repository.get(OWNER, job_id)
        with pytest.raises(JobNotFound):
            await repository.list_events(OWNER, job_id, 0, 10)
    for job_id in (*recent, queued, running_id):
        await repository.get(OWNER, job_id)
        assert await repository.list_events(OWNER, job_id, 0, 10)
    # Queued and running jobs stay, whatever the cutoff.
    assert await repository.delete_expired(clock.now() + timedelta(days=365), 100) == 2  # `recent`
    assert (await repository.get(OWNER, queued)).status is JobStatus.QUEUED
    assert (await repository.get(OWNER, running_id)).status is JobStatus.RUNNING


async def test_retention_deletes_a_resource_keys_jobs_only_together_then_frees_the_key(
    repository: JobRepository, clock: ManualClock
) -> None:
    """A finished root whose retry is still queued stays: deleting it would let
    a second root job of the same key in. Once every job of the key has
    expired, all go, and the key is free for a new job."""
    (root,) = await _finish(repository, clock, 1, resource_type="doc", resource_id="d1")
    root_job = await repository.get(OWNER, root)
    assert root_job.status is JobStatus.SUCCEEDED
    # A root that succeeded cannot be retried; cancel a second key's root and retry it.
    second = await enqueue(repository, resource_type="doc", resource_id="d2")
    await repository.cancel(OWNER, second)
    child = await repository.retry(OWNER, second)
    clock.advance(3600)
    assert await repository.delete_expired(clock.now(), 100) == 1  # d1 only
    await repository.get(OWNER, second)
    claimed = await claim_one(repository)
    assert claimed.job.id == child.id
    await repository.succeed(claimed.lease)
    clock.advance(3600)
    assert await repository.delete_expired(clock.now(), 100) == 2
    fresh = await enqueue(repository, resource_type="doc", resource_id="d2")
    assert fresh not in (second, child.id)


async def test_a_deleted_firings_job_is_never_fired_again(
    repository: JobRepository, clock: ManualClock
) -> None:
    """The schedule's next fire time, not its jobs, says what has fired: retention
    deleting a firing's job does not make that firing due again."""
    start = clock.now()
    await repository.create_schedule(schedule(cron="0 * * * *", window=86_400))
    move_to(clock, start + timedelta(hours=1, seconds=LATE))
    await repository.fire_due_schedules()
    claimed = await claim_one(repository)
    await repository.succeed(claimed.lease)
    clock.advance(600)
    assert await repository.delete_expired(clock.now(), 100) == 1
    await repository.fire_due_schedules()
    assert await fired(repository) == []
    # With its job gone, overlap SKIP sees nothing running.
    assert (await repository.get_schedule(OWNER, "nightly")).last_job_id == claimed.job.id


def test_firings_use_rfc3339_utc() -> None:
    assert rfc3339(datetime(2026, 3, 8, 7, 0, tzinfo=UTC)) == "2026-03-08T07:00:00Z"
