from __future__ import annotations

import asyncio

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import JobNotFound
from leasehold._server.jobs.records import JobFilter, JobStatus, NewJob
from leasehold._server.jobs.repository import JobRepository
from tests.support import OTHER_OWNER, OWNER


def new_job(**overrides: object) -> NewJob:
    fields: dict[str, object] = {"owner_id": OWNER, "kind": "example.echo", "payload": {"n": 1}}
    fields.update(overrides)
    return NewJob(**fields)  # type: ignore[arg-type]


async def test_enqueue_creates_a_queued_job_with_defaults(
    repository: JobRepository, clock: ManualClock
) -> None:
    job, created = await repository.enqueue(new_job())

    assert created is True
    assert job.id.startswith("job_") and len(job.id) == 36
    assert job.status is JobStatus.QUEUED
    assert (job.attempt, job.max_attempts, job.timeout_seconds) == (0, 3, 900)
    assert job.available_at == job.created_at == job.updated_at == clock.now()
    assert job.started_at is job.completed_at is job.cancel_requested_at is None
    assert job.retry_of_job_id is None and job.error_message is None
    assert await repository.get(OWNER, job.id) == job
    events = await repository.list_events(OWNER, job.id, 0, 100)
    assert [(e.sequence, e.type) for e in events] == [(1, "job.queued")]


async def test_enqueue_of_the_same_resource_returns_the_existing_job(
    repository: JobRepository,
) -> None:
    first, created_first = await repository.enqueue(new_job(resource_type="doc", resource_id="7"))
    again, created_again = await repository.enqueue(new_job(resource_type="doc", resource_id="7"))

    assert created_first is True and created_again is False
    assert again.id == first.id


async def test_concurrent_enqueues_of_one_resource_create_exactly_one_job(
    repository: JobRepository,
) -> None:
    results = await asyncio.gather(
        *(repository.enqueue(new_job(resource_type="doc", resource_id="r")) for _ in range(20))
    )

    assert sum(created for _, created in results) == 1
    assert len({job.id for job, _ in results}) == 1
    page = await repository.list_jobs(OWNER, JobFilter(resource_id="r"), 50, None)
    assert len(page.jobs) == 1


async def test_resource_dedup_is_per_owner_and_per_resource_type(repository: JobRepository) -> None:
    a, _ = await repository.enqueue(new_job(resource_type="doc", resource_id="1"))
    b, b_created = await repository.enqueue(
        new_job(owner_id=OTHER_OWNER, resource_type="doc", resource_id="1")
    )
    c, c_created = await repository.enqueue(new_job(resource_type="image", resource_id="1"))

    assert b_created and c_created
    assert len({a.id, b.id, c.id}) == 3


async def test_without_resource_id_every_enqueue_creates_a_job(repository: JobRepository) -> None:
    results = [await repository.enqueue(new_job(resource_type="doc")) for _ in range(3)]

    assert all(created for _, created in results)
    assert len({job.id for job, _ in results}) == 3


async def test_repeated_enqueue_returns_the_newest_job_of_the_resource(
    repository: JobRepository,
) -> None:
    root, _ = await repository.enqueue(new_job(resource_type="doc", resource_id="9"))
    await repository.cancel(OWNER, root.id)
    child = await repository.retry(OWNER, root.id)

    again, created = await repository.enqueue(new_job(resource_type="doc", resource_id="9"))

    assert created is False
    assert again.id == child.id


async def test_user_facing_reads_filter_by_owner(repository: JobRepository) -> None:
    job, _ = await repository.enqueue(new_job())

    with pytest.raises(JobNotFound) as denied:
        await repository.get(OTHER_OWNER, job.id)
    with pytest.raises(JobNotFound) as unknown:
        await repository.get(OTHER_OWNER, "job_" + "0" * 32)
    with pytest.raises(JobNotFound):
        await repository.list_events(OTHER_OWNER, job.id, 0, 10)
    with pytest.raises(JobNotFound):
        await repository.cancel(OTHER_OWNER, job.id)
    with pytest.raises(JobNotFound):
        await repository.retry(OTHER_OWNER, job.id)
    page = await repository.list_jobs(OTHER_OWNER, JobFilter(), 50, None)

    assert page.jobs == []
    assert str(denied.value) == f"job {job.id} not found or not accessible"
    assert str(unknown.value) == f"job job_{'0' * 32} not found or not accessible"
    assert (await repository.get(OWNER, job.id)).status is JobStatus.QUEUED


