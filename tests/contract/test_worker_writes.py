"""Repeatable worker writes (worker protocol 2, `worker_writes`) on every engine:
a finishing write remembered in its own transaction and answered again as it
left the job, and an event appended once per request id."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs import worker_writes
from leasehold._server.jobs.errors import RequestIdReused
from leasehold._server.jobs.records import Job, JobStatus, Lease
from leasehold._server.jobs.repository import JobRepository
from leasehold.worker import LeaseLost
from tests.contract.helpers import claim_one, enqueue, event_types
from tests.support import OWNER


def finish(
    repository: JobRepository, lease: Lease, transition: sm.Transition, write: Callable[[], Awaitable[Job]]
) -> Awaitable[Job]:
    return worker_writes.finish_once(repository, lease, transition, write)


async def test_a_repeated_complete_answers_the_job_as_the_first_left_it(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository)
    lease = (await claim_one(repository)).lease

    def complete() -> Awaitable[Job]:
        return repository.succeed(lease, {"total": 3}, remember=True)

    first = await finish(repository, lease, sm.SUCCEED, complete)
    clock.advance(10)
    again = await finish(repository, lease, sm.SUCCEED, complete)

    assert first.status is JobStatus.SUCCEEDED and first.result == {"total": 3}
    assert again == first
    assert (await event_types(repository, lease.job_id)).count("job.succeeded") == 1


async def test_a_repeated_fail_answers_as_it_left_the_job_while_the_next_attempt_runs(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository, max_attempts=3)
    lease = (await claim_one(repository)).lease

    def fail() -> Awaitable[Job]:
        return repository.fail(lease, "boom", retry_after_seconds=5, remember=True)

    first = await finish(repository, lease, sm.FAIL, fail)
    clock.advance(6)
    second_attempt = await claim_one(repository)
    assert second_attempt.job.id == job_id and second_attempt.lease.token != lease.token

    again = await finish(repository, lease, sm.FAIL, fail)

    assert first.status is JobStatus.QUEUED and first.attempt == 1
    assert again == first  # not the job as it is now: running, attempt 2
    assert (await repository.get(OWNER, job_id)).status is JobStatus.RUNNING


async def test_repeated_snooze_and_confirm_cancel_answer_as_the_first(repository: JobRepository) -> None:
    await enqueue(repository)
    snoozed = (await claim_one(repository)).lease
    first_snooze = await finish(
        repository, snoozed, sm.SNOOZE, lambda: repository.snooze(snoozed, 60, remember=True)
    )
    again_snooze = await finish(
        repository, snoozed, sm.SNOOZE, lambda: repository.snooze(snoozed, 60, remember=True)
    )
    assert again_snooze == first_snooze and first_snooze.status is JobStatus.QUEUED

    job_id = await enqueue(repository)
    cancelled = (await claim_one(repository)).lease
    await repository.cancel(OWNER, job_id)
    confirm = lambda: repository.mark_cancelled(cancelled, remember=True)  # noqa: E731
    first = await finish(repository, cancelled, sm.CONFIRM_CANCEL, confirm)
    assert await finish(repository, cancelled, sm.CONFIRM_CANCEL, confirm) == first
    assert first.status is JobStatus.CANCELLED


async def test_another_write_after_a_finishing_write_is_still_refused(repository: JobRepository) -> None:
    await enqueue(repository, max_attempts=3)
    lease = (await claim_one(repository)).lease
    await finish(repository, lease, sm.SUCCEED, lambda: repository.succeed(lease, None, remember=True))

    with pytest.raises(LeaseLost):
        await finish(repository, lease, sm.FAIL, lambda: repository.fail(lease, "late", remember=True))


async def test_a_token_that_never_held_the_job_is_refused(repository: JobRepository) -> None:
    await enqueue(repository)
    lease = (await claim_one(repository)).lease
    await finish(repository, lease, sm.SUCCEED, lambda: repository.succeed(lease, None, remember=True))
    stranger = Lease(job_id=lease.job_id, token="never-held", attempt=1)

    with pytest.raises(LeaseLost):
        await finish(repository, stranger, sm.SUCCEED, lambda: repository.succeed(stranger, remember=True))
    assert await repository.worker_write(stranger, worker_writes.FINISH_KEY) is None


async def test_a_finishing_write_not_remembered_leaves_no_record(repository: JobRepository) -> None:
    await enqueue(repository)
    lease = (await claim_one(repository)).lease
    await repository.succeed(lease)  # the in-process runtime's way
    assert await repository.worker_write(lease, worker_writes.FINISH_KEY) is None


async def test_records_go_with_their_job(repository: JobRepository, clock: ManualClock) -> None:
    await enqueue(repository)
    lease = (await claim_one(repository)).lease
    await repository.append_event(lease, "progress", {}, "step-1")
    assert await repository.worker_write(lease, "step-1") is not None
    await repository.succeed(lease, remember=True)
    clock.advance(3600)

    assert await repository.delete_expired(clock.now(), 10) == 1
    assert await repository.worker_write(lease, worker_writes.FINISH_KEY) is None
    assert await repository.worker_write(lease, "step-1") is None


async def test_an_append_sent_again_with_its_request_id_adds_one_event(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    lease = (await claim_one(repository)).lease

    first = await repository.append_event(lease, "progress", {"done": 1}, "step-1")
    clock.advance(1)
    again = await repository.append_event(lease, "progress", {"done": 1}, "step-1")
    other = await repository.append_event(lease, "progress", {"done": 1}, "step-2")

    assert again.sequence == first.sequence
    assert other.sequence == first.sequence + 1
    assert (await event_types(repository, job_id)).count("progress") == 2


async def test_an_append_repeat_is_answered_after_the_job_finished(repository: JobRepository) -> None:
    await enqueue(repository)
    lease = (await claim_one(repository)).lease
    first = await repository.append_event(lease, "progress", {"done": 1}, "step-1")
    await repository.succeed(lease)

    again = await repository.append_event(lease, "progress", {"done": 1}, "step-1")
    assert again.sequence == first.sequence
    with pytest.raises(LeaseLost):  # a new request id is a new write, and the lease is gone
        await repository.append_event(lease, "progress", {"done": 1}, "step-2")


async def test_a_request_id_sent_with_another_event_is_refused(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    lease = (await claim_one(repository)).lease
    await repository.append_event(lease, "progress", {"done": 1}, "step-1")

    with pytest.raises(RequestIdReused):
        await repository.append_event(lease, "progress", {"done": 2}, "step-1")
    with pytest.raises(RequestIdReused):
        await repository.append_event(lease, "other", {"done": 1}, "step-1")
    assert (await event_types(repository, job_id)).count("progress") == 1


async def test_a_request_id_is_kept_per_lease_token(repository: JobRepository, clock: ManualClock) -> None:
    await enqueue(repository, max_attempts=2)
    first = (await claim_one(repository)).lease
    await repository.append_event(first, "progress", {}, "step-1")
    await repository.fail(first, "boom", retry_after_seconds=1)
    clock.advance(2)
    second = (await claim_one(repository)).lease

    event = await repository.append_event(second, "progress", {}, "step-1")
    assert [e.sequence for e in await repository.list_events(OWNER, second.job_id, 0, 100)][
        -1
    ] == event.sequence
