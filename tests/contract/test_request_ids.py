"""Idempotent calls on every engine (DESIGN §14, AIP-155): a request id's first
call acts and records its answer in the same write; a repeat from the same
owner gets that answer (its jobs as they are now, the first call's `created`
flags) and writes nothing."""

from __future__ import annotations

import asyncio

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import JobNotFound, RequestIdReused, RequestResultDeleted, RetryNotAllowed
from leasehold._server.jobs.idempotency import REQUEST_ID_WINDOW, KeyedAnswer, Method, RequestKey
from leasehold._server.jobs.records import JobFilter, JobStatus, NewJob
from leasehold._server.jobs.repository import JobRepository
from tests.contract.helpers import LEASE, claim_one, event_types
from tests.support import OTHER_OWNER, OWNER


def key(
    request_id: str = "req-1",
    method: Method = Method.ENQUEUE,
    fingerprint: str = "a" * 64,
    owner: str = OWNER,
) -> RequestKey:
    return RequestKey(owner, request_id, method, fingerprint)


def new_job(owner: str = OWNER, **overrides: object) -> NewJob:
    fields: dict[str, object] = {"owner_id": owner, "kind": "example.echo", "payload": {"n": 1}}
    fields.update(overrides)
    return NewJob(**fields)  # type: ignore[arg-type]


async def job_ids(repository: JobRepository, owner: str = OWNER) -> list[str]:
    page = await repository.list_jobs(owner, JobFilter(), 500, None)
    return [job.id for job in page.jobs]


async def failed_job(repository: JobRepository) -> str:
    first = await repository.enqueue_once([new_job(max_attempts=1)], key("source"))
    claimed = await claim_one(repository)
    await repository.fail(claimed.lease, "boom")
    return first.answers[0][0].id


async def test_a_repeat_returns_the_first_job_and_writes_nothing(repository: JobRepository) -> None:
    first = await repository.enqueue_once([new_job()], key())

    again = await repository.enqueue_once([new_job()], key())

    assert not first.repeated and again.repeated
    assert again.answers == first.answers
    (job, created) = again.answers[0]
    assert created is True
    assert await job_ids(repository) == [job.id]
    assert await event_types(repository, job.id) == ["job.queued"]


async def test_a_repeat_shows_the_job_as_it_is_now_with_the_first_calls_flag(
    repository: JobRepository,
) -> None:
    first = await repository.enqueue_once([new_job()], key())
    job_id = first.answers[0][0].id
    await repository.cancel(OWNER, job_id)

    again = await repository.enqueue_once([new_job()], key())

    ((job, created),) = again.answers
    assert (job.id, job.status, created) == (job_id, JobStatus.CANCELLED, True)


async def test_a_resource_keyed_first_call_keeps_its_created_false(repository: JobRepository) -> None:
    existing, _ = await repository.enqueue(new_job(resource_type="doc", resource_id="7"))

    first = await repository.enqueue_once([new_job(resource_type="doc", resource_id="7")], key())
    again = await repository.enqueue_once([new_job(resource_type="doc", resource_id="7")], key())

    assert first.answers == again.answers == [(existing, False)]


async def test_a_batch_repeat_replays_the_whole_answer_in_order(repository: JobRepository) -> None:
    existing, _ = await repository.enqueue(new_job(resource_type="doc", resource_id="old"))
    batch = [
        new_job(payload={"i": 0}),
        new_job(resource_type="doc", resource_id="old"),
        new_job(resource_type="doc", resource_id="new"),
        new_job(resource_type="doc", resource_id="new"),
        new_job(payload={"i": 4}),
    ]
    batch_key = key(method=Method.BATCH_ENQUEUE)

    first = await repository.enqueue_once(batch, batch_key)
    again = await repository.enqueue_once(batch, batch_key)

    assert [created for _, created in first.answers] == [True, False, True, False, True]
    assert first.answers[1][0] == existing
    assert [(job.id, created) for job, created in again.answers] == [
        (job.id, created) for job, created in first.answers
    ]
    assert again.repeated
    assert len(await job_ids(repository)) == 4  # the existing job and three new ones


async def test_two_retries_with_one_request_id_make_one_new_job(repository: JobRepository) -> None:
    source = await failed_job(repository)
    retry_key = key("retry-1", Method.RETRY)

    first = await repository.retry_once(OWNER, source, retry_key)
    again = await repository.retry_once(OWNER, source, retry_key)

    ((job, created),) = first.answers
    assert created and job.retry_of_job_id == source
    assert again.answers == first.answers and again.repeated
    assert len(await job_ids(repository)) == 2


async def test_two_retries_without_a_request_id_make_two_new_jobs(repository: JobRepository) -> None:
    """Today's behaviour, kept: without a key, each Retry acts."""
    source = await failed_job(repository)

    first = await repository.retry(OWNER, source)
    second = await repository.retry(OWNER, source)

    assert first.id != second.id
    assert len(await job_ids(repository)) == 3


