"""What the metrics read from storage on every engine: the due queue by kind,
and which kind each recovered job is."""

from __future__ import annotations

from datetime import timedelta

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import JobStatus, QueuedKind, RecoveredJob
from leasehold._server.jobs.repository import JobRepository
from tests.contract.helpers import LEASE, claim_one, enqueue


async def test_an_empty_queue_has_no_kinds(repository: JobRepository) -> None:
    assert await repository.queued_by_kind() == []


async def test_the_queue_counts_due_queued_jobs_per_kind_with_the_oldest_due_time(
    repository: JobRepository, clock: ManualClock
) -> None:
    finished = await enqueue(repository, kind="c.done")
    claimed = await claim_one(repository)
    assert claimed.job.id == finished
    await repository.succeed(claimed.lease)
    await enqueue(repository, kind="d.running")
    await claim_one(repository)
    clock.advance(1)
    oldest_a = clock.now()
    await enqueue(repository, kind="a.work")
    clock.advance(1)
    await enqueue(repository, kind="a.work")
    oldest_b = clock.now()
    await enqueue(repository, kind="b.work")
    later = clock.now() + timedelta(hours=1)
    await enqueue(repository, kind="a.work", run_at=later)
    await enqueue(repository, kind="e.later", run_at=later)
    clock.advance(5)

    assert await repository.queued_by_kind() == [
        QueuedKind("a.work", 2, oldest_a),
        QueuedKind("b.work", 1, oldest_b),
    ]

    clock.advance(3600)  # the scheduled ones fall due; the oldest stays the oldest
    assert await repository.queued_by_kind() == [
        QueuedKind("a.work", 3, oldest_a),
        QueuedKind("b.work", 1, oldest_b),
        QueuedKind("e.later", 1, later),
    ]


async def test_a_recovered_job_names_its_kind_where_it_went_and_why(
    repository: JobRepository, clock: ManualClock
) -> None:
    overdue = await enqueue(repository, kind="k.slow", timeout_seconds=5, max_attempts=1)
    lost = await enqueue(repository, kind="k.lost", max_attempts=3)
    assert len((await repository.claim("w1", 2, LEASE)).jobs) == 2

    clock.advance(6)  # past the first one's deadline, inside both leases
    assert await repository.recover_expired_leases() == [
        RecoveredJob(overdue, "k.slow", JobStatus.FAILED, lease_expired=False)
    ]

    clock.advance(LEASE)
    assert await repository.recover_expired_leases() == [
        RecoveredJob(lost, "k.lost", JobStatus.QUEUED, lease_expired=True)
    ]
