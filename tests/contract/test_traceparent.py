"""The caller's W3C traceparent is kept with the job (DESIGN §13: tracing): every
engine stores it, hands it to each attempt's claim, and copies it to a retry."""

from __future__ import annotations

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import JobFilter, NewJob
from leasehold._server.jobs.repository import JobRepository
from tests.contract.helpers import claim_one, enqueue
from tests.support import OWNER

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
OTHER_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"


async def test_an_enqueued_jobs_traceparent_is_read_back(repository: JobRepository) -> None:
    job_id = await enqueue(repository, traceparent=TRACEPARENT)

    assert (await repository.get(OWNER, job_id)).traceparent == TRACEPARENT
    (listed,) = (await repository.list_jobs(OWNER, JobFilter(), 10, None)).jobs
    assert listed.traceparent == TRACEPARENT


async def test_a_job_enqueued_without_one_has_none(repository: JobRepository) -> None:
    job_id = await enqueue(repository)

    assert (await repository.get(OWNER, job_id)).traceparent is None
    assert (await claim_one(repository)).job.traceparent is None


async def test_each_batch_item_keeps_its_own(repository: JobRepository) -> None:
    items = [
        NewJob(owner_id=OWNER, kind="example.echo", payload={}, traceparent=TRACEPARENT),
        NewJob(owner_id=OWNER, kind="example.echo", payload={}),
        NewJob(
            owner_id=OWNER,
            kind="example.echo",
            payload={},
            resource_type="doc",
            resource_id="1",
            traceparent=OTHER_TRACEPARENT,
        ),
    ]

    answers = await repository.enqueue_batch(items)

    stored = [(await repository.get(OWNER, job.id)).traceparent for job, _ in answers]
    assert stored == [TRACEPARENT, None, OTHER_TRACEPARENT]
    assert [job.traceparent for job, _ in answers] == stored


async def test_every_attempts_claim_carries_it(repository: JobRepository, clock: ManualClock) -> None:
    await enqueue(repository, traceparent=TRACEPARENT)

    first = await claim_one(repository)
    assert first.job.traceparent == TRACEPARENT
    await repository.fail(first.lease, "boom", True)
    clock.advance(3600)
    second = await claim_one(repository)

    assert second.job.attempt == 2
    assert second.job.traceparent == TRACEPARENT


async def test_a_retry_continues_its_sources_trace(repository: JobRepository) -> None:
    job_id = await enqueue(repository, traceparent=TRACEPARENT, max_attempts=1)
    claimed = await claim_one(repository)
    await repository.fail(claimed.lease, "boom", False)

    retried = await repository.retry(OWNER, job_id)

    assert retried.traceparent == TRACEPARENT
    assert (await claim_one(repository)).job.traceparent == TRACEPARENT


async def test_the_first_enqueue_of_a_resource_keeps_its_trace(repository: JobRepository) -> None:
    """A deduplicated Enqueue answers with the existing job: the trace of the
    call that created it, not the later caller's."""
    first = await enqueue(repository, resource_type="doc", resource_id="7", traceparent=TRACEPARENT)
    again = await enqueue(repository, resource_type="doc", resource_id="7", traceparent=OTHER_TRACEPARENT)

    assert again == first
    assert (await repository.get(OWNER, first)).traceparent == TRACEPARENT