async def test_list_is_newest_first_with_keyset_pages(repository: JobRepository, clock: ManualClock) -> None:
    ids = []
    for _ in range(5):
        job, _ = await repository.enqueue(new_job())
        ids.append(job.id)
        clock.advance(1)
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await repository.list_jobs(OWNER, JobFilter(), 2, cursor)
        seen.extend(job.id for job in page.jobs)
        pages += 1
        cursor = page.next_cursor
        if cursor is None:
            break

    assert seen == list(reversed(ids))
    assert pages == 3


async def test_list_pages_are_stable_when_jobs_share_a_timestamp(repository: JobRepository) -> None:
    ids = {(await repository.enqueue(new_job()))[0].id for _ in range(7)}
    seen: list[str] = []
    cursor = None
    while True:
        page = await repository.list_jobs(OWNER, JobFilter(), 3, cursor)
        seen.extend(job.id for job in page.jobs)
        if (cursor := page.next_cursor) is None:
            break

    assert sorted(seen) == sorted(ids)
    assert len(seen) == len(set(seen))


async def test_list_filters(repository: JobRepository) -> None:
    echo, _ = await repository.enqueue(new_job(resource_type="doc", resource_id="a"))
    sleep, _ = await repository.enqueue(new_job(kind="example.sleep", resource_type="img"))
    cancelled, _ = await repository.enqueue(new_job(kind="example.sleep"))
    await repository.cancel(OWNER, cancelled.id)

    async def ids(job_filter: JobFilter) -> set[str]:
        page = await repository.list_jobs(OWNER, job_filter, 50, None)
        return {job.id for job in page.jobs}

    assert await ids(JobFilter(kind="example.sleep")) == {sleep.id, cancelled.id}
    assert await ids(JobFilter(resource_type="doc")) == {echo.id}
    assert await ids(JobFilter(resource_id="a")) == {echo.id}
    assert await ids(JobFilter(statuses=frozenset({JobStatus.CANCELLED}))) == {cancelled.id}
    assert await ids(JobFilter(statuses=frozenset({JobStatus.QUEUED, JobStatus.CANCELLED}))) == {
        echo.id,
        sleep.id,
        cancelled.id,
    }


async def test_a_failing_operation_does_not_sink_its_batch_neighbours(
    repository: JobRepository,
) -> None:
    # Submitted together, these land in one group commit; the denied cancel
    # must roll back alone.
    results = await asyncio.gather(
        repository.enqueue(new_job()),
        repository.cancel(OWNER, "job_missing"),
        repository.enqueue(new_job()),
        return_exceptions=True,
    )

    assert isinstance(results[1], JobNotFound)
    for outcome in (results[0], results[2]):
        assert not isinstance(outcome, BaseException)
        job, _ = outcome
        assert (await repository.get(OWNER, job.id)).status is JobStatus.QUEUED


async def test_concurrent_enqueues_each_get_their_own_job(repository: JobRepository) -> None:
    """Enqueues submitted together may be written by one statement; each caller
    still gets the job made from its own request, with its own `job.queued`."""
    requests = [
        NewJob(owner_id=OWNER, kind=f"kind.{i}", payload={"i": i}, timeout_seconds=i + 1) for i in range(40)
    ]
    keyed = new_job(resource_type="doc", resource_id="mixed-in")
    results = await asyncio.gather(*(repository.enqueue(r) for r in requests), repository.enqueue(keyed))

    jobs = [job for job, _ in results[:-1]]
    assert [(job.kind, job.timeout_seconds) for job in jobs] == [
        (r.kind, r.timeout_seconds) for r in requests
    ]
    assert len({job.id for job, _ in results}) == 41
    assert all(created for _, created in results)
    for job in jobs:
        assert await repository.get(OWNER, job.id) == job  # what was answered is what was stored
        assert [e.type for e in await repository.list_events(OWNER, job.id, 0, 10)] == ["job.queued"]
