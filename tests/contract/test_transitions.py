"""Ending attempts, cancelling, manual retry and the event log."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import limits, state_machine
from leasehold._server.jobs.errors import RetryNotAllowed
from leasehold._server.jobs.records import JobFilter, JobStatus
from leasehold._server.jobs.repository import JobRepository
from leasehold.worker import LeaseLost
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types
from tests.support import OWNER


async def test_succeed_finishes_the_job(repository: JobRepository, clock: ManualClock) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    clock.advance(3)

    job = await repository.succeed(claimed.lease)

    assert job.status is JobStatus.SUCCEEDED
    assert job.completed_at == job.updated_at == clock.now()
    assert await event_types(repository, job_id) == ["job.queued", "job.started", "job.succeeded"]


@pytest.mark.parametrize("attempt", [1, 2, 3, 4, 5, 6, 7])
async def test_failed_attempts_back_off_exponentially_up_to_30_seconds(
    repository: JobRepository, clock: ManualClock, attempt: int
) -> None:
    job_id = await enqueue(repository, max_attempts=10)
    for _ in range(attempt - 1):
        claimed = await claim_one(repository)
        await repository.fail(claimed.lease, "again")
        clock.advance(60)
    claimed = await claim_one(repository)
    assert claimed.job.attempt == attempt

    job = await repository.fail(claimed.lease, "boom", error_type="ValueError")

    expected = clock.now() + timedelta(seconds=min(30, 2**attempt))
    assert job.status is JobStatus.QUEUED
    assert job.available_at == expected
    assert job.error_message == "boom" and job.completed_at is None
    assert job.error_type == "ValueError"
    scheduled = (await repository.list_events(OWNER, job_id, 0, 1000))[-1]
    assert scheduled.type == "job.retry_scheduled"
    assert scheduled.payload == {
        "attempt": attempt,
        "error": "boom",
        "error_type": "ValueError",
        "available_at": expected.isoformat().replace("+00:00", "Z"),
    }


async def test_a_job_waiting_for_its_retry_is_not_claimed_early(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository)
    await repository.fail((await claim_one(repository)).lease, "boom")

    clock.advance(1.9)
    early = await repository.claim("w1", 1, LEASE)
    clock.advance(0.1)
    due = await repository.claim("w1", 1, LEASE)

    assert early.jobs == []
    assert early.next_wakeup_at == clock.now()
    assert [c.job.attempt for c in due.jobs] == [2]


async def test_the_last_attempt_failing_fails_the_job(repository: JobRepository, clock: ManualClock) -> None:
    job_id = await enqueue(repository, max_attempts=2)
    await repository.fail((await claim_one(repository)).lease, "first")
    clock.advance(10)

    job = await repository.fail((await claim_one(repository)).lease, "second", error_type="KeyError")

    assert job.status is JobStatus.FAILED
    assert (job.attempt, job.error_message, job.error_type) == (2, "second", "KeyError")
    assert job.completed_at == clock.now()
    last = (await repository.list_events(OWNER, job_id, 0, 100))[-1]
    assert (last.type, last.payload) == ("job.failed", {"error": "second", "error_type": "KeyError"})


async def test_a_non_retryable_failure_skips_the_remaining_attempts(
    repository: JobRepository,
) -> None:
    await enqueue(repository, max_attempts=5)

    job = await repository.fail((await claim_one(repository)).lease, "bad input", retryable=False)

    assert job.status is JobStatus.FAILED and job.attempt == 1


async def test_error_text_is_cut_to_1000_characters(repository: JobRepository) -> None:
    await enqueue(repository, max_attempts=1)

    job = await repository.fail((await claim_one(repository)).lease, "x" * 5000)

    assert job.error_message == "x" * limits.ERROR_TEXT_LIMIT


async def test_timeout_text_is_recorded_as_given(repository: JobRepository) -> None:
    await enqueue(repository, max_attempts=1)

    job = await repository.fail((await claim_one(repository)).lease, state_machine.TIMEOUT_ERROR_TEXT)

    assert job.error_message == "Background job timed out."


async def test_cancel_of_a_queued_job_cancels_it_at_once(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)

    job = await repository.cancel(OWNER, job_id)

    assert job.status is JobStatus.CANCELLED and job.completed_at == clock.now()
    assert (await repository.claim("w1", 1, LEASE)).jobs == []
    assert await event_types(repository, job_id) == ["job.queued", "job.cancelled"]


async def test_cancel_of_a_finished_job_changes_nothing_and_answers_it_without_its_result(
    repository: JobRepository,
) -> None:
    # An owner's write answers the job as List does, without what it produced
    # (Get shows that): on every engine alike.
    job_id = await enqueue(repository)
    await repository.succeed((await claim_one(repository)).lease, {"rows": 3})

    job = await repository.cancel(OWNER, job_id)

    assert job.status is JobStatus.SUCCEEDED and job.result is None
    assert (await repository.get(OWNER, job_id)).result == {"rows": 3}
    assert await event_types(repository, job_id) == ["job.queued", "job.started", "job.succeeded"]


async def test_cancel_of_a_running_job_only_requests_it(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    assert await repository.cancel_requested(claimed.lease) is False

    job = await repository.cancel(OWNER, job_id)
    again = await repository.cancel(OWNER, job_id)

    assert job.status is JobStatus.RUNNING and job.cancel_requested_at == clock.now()
    assert again == job
    assert await repository.cancel_requested(claimed.lease) is True
    assert await event_types(repository, job_id) == [
        "job.queued",
        "job.started",
        "job.cancel_requested",
    ]
    done = await repository.mark_cancelled(claimed.lease)
    assert done.status is JobStatus.CANCELLED
    assert (await event_types(repository, job_id))[-1] == "job.cancelled"


async def test_a_cancel_request_wins_over_a_handler_that_returns(
    repository: JobRepository,
) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    await repository.cancel(OWNER, job_id)

    job = await repository.succeed(claimed.lease)

    assert job.status is JobStatus.CANCELLED
    assert (await event_types(repository, job_id))[-1] == "job.cancelled"


async def test_a_failure_after_a_cancel_request_is_not_retried(repository: JobRepository) -> None:
    job_id = await enqueue(repository, max_attempts=5)
    claimed = await claim_one(repository)
    await repository.cancel(OWNER, job_id)

    job = await repository.fail(claimed.lease, "boom")

    assert job.status is JobStatus.FAILED


@pytest.mark.parametrize("terminal", ["succeeded", "failed", "cancelled"])
async def test_cancel_of_a_finished_job_changes_nothing(
    repository: JobRepository, clock: ManualClock, terminal: str
) -> None:
    job_id = await enqueue(repository, max_attempts=1)
    if terminal == "cancelled":
        await repository.cancel(OWNER, job_id)
    else:
        claimed = await claim_one(repository)
        if terminal == "succeeded":
            await repository.succeed(claimed.lease)
        else:
            await repository.fail(claimed.lease, "boom")
    before = await repository.get(OWNER, job_id)
    events_before = await event_types(repository, job_id)
    clock.advance(5)

    after = await repository.cancel(OWNER, job_id)

    assert after == before and after.status.value == terminal
    assert await event_types(repository, job_id) == events_before


@pytest.mark.parametrize("source_status", ["failed", "cancelled"])
async def test_retry_creates_a_new_linked_job(repository: JobRepository, source_status: str) -> None:
    source_id = await enqueue(
        repository,
        kind="example.sleep",
        payload={"seconds": 1},
        resource_type="doc",
        resource_id="42",
        max_attempts=1,
        timeout_seconds=77,
    )
    if source_status == "failed":
        await repository.fail((await claim_one(repository)).lease, "boom")
    else:
        await repository.cancel(OWNER, source_id)

    child = await repository.retry(OWNER, source_id)

    assert child.id != source_id and child.retry_of_job_id == source_id
    assert child.status is JobStatus.QUEUED and child.attempt == 0
    assert (child.kind, child.resource_type, child.resource_id) == ("example.sleep", "doc", "42")
    assert (child.max_attempts, child.timeout_seconds) == (1, 77)
    assert child.error_message is None
    claimed = await claim_one(repository)
    assert claimed.job.id == child.id and claimed.payload == {"seconds": 1}
    assert (await repository.get(OWNER, source_id)).status.value == source_status


@pytest.mark.parametrize("source_status", ["queued", "running", "succeeded"])
async def test_retry_is_refused_unless_failed_or_cancelled(
    repository: JobRepository, source_status: str
) -> None:
    source_id = await enqueue(repository)
    if source_status != "queued":
        claimed = await claim_one(repository)
        if source_status == "succeeded":
            await repository.succeed(claimed.lease)

    with pytest.raises(RetryNotAllowed):
        await repository.retry(OWNER, source_id)

    page = await repository.list_jobs(OWNER, JobFilter(), 10, None)
    assert [job.id for job in page.jobs] == [source_id]


async def test_concurrent_event_appends_get_gap_free_sequences(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)

    appended = await asyncio.gather(
        *(repository.append_event(claimed.lease, "step", {"i": i}) for i in range(50))
    )

    events = await repository.list_events(OWNER, job_id, 0, 1000)
    assert [e.sequence for e in events] == list(range(1, 53))
    assert sorted(e.sequence for e in appended) == list(range(3, 53))
    assert {e.payload["i"] for e in events if e.type == "step"} == set(range(50))


async def test_list_events_resumes_after_a_sequence_with_a_limit(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    for i in range(10):
        await repository.append_event(claimed.lease, "step", {"i": i})

    window = await repository.list_events(OWNER, job_id, 4, 3)
    beyond = await repository.list_events(OWNER, job_id, 12, 10)

    assert [e.sequence for e in window] == [5, 6, 7]
    assert beyond == []


async def test_commits_are_announced_to_listeners(repository: JobRepository) -> None:
    with repository.changes.watch_work() as work:
        job_id = await enqueue(repository)
        assert work.is_set()
    claimed = await claim_one(repository)
    with repository.changes.watch_job(job_id) as subscription:
        appended = await repository.append_event(claimed.lease, "step", {"n": 1})
        await repository.succeed(claimed.lease)
        published, complete = subscription.take()

    # The committed events themselves, in order, so watchers need not read them.
    assert complete
    assert [(e.sequence, e.type, e.payload) for e in published] == [
        (appended.sequence, "step", {"n": 1}),
        (appended.sequence + 1, "job.succeeded", {}),
    ]
    assert published == await repository.list_events(OWNER, job_id, appended.sequence - 1, 10)


async def test_release_hands_the_attempt_back_without_counting_it(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository, max_attempts=1)
    claimed = await claim_one(repository)
    clock.advance(1)

    released = await repository.release(claimed.lease)
    again = await claim_one(repository)

    assert released.status is JobStatus.QUEUED and released.attempt == 0
    assert released.available_at == clock.now()
    assert again.job.id == job_id and again.job.attempt == 1
    assert (await event_types(repository, job_id))[-2:] == ["job.released", "job.started"]
    with pytest.raises(LeaseLost):
        await repository.succeed(claimed.lease)


async def test_a_success_clears_the_error_of_an_earlier_attempt(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    await repository.fail((await claim_one(repository)).lease, "boom")
    clock.advance(10)

    job = await repository.succeed((await claim_one(repository)).lease)

    assert job.status is JobStatus.SUCCEEDED and job.error_message is None
    scheduled = [
        e for e in await repository.list_events(OWNER, job_id, 0, 100) if e.type == "job.retry_scheduled"
    ]
    assert scheduled[0].payload["error"] == "boom"


async def test_a_success_keeps_its_result_which_get_shows_and_a_list_page_leaves_out(
    repository: JobRepository,
) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)

    done = await repository.succeed(claimed.lease, {"rows": 3, "ok": True, "names": ["a"]})

    assert done.status is JobStatus.SUCCEEDED
    assert done.result == {"rows": 3, "ok": True, "names": ["a"]}
    assert (await repository.get(OWNER, job_id)).result == {"rows": 3, "ok": True, "names": ["a"]}
    page = await repository.list_jobs(OWNER, JobFilter(), 10, None)
    assert [job.result for job in page.jobs] == [None]


async def test_a_success_without_a_result_has_none(repository: JobRepository) -> None:
    job_id = await enqueue(repository)

    await repository.succeed((await claim_one(repository)).lease)

    assert (await repository.get(OWNER, job_id)).result is None


async def test_a_pending_cancel_wins_over_a_success_and_drops_its_result(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    await repository.cancel(OWNER, job_id)

    done = await repository.succeed(claimed.lease, {"rows": 3})

    assert done.status is JobStatus.CANCELLED and done.result is None
    assert (await repository.get(OWNER, job_id)).result is None


async def test_a_stale_lease_cannot_set_a_result(repository: JobRepository, clock: ManualClock) -> None:
    job_id = await enqueue(repository)
    stale = await claim_one(repository, "w1")
    clock.advance(LEASE + 1)
    current = await claim_one(repository, "w2")

    with pytest.raises(LeaseLost):
        await repository.succeed(stale.lease, {"from": "stale"})

    await repository.succeed(current.lease, {"from": "current"})
    assert (await repository.get(OWNER, job_id)).result == {"from": "current"}
