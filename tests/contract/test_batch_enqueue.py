"""`enqueue_batch` on every engine: one transaction, answers in request order,
and the dedup of `enqueue` applied to each item (DESIGN §15, §3 Dedup)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Any

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import FeedEvent, JobFilter, JobStatus, NewJob
from leasehold._server.jobs.repository import JobRepository
from tests.support import OTHER_OWNER, OWNER


def new_job(**overrides: object) -> NewJob:
    fields: dict[str, object] = {"owner_id": OWNER, "kind": "example.echo", "payload": {"n": 1}}
    fields.update(overrides)
    return NewJob(**fields)  # type: ignore[arg-type]


def keyed(resource_id: str, **overrides: object) -> NewJob:
    return new_job(**{"resource_type": "doc", "resource_id": resource_id, **overrides})


async def all_jobs(repository: JobRepository, owner: str = OWNER) -> list[str]:
    """Every job id of `owner`, oldest first."""
    page = await repository.list_jobs(owner, JobFilter(), 500, None)
    assert page.next_cursor is None
    return [job.id for job in reversed(page.jobs)]


async def test_a_batch_creates_every_job_and_answers_in_request_order(
    repository: JobRepository, clock: ManualClock
) -> None:
    batch = [
        new_job(payload={"i": 0}),
        keyed("a", max_attempts=5),
        new_job(kind="example.sleep", timeout_seconds=7),
        keyed("b"),
        new_job(),
    ]

    answers = await repository.enqueue_batch(batch)

    assert [created for _, created in answers] == [True] * 5
    jobs = [job for job, _ in answers]
    assert len({job.id for job in jobs}) == 5
    assert [job.kind for job in jobs] == [item.kind for item in batch]
    assert [job.resource_id for job in jobs] == ["", "a", "", "b", ""]
    assert [(job.max_attempts, job.timeout_seconds) for job in jobs][1:3] == [(5, 900), (3, 7)]
    for job in jobs:
        assert job.status is JobStatus.QUEUED
        assert job.created_at == job.available_at == clock.now()
        assert await repository.get(OWNER, job.id) == job
    # Stored in request order too: List (newest first) shows the batch reversed.
    assert await all_jobs(repository) == [job.id for job in jobs]


async def test_each_created_job_gets_its_queued_event(repository: JobRepository) -> None:
    answers = await repository.enqueue_batch([new_job(), keyed("a"), keyed("a"), new_job()])

    for job, _ in answers:
        events = await repository.list_events(OWNER, job.id, 0, 100)
        assert [(event.sequence, event.type) for event in events] == [(1, "job.queued")]


async def test_a_resource_with_a_root_job_gets_that_job_back(repository: JobRepository) -> None:
    existing, _ = await repository.enqueue(keyed("7"))

    answers = await repository.enqueue_batch([new_job(), keyed("7"), keyed("8")])

    assert [created for _, created in answers] == [True, False, True]
    assert answers[1][0].id == existing.id
    assert len(await all_jobs(repository)) == 3
    # The existing job was not touched: still one event.
    assert len(await repository.list_events(OWNER, existing.id, 0, 100)) == 1


async def test_a_resource_named_twice_in_one_batch_is_one_job(repository: JobRepository) -> None:
    answers = await repository.enqueue_batch([keyed("x"), new_job(), keyed("x"), keyed("x")])

    assert [created for _, created in answers] == [True, True, False, False]
    first = answers[0][0]
    assert answers[2][0] == first and answers[3][0] == first
    assert len(await all_jobs(repository)) == 2
    page = await repository.list_jobs(OWNER, JobFilter(resource_id="x"), 50, None)
    assert [job.id for job in page.jobs] == [first.id]


async def test_owners_are_separate_namespaces_inside_one_batch(repository: JobRepository) -> None:
    theirs, _ = await repository.enqueue(keyed("shared", owner_id=OTHER_OWNER))

    answers = await repository.enqueue_batch(
        [keyed("shared"), keyed("shared", owner_id=OTHER_OWNER), keyed("shared", resource_type="img")]
    )

    assert [created for _, created in answers] == [True, False, True]
    mine = answers[0][0]
    assert mine.id != theirs.id and answers[1][0].id == theirs.id
    assert await all_jobs(repository) == [mine.id, answers[2][0].id]
    assert await all_jobs(repository, OTHER_OWNER) == [theirs.id]


async def test_a_batch_that_fails_writes_nothing_at_all(repository: JobRepository) -> None:
    before, _ = await repository.enqueue(new_job())
    # The last item's payload cannot be stored on any engine: by then the items
    # before it (a resource's root among them) are already in the transaction.
    unstorable = new_job(payload={"not json": object()})
    batch = [new_job(), keyed("r"), new_job(), unstorable]

    with pytest.raises(Exception):  # noqa: B017 - the engines' errors differ; what stayed is the test
        await repository.enqueue_batch(batch)

    assert await all_jobs(repository) == [before.id]
    # The resource is still free: nothing of the failed batch holds its key.
    again, created = await repository.enqueue(keyed("r"))
    assert created is True and again.id != before.id


async def test_a_failed_batch_does_not_sink_writes_committed_with_it(repository: JobRepository) -> None:
    lone, failed = await asyncio.gather(
        repository.enqueue(new_job(payload={"lone": True})),
        repository.enqueue_batch([new_job(), new_job(payload={"bad": object()})]),
        return_exceptions=True,
    )

    assert isinstance(failed, Exception)
    assert not isinstance(lone, BaseException)
    assert await all_jobs(repository) == [lone[0].id]


async def test_concurrent_overlapping_batches_make_one_job_per_resource(repository: JobRepository) -> None:
    keys = [f"k{i}" for i in range(6)]
    # Each batch names every key, in its own order, plus one job of its own.
    batches = [[keyed(key) for key in (keys[i:] + keys[:i])] + [new_job()] for i in range(5)]

    results = await asyncio.gather(*(repository.enqueue_batch(batch) for batch in batches))

    per_key: dict[str, set[str]] = {key: set() for key in keys}
    created = dict.fromkeys(keys, 0)
    for answers in results:
        for job, was_created in answers[:-1]:
            per_key[job.resource_id].add(job.id)
            created[job.resource_id] += was_created
        assert answers[-1][1] is True
    assert all(len(ids) == 1 for ids in per_key.values()), per_key
    assert created == dict.fromkeys(keys, 1)
    assert len(await all_jobs(repository)) == len(keys) + len(batches)


async def test_one_batch_wakes_claimers_and_watchers_once(repository: JobRepository) -> None:
    hub = repository.changes
    work: list[None] = []
    published: list[list[FeedEvent]] = []
    real_work, real_events = hub.publish_work, hub.publish_events

    def publish_work() -> None:
        work.append(None)
        real_work()

    def publish_events(events: Iterable[FeedEvent]) -> None:
        published.append(list(events))
        real_events(published[-1])

    hub.publish_work = publish_work  # type: ignore[method-assign]
    hub.publish_events = publish_events  # type: ignore[method-assign]
    with hub.watch_work() as signal:
        answers = await repository.enqueue_batch([new_job(), keyed("a"), new_job(), keyed("a")])
        assert signal.is_set()

    assert len(work) == 1
    assert len(published) == 1
    published_ids = sorted(numbered.event.job_id for numbered in published[0])
    assert published_ids == sorted({job.id for job, _ in answers})


async def test_claims_take_a_batch_in_request_order(repository: JobRepository) -> None:
    answers = await repository.enqueue_batch([new_job(), keyed("a"), new_job(), keyed("b")])

    claimed = await repository.claim("w1", 10, 30.0)

    assert [item.job.id for item in claimed.jobs] == [job.id for job, _ in answers]
    assert all(item.payload == {"n": 1} for item in claimed.jobs)


async def test_a_batch_of_a_thousand_is_one_call(repository: JobRepository) -> None:
    batch: list[NewJob] = [new_job(payload={"i": i}) for i in range(900)]
    batch += [keyed(str(i % 50)) for i in range(100)]

    answers = await repository.enqueue_batch(batch)

    assert len(answers) == 1000
    assert sum(created for _, created in answers) == 950
    ids: list[Any] = [job.id for job, _ in answers]
    assert len(set(ids)) == 950
    assert ids[900:950] == ids[950:]
