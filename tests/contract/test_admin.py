"""AdminService's storage on every engine: the queue stats match the jobs known
to be there, listing pages across owners, bulk cancel and retry walk in
batches through the state machine, and a paused kind is never claimed."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import admin
from leasehold._server.jobs.admin import AdminFilter, KindStats, MinuteCount
from leasehold._server.jobs.records import JobFilter, JobStatus, PageCursor
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import ANY_KIND, KindFilter
from tests.contract.helpers import LEASE, enqueue
from tests.support import OWNER

EVERY = AdminFilter()


async def _finish(repository: JobRepository, clock: ManualClock) -> None:
    """One job of a.work succeeds, one of b.work fails, one of a.work is cancelled."""
    await enqueue(repository, kind="a.work")
    await enqueue(repository, kind="b.work", max_attempts=1)
    claimed = (await repository.claim("w1", 2, 600)).jobs
    by_kind = {c.job.kind: c for c in claimed}
    await repository.succeed(by_kind["a.work"].lease)
    clock.advance(60)
    await repository.fail(by_kind["b.work"].lease, "boom", retryable=False)
    cancelled = await enqueue(repository, kind="a.work")
    await repository.cancel(OWNER, cancelled)


async def test_the_stats_count_the_jobs_that_are_there(repository: JobRepository, clock: ManualClock) -> None:
    start = clock.now()
    await _finish(repository, clock)
    clock.advance(60)
    due_at = clock.now()
    oldest = await enqueue(repository, kind="a.work", owner_id="alice")
    await enqueue(repository, kind="a.work", owner_id="bob", run_at=due_at + timedelta(hours=2))
    clock.advance(1)
    await enqueue(repository, kind="b.work", owner_id="bob")
    await enqueue(repository, kind="c.busy", owner_id="bob")
    await enqueue(repository, kind="c.busy", owner_id="carol")
    await repository.set_kind_paused("a.work", True)
    await repository.set_kind_paused("d.idle", True)
    claimed = await repository.claim("w2", 3, LEASE)
    assert sorted(c.job.kind for c in claimed.jobs) == ["b.work", "c.busy", "c.busy"]

    stats = await repository.queue_stats()

    assert stats.kinds == [
        KindStats(
            "a.work",
            queued=2,
            succeeded_last_hour=1,
            cancelled_last_hour=1,
            oldest_queued_due_at=due_at,
            paused=True,
        ),
        KindStats("b.work", running=1, failed_last_hour=1),
        KindStats("c.busy", running=2),
        KindStats("d.idle", paused=True),
    ]
    assert stats.running_by_owner == [("bob", 2), ("carol", 1)]
    assert (stats.oldest_queued_job_id, stats.oldest_queued_due_at) == (oldest, due_at)
    assert stats.computed_at == clock.now()
    minutes = stats.finished_per_minute
    assert len(minutes) == admin.STATS_MINUTES
    assert minutes[-1].minute == admin.minute_of(clock.now())
    assert [m for m in minutes if m.succeeded or m.failed or m.cancelled] == [
        MinuteCount(admin.minute_of(start), succeeded=1),
        MinuteCount(admin.minute_of(start + timedelta(seconds=60)), failed=1, cancelled=1),
    ]

    clock.advance(3600)  # the finished jobs leave the window; the queue stays
    later = await repository.queue_stats()
    assert [(k.kind, k.succeeded_last_hour, k.failed_last_hour) for k in later.kinds] == [
        ("a.work", 0, 0),
        ("b.work", 0, 0),
        ("c.busy", 0, 0),
        ("d.idle", 0, 0),
    ]
    assert all(not (m.succeeded or m.failed or m.cancelled) for m in later.finished_per_minute)


async def test_an_empty_queue_has_empty_stats(repository: JobRepository) -> None:
    stats = await repository.queue_stats()
    assert (stats.kinds, stats.running_by_owner, stats.oldest_queued_job_id) == ([], [], None)


async def test_listing_pages_across_owners_newest_first(repository: JobRepository) -> None:
    made = [await enqueue(repository, owner_id=("alice", "bob", "carol")[i % 3]) for i in range(7)]
    seen: list[str] = []
    after: PageCursor | None = None
    while True:
        page = await repository.list_all_jobs(EVERY, 3, after)
        seen.extend(job.id for job in page.jobs)
        if page.next_cursor is None:
            break
        after = page.next_cursor
    assert seen == made[::-1]

    bobs = await repository.list_all_jobs(AdminFilter(owner_id="bob"), 10, None)
    assert [job.id for job in bobs.jobs] == [made[4], made[1]]
    assert {job.owner_id for job in bobs.jobs} == {"bob"}
    queued_echo = AdminFilter(JobFilter(statuses=frozenset({JobStatus.QUEUED}), kind="example.echo"), "carol")
    assert [job.id for job in (await repository.list_all_jobs(queued_echo, 10, None)).jobs] == [
        made[5],
        made[2],
    ]


async def test_bulk_cancel_walks_batches_through_the_state_machine(repository: JobRepository) -> None:
    queued = [await enqueue(repository, kind="k.bulk", owner_id=f"o{i % 2}") for i in range(8)]
    other = await enqueue(repository, kind="k.other")
    [running] = (await repository.claim("w1", 1, LEASE, KindFilter(only=frozenset({"k.bulk"})))).jobs
    queued.remove(running.job.id)
    only_bulk = AdminFilter(JobFilter(kind="k.bulk"))

    async def walk(status: JobStatus, dry_run: bool) -> int:
        one = admin.with_statuses(only_bulk, frozenset({status}))
        return await admin.walk(lambda below: repository.bulk_cancel(one, below, 3, 30.0, dry_run))

    assert await walk(JobStatus.QUEUED, dry_run=True) == 7
    before = (await repository.list_all_jobs(EVERY, 50, None)).jobs
    assert {job.status for job in before if job.id in queued} == {
        JobStatus.QUEUED
    }  # a dry run changes nothing
    assert await walk(JobStatus.QUEUED, dry_run=False) == 7
    assert await walk(JobStatus.RUNNING, dry_run=False) == 1
    every = {job.id: job for job in (await repository.list_all_jobs(EVERY, 50, None)).jobs}
    for job_id in queued:
        assert every[job_id].status is JobStatus.CANCELLED
        events = await repository.list_events(every[job_id].owner_id, job_id, 0, 10)
        assert [e.type for e in events] == ["job.queued", "job.cancelled"]
    asked = every[running.job.id]
    assert asked.status is JobStatus.RUNNING and asked.cancel_requested_at is not None
    assert await repository.cancel_requested(running.lease)
    assert every[other].status is JobStatus.QUEUED
    assert await walk(JobStatus.QUEUED, dry_run=True) == 0  # nothing left to match


async def test_bulk_retry_makes_one_retry_per_job_and_never_two(repository: JobRepository) -> None:
    failed = [await enqueue(repository, kind="k.flaky", max_attempts=1) for _ in range(5)]
    for claimed in (await repository.claim("w1", 5, LEASE)).jobs:
        await repository.fail(claimed.lease, "boom", retryable=False)
    already = await repository.retry(OWNER, failed[0])
    retryable = AdminFilter(JobFilter(statuses=frozenset({JobStatus.FAILED})))

    async def walk(dry_run: bool) -> int:
        return await admin.walk(lambda below: repository.bulk_retry(retryable, below, 2, dry_run))

    assert await walk(dry_run=True) == 4
    assert await walk(dry_run=False) == 4
    assert await walk(dry_run=False) == 0
    queued = await repository.list_all_jobs(
        AdminFilter(JobFilter(statuses=frozenset({JobStatus.QUEUED}))), 50, None
    )
    assert sorted(job.retry_of_job_id or "" for job in queued.jobs) == sorted(failed)
    assert already.id in {job.id for job in queued.jobs}


async def test_a_paused_kind_is_not_claimed_until_resumed(repository: JobRepository) -> None:
    held = await enqueue(repository, kind="k.paused")
    free = await enqueue(repository, kind="k.free")
    assert await repository.set_kind_paused("k.paused", True)
    assert await repository.set_kind_paused("k.paused", True)  # again: changes nothing
    assert [c.job.id for c in (await repository.claim("w1", 5, LEASE)).jobs] == [free]
    assert (await repository.occupancy(OWNER, "k.paused")).paused
    assert not (await repository.occupancy(OWNER, "k.free")).paused
    assert (await repository.claim("w1", 5, LEASE, ANY_KIND)).jobs == []

    # A claim waiting for work is made by the resume.
    give_up = asyncio.Event()
    waiting = asyncio.create_task(repository.claim_with_next_work("w2", 1, LEASE, ANY_KIND, give_up, 10))
    await asyncio.sleep(0)
    assert not await repository.set_kind_paused("k.paused", False)
    assert not await repository.set_kind_paused("k.paused", False)
    result = await asyncio.wait_for(waiting, 10)
    if result is None or not result.jobs:  # this engine wakes claimers instead of claiming in the write
        result = await repository.claim("w2", 1, LEASE)
    assert [c.job.id for c in result.jobs] == [held]
