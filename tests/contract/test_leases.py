"""Claiming, lease fencing and expired-lease recovery."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import state_machine
from leasehold._server.jobs.records import JobStatus, Lease
from leasehold._server.jobs.repository import JobRepository
from leasehold.worker import LeaseLost
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types, recovered_ids
from tests.support import OWNER


async def test_claim_takes_the_earliest_available_job_first(
    repository: JobRepository, clock: ManualClock
) -> None:
    first = await enqueue(repository)
    clock.advance(1)
    second = await enqueue(repository)
    clock.advance(1)

    assert (await claim_one(repository)).job.id == first
    assert (await claim_one(repository)).job.id == second
    assert (await repository.claim("w1", 5, LEASE)).jobs == []


async def test_claim_orders_by_available_at_before_created_at(
    repository: JobRepository, clock: ManualClock
) -> None:
    retried = await enqueue(repository, max_attempts=5)
    claimed = await claim_one(repository)
    await repository.fail(claimed.lease, "boom")  # available again 2 s from now
    clock.advance(1)
    fresh = await enqueue(repository)  # created later, but available sooner
    clock.advance(5)

    result = await repository.claim("w1", 2, LEASE)

    assert [c.job.id for c in result.jobs] == [fresh, retried]


async def test_claim_fills_every_free_slot_in_one_call(repository: JobRepository, clock: ManualClock) -> None:
    ids = [await enqueue(repository) for _ in range(5)]

    result = await repository.claim("w1", 3, LEASE)

    assert [c.job.id for c in result.jobs] == ids[:3]
    for claimed in result.jobs:
        assert claimed.job.status is JobStatus.RUNNING
        assert claimed.job.attempt == claimed.lease.attempt == 1
        assert claimed.job.started_at == clock.now()
        assert claimed.lease_expires_at == clock.now() + (claimed.lease_expires_at - clock.now())
        assert (claimed.lease_expires_at - clock.now()).total_seconds() == LEASE
        assert await event_types(repository, claimed.job.id) == ["job.queued", "job.started"]
    started = (await repository.list_events(OWNER, ids[0], 1, 10))[0]
    assert started.payload == {"attempt": 1}


async def test_claim_returns_the_payload_and_when_to_look_again(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository, payload={"deep": {"list": [1, "two", None, True]}})

    result = await repository.claim("w1", 2, LEASE)

    assert result.jobs[0].payload == {"deep": {"list": [1, "two", None, True]}}
    assert result.next_wakeup_at == result.jobs[0].lease_expires_at
    # A claim that got all it asked for is made again at once: it looks no further.
    await enqueue(repository)
    assert (await repository.claim("w1", 1, LEASE)).next_wakeup_at is None


async def test_claim_with_nothing_to_do_reports_no_wakeup(repository: JobRepository) -> None:
    result = await repository.claim("w1", 4, LEASE)

    assert result.jobs == [] and result.next_wakeup_at is None


async def test_expired_lease_is_recovered_by_the_next_claim_as_a_new_attempt(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    first = await claim_one(repository, "w1")
    first_started_at = first.job.started_at
    clock.advance(LEASE + 1)

    result = await repository.claim("w2", 1, LEASE)
    second = result.jobs[0]

    assert result.expired_job_ids == [job_id]
    assert second.job.id == job_id
    assert second.job.attempt == 2
    assert second.job.started_at == first_started_at
    assert second.lease.token != first.lease.token
    assert await event_types(repository, job_id) == [
        "job.queued",
        "job.started",
        "job.lease_expired",
        "job.started",
    ]
    expired = (await repository.list_events(OWNER, job_id, 2, 1))[0]
    assert expired.payload == {"attempt": 1}


async def test_expired_lease_with_no_attempts_left_fails_the_job(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository, max_attempts=1)
    await claim_one(repository)
    clock.advance(LEASE + 1)

    assert (await repository.claim("w2", 1, LEASE)).jobs == []

    job = await repository.get(OWNER, job_id)
    assert job.status is JobStatus.FAILED
    assert job.error_message == state_machine.LEASE_EXPIRED_ERROR_TEXT
    assert job.error_type == state_machine.LEASE_EXPIRED_ERROR_TYPE
    assert job.completed_at == clock.now()
    assert (await event_types(repository, job_id))[-2:] == ["job.lease_expired", "job.failed"]


async def test_expired_lease_of_a_cancel_requested_job_cancels_it(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    await claim_one(repository)
    await repository.cancel(OWNER, job_id)
    clock.advance(LEASE + 1)

    assert (await repository.claim("w2", 1, LEASE)).jobs == []

    job = await repository.get(OWNER, job_id)
    assert job.status is JobStatus.CANCELLED
    assert (await event_types(repository, job_id))[-2:] == ["job.lease_expired", "job.cancelled"]


WORKER_CALLS = ["renew", "succeed", "fail", "mark_cancelled", "release", "append_event", "cancel_requested"]


def stale_calls(repository: JobRepository, lease: Lease) -> dict[str, Callable[[], Awaitable[object]]]:
    return {
        "renew": lambda: repository.renew(lease, LEASE),
        "succeed": lambda: repository.succeed(lease),
        "fail": lambda: repository.fail(lease, "late"),
        "mark_cancelled": lambda: repository.mark_cancelled(lease),
        "release": lambda: repository.release(lease),
        "append_event": lambda: repository.append_event(lease, "late", {}),
        "cancel_requested": lambda: repository.cancel_requested(lease),
    }


@pytest.mark.parametrize("call", WORKER_CALLS)
async def test_a_stale_lease_is_rejected_after_the_job_was_reclaimed_by_the_same_worker(
    repository: JobRepository, clock: ManualClock, call: str
) -> None:
    job_id = await enqueue(repository)
    stale = await claim_one(repository, "same-worker")
    clock.advance(LEASE + 1)
    current = await claim_one(repository, "same-worker")
    events_before = await event_types(repository, job_id)

    with pytest.raises(LeaseLost):
        await stale_calls(repository, stale.lease)[call]()

    job = await repository.get(OWNER, job_id)
    assert job.status is JobStatus.RUNNING and job.attempt == 2
    assert await event_types(repository, job_id) == events_before
    assert await repository.cancel_requested(current.lease) is False


@pytest.mark.parametrize("call", WORKER_CALLS)
async def test_an_expired_lease_is_rejected_even_before_anyone_reclaims(
    repository: JobRepository, clock: ManualClock, call: str
) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    clock.advance(LEASE)  # the lease ends exactly now

    with pytest.raises(LeaseLost):
        await stale_calls(repository, claimed.lease)[call]()

    assert (await repository.get(OWNER, job_id)).status is JobStatus.RUNNING


async def test_a_forged_token_is_rejected(repository: JobRepository) -> None:
    await enqueue(repository)
    claimed = await claim_one(repository)
    forged = Lease(claimed.lease.job_id, "0" * 32, claimed.lease.attempt)

    for call in stale_calls(repository, forged).values():
        with pytest.raises(LeaseLost):
            await call()


async def test_renew_extends_the_lease(repository: JobRepository, clock: ManualClock) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    clock.advance(LEASE - 1)

    expires_at = await repository.renew(claimed.lease, LEASE)
    clock.advance(2)  # past the original expiry, inside the renewed one

    assert (expires_at - clock.now()).total_seconds() == LEASE - 2
    assert (await repository.claim("w2", 1, LEASE)).jobs == []
    done = await repository.succeed(claimed.lease)
    assert done.id == job_id and done.status is JobStatus.SUCCEEDED


async def test_a_lost_lease_cannot_overwrite_the_new_attempts_outcome(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    stale = await claim_one(repository, "w1")
    clock.advance(LEASE + 1)
    current = await claim_one(repository, "w2")
    await repository.succeed(current.lease)

    with pytest.raises(LeaseLost):
        await repository.fail(stale.lease, "too late")

    job = await repository.get(OWNER, job_id)
    assert job.status is JobStatus.SUCCEEDED and job.error_message is None


async def test_jobs_queued_before_the_clock_stepped_back_are_claimable_at_once(
    repository: JobRepository, clock: ManualClock
) -> None:
    """An NTP step or a snapshot restore moves the wall clock back: a job queued
    before it must not wait out the step (an hour here) to run."""
    queued = await enqueue(repository)
    clock.advance(-3600)

    result = await repository.claim("w1", 5, LEASE)

    assert [c.job.id for c in result.jobs] == [queued]


async def test_a_retry_backoff_survives_a_step_back_but_the_step_is_not_added(
    repository: JobRepository, clock: ManualClock
) -> None:
    job = await enqueue(repository, max_attempts=3)
    await repository.fail((await claim_one(repository)).lease, "boom", True)  # due 2 s from now
    clock.advance(-3600)

    assert (await repository.claim("w1", 5, LEASE)).jobs == []  # still backing off
    clock.advance(2)
    assert [c.job.id for c in (await repository.claim("w1", 5, LEASE)).jobs] == [job]


async def test_outcomes_and_heartbeats_written_together_each_answer_their_own_lease(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Concurrent calls may share one transaction (and, in the SQL engine, one
    statement); each caller still gets the answer its own lease deserves, and a
    stale lease next to the valid one for the same job changes nothing."""
    for _ in range(6):
        await enqueue(repository)
    stale = await claim_one(repository)
    clock.advance(LEASE + 1)  # its lease runs out; the next claim takes the job back
    claimed = (await repository.claim("w2", 10, LEASE)).jobs
    assert stale.job.id in {c.job.id for c in claimed}
    current = next(c for c in claimed if c.job.id == stale.job.id)
    forged = Lease(job_id=claimed[1].job.id, token="not-the-token", attempt=1)

    renewals = await asyncio.gather(
        *(repository.renew(c.lease, LEASE) for c in claimed),
        repository.renew(stale.lease, LEASE),
        repository.renew(forged, LEASE),
        return_exceptions=True,
    )
    outcomes = await asyncio.gather(
        repository.succeed(stale.lease),
        *(repository.succeed(c.lease) for c in claimed),
        repository.succeed(forged),
        repository.succeed(current.lease),  # twice: the second finds it finished
        return_exceptions=True,
    )

    assert all(not isinstance(r, Exception) for r in renewals[: len(claimed)])
    assert [type(r) for r in renewals[len(claimed) :]] == [LeaseLost, LeaseLost]
    assert isinstance(outcomes[0], LeaseLost)
    finished = outcomes[1 : 1 + len(claimed)]
    assert [job.id for job in finished] == [c.job.id for c in claimed]  # type: ignore[union-attr]
    assert {job.status for job in finished} == {JobStatus.SUCCEEDED}  # type: ignore[union-attr]
    assert [type(r) for r in outcomes[1 + len(claimed) :]] == [LeaseLost, LeaseLost]
    for c in claimed:
        types = await event_types(repository, c.job.id)
        assert types.count("job.succeeded") == 1 and types[-1] == "job.succeeded"