async def test_a_refused_call_records_no_key(repository: JobRepository) -> None:
    """A Retry refused (the job is still queued) leaves the key free: sent
    again once the job can be retried, the same request acts."""
    queued, _ = await repository.enqueue(new_job())
    retry_key = key("retry-early", Method.RETRY)
    with pytest.raises(RetryNotAllowed):
        await repository.retry_once(OWNER, queued.id, retry_key)
    await repository.cancel(OWNER, queued.id)

    answered = await repository.retry_once(OWNER, queued.id, retry_key)

    assert not answered.repeated and answered.answers[0][0].retry_of_job_id == queued.id


async def test_twenty_concurrent_calls_with_one_request_id_make_one_job(repository: JobRepository) -> None:
    answers = await asyncio.gather(*(repository.enqueue_once([new_job()], key()) for _ in range(20)))

    assert len({answer.answers[0][0].id for answer in answers}) == 1
    assert sum(not answer.repeated for answer in answers) == 1
    assert all(answer.answers[0][1] for answer in answers)  # all see the first call's created = True
    assert len(await job_ids(repository)) == 1


async def test_another_owners_identical_request_id_is_independent(repository: JobRepository) -> None:
    mine = await repository.enqueue_once([new_job()], key())

    theirs = await repository.enqueue_once([new_job(OTHER_OWNER)], key(owner=OTHER_OWNER))

    assert not theirs.repeated
    assert theirs.answers[0][0].id != mine.answers[0][0].id
    assert theirs.answers[0][0].owner_id == OTHER_OWNER
    assert len(await job_ids(repository, OTHER_OWNER)) == 1


@pytest.mark.parametrize(
    "reused",
    [key(fingerprint="b" * 64), key(method=Method.BATCH_ENQUEUE), key(method=Method.RETRY)],
    ids=["other-request", "other-method", "retry"],
)
async def test_a_request_id_reused_for_another_request_is_refused(
    repository: JobRepository, reused: RequestKey
) -> None:
    first = await repository.enqueue_once([new_job()], key())

    with pytest.raises(RequestIdReused, match="request_id"):
        if reused.method is Method.RETRY:
            await repository.retry_once(OWNER, first.answers[0][0].id, reused)
        else:
            await repository.enqueue_once([new_job(payload={"n": 2})], reused)

    assert await job_ids(repository) == [first.answers[0][0].id]


async def test_a_forgotten_request_id_acts_again(repository: JobRepository, clock: ManualClock) -> None:
    first = await repository.enqueue_once([new_job()], key())
    cutoff = clock.now() + REQUEST_ID_WINDOW
    assert await repository.forget_request_ids(clock.now(), 100) == 0  # not before it was made
    clock.advance(REQUEST_ID_WINDOW.total_seconds() + 1)

    assert await repository.forget_request_ids(cutoff, 100) == 1
    again = await repository.enqueue_once([new_job()], key())

    assert not again.repeated
    assert again.answers[0][0].id != first.answers[0][0].id
    assert len(await job_ids(repository)) == 2


async def test_forgetting_goes_oldest_first_up_to_the_limit(
    repository: JobRepository, clock: ManualClock
) -> None:
    for n in range(3):
        await repository.enqueue_once([new_job()], key(f"req-{n}"))
        clock.advance(1)

    assert await repository.forget_request_ids(clock.now(), 2) == 2

    # The newest is still remembered; the two oldest act again.
    assert (await repository.enqueue_once([new_job()], key("req-2"))).repeated
    assert not (await repository.enqueue_once([new_job()], key("req-0"))).repeated


async def test_a_repeat_whose_job_retention_deleted_is_refused_not_acted(
    repository: JobRepository, clock: ManualClock
) -> None:
    first = await repository.enqueue_once([new_job()], key())
    claimed = await repository.claim("w1", 1, LEASE)
    await repository.succeed(claimed.jobs[0].lease)
    clock.advance(60)
    assert await repository.delete_expired(clock.now(), 10) == 1
    with pytest.raises(JobNotFound):
        await repository.get(OWNER, first.answers[0][0].id)

    with pytest.raises(RequestResultDeleted, match="request_id"):
        await repository.enqueue_once([new_job()], key())

    assert await job_ids(repository) == []


async def test_calls_made_together_each_get_their_own_answer(repository: JobRepository) -> None:
    """Many keyed calls at once (on SQL, one batch of the writer): a new key
    acts once, its repeats and an older key's repeat are answered from their
    records, and a key sent with another request is refused, that call alone."""
    older = await repository.enqueue_once([new_job()], key("older"))
    calls = [
        repository.enqueue_once([new_job()], key("new")),
        repository.enqueue_once([new_job()], key("older")),
        repository.enqueue_once([new_job()], key("new")),
        repository.enqueue_once([new_job(payload={"n": 2})], key("new", fingerprint="b" * 64)),
        repository.enqueue_once([new_job()], key("other")),
    ]

    answers = await asyncio.gather(*calls, return_exceptions=True)

    new, repeat_older, repeat_new, reused, other = answers
    assert isinstance(new, KeyedAnswer) and not new.repeated
    assert isinstance(repeat_new, KeyedAnswer) and repeat_new.repeated
    assert repeat_new.answers == new.answers
    assert isinstance(repeat_older, KeyedAnswer) and repeat_older.answers == older.answers
    assert isinstance(reused, RequestIdReused)
    assert isinstance(other, KeyedAnswer) and not other.repeated
    assert len(await job_ids(repository)) == 3
