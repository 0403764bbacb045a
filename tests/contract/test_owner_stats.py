"""JobService.GetStats's storage on every engine: an owner's counts by status
and by kind are exactly the jobs that owner has, wherever they moved, and
never include another owner's."""

from __future__ import annotations

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import owner_stats
from leasehold._server.jobs.owner_stats import JobCounts
from leasehold._server.jobs.records import ClaimedJob, NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindFilter
from tests.contract.helpers import LEASE, enqueue
from tests.support import OWNER

OTHER = "someone-else"


async def test_an_owner_with_no_jobs_counts_nothing(repository: JobRepository, clock: ManualClock) -> None:
    await enqueue(repository, owner_id=OTHER, kind="a.work")

    stats = await repository.owner_stats(OWNER)

    assert stats.total == JobCounts()
    assert stats.kinds == []
    assert not stats.kinds_truncated
    assert stats.computed_at == clock.now()


async def _claim(repository: JobRepository, kind: str, count: int) -> list[ClaimedJob]:
    claimed = (await repository.claim("w1", count, LEASE, KindFilter(only=frozenset({kind})))).jobs
    assert len(claimed) == count
    return claimed


async def test_the_counts_follow_every_status_and_kind(repository: JobRepository, clock: ManualClock) -> None:
    for kind in ("a.work", "a.work", "a.work", "b.work", "b.work", "c.work", "c.work"):
        await enqueue(repository, kind=kind, max_attempts=1)
    for kind in ("b.work", "x.other", "z.other"):
        await enqueue(repository, owner_id=OTHER, kind=kind)
    a_done, a_running = await _claim(repository, "a.work", 2)
    await repository.succeed(a_done.lease)
    b_jobs = await _claim(repository, "b.work", 3)  # the other owner's one among them
    for claimed in b_jobs:
        if claimed.job.owner_id == OWNER:
            await repository.fail(claimed.lease, "boom", retryable=False)
    (c_running,) = await _claim(repository, "c.work", 1)
    await repository.cancel(OWNER, c_running.job.id)  # asked to stop: running still
    cancelled = await enqueue(repository, kind="c.work")
    await repository.cancel(OWNER, cancelled)
    clock.advance(5)

    stats = await repository.owner_stats(OWNER)

    assert stats.kinds == [
        ("a.work", JobCounts(queued=1, running=1, succeeded=1)),
        ("b.work", JobCounts(failed=2)),
        ("c.work", JobCounts(queued=1, running=1, cancelled=1)),
    ]
    assert stats.total == JobCounts(queued=2, running=2, succeeded=1, failed=2, cancelled=1)
    assert not stats.kinds_truncated
    assert stats.computed_at == clock.now()

    other = await repository.owner_stats(OTHER)
    assert other.kinds == [
        ("b.work", JobCounts(running=1)),
        ("x.other", JobCounts(queued=1)),
        ("z.other", JobCounts(queued=1)),
    ]
    assert other.total == JobCounts(queued=2, running=1)


async def test_kinds_past_the_limit_are_left_out_but_still_counted(repository: JobRepository) -> None:
    extra = 3
    kinds = [f"k.{index:05d}" for index in range(owner_stats.KIND_LIMIT + extra)]
    for start in range(0, len(kinds), 500):
        await repository.enqueue_batch(
            [NewJob(owner_id=OWNER, kind=kind, payload={}) for kind in kinds[start : start + 500]]
        )
    await enqueue(repository, owner_id=OTHER, kind="a.first")  # sorts before every kind of the owner's

    stats = await repository.owner_stats(OWNER)

    assert stats.kinds_truncated
    assert [kind for kind, _ in stats.kinds] == kinds[: owner_stats.KIND_LIMIT]
    assert all(counts == JobCounts(queued=1) for _, counts in stats.kinds)
    assert stats.total == JobCounts(queued=len(kinds))