async def test_recovering_expired_leases_outside_a_claim_requeues_fails_and_cancels(
    repository: JobRepository, clock: ManualClock
) -> None:
    """What the rescuer asks for: the same recovery a claim makes, without leasing
    anything, each expired lease once."""
    requeued = await enqueue(repository, max_attempts=3)
    exhausted = await enqueue(repository, max_attempts=1)
    cancelling = await enqueue(repository, max_attempts=3)
    for _ in range(3):
        await claim_one(repository)
    await repository.cancel(OWNER, cancelling)
    clock.advance(LEASE - 1)
    live = await enqueue(repository)
    assert (await claim_one(repository)).job.id == live  # its lease begins now
    clock.advance(2)  # the first three leases have run out; this one has not

    recovered = await recovered_ids(repository)

    assert sorted(recovered) == sorted([requeued, exhausted, cancelling])
    assert (await repository.get(OWNER, requeued)).status is JobStatus.QUEUED
    assert (await repository.get(OWNER, exhausted)).status is JobStatus.FAILED
    assert (await repository.get(OWNER, cancelling)).status is JobStatus.CANCELLED
    assert (await repository.get(OWNER, live)).status is JobStatus.RUNNING
    assert (await event_types(repository, requeued))[-1] == "job.lease_expired"
    assert await recovered_ids(repository) == []  # once each
    assert (await repository.claim("w2", 5, LEASE)).jobs[0].job.id == requeued  # claimable again
