"""Checkpoints: what an attempt saved of its progress, written only by its lease
holder and handed to the next attempt at its claim."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import JobStatus
from leasehold._server.jobs.repository import JobRepository
from leasehold.worker import LeaseLost
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types
from tests.support import OWNER


async def test_a_first_attempt_has_no_checkpoint(repository: JobRepository) -> None:
    await enqueue(repository)

    assert (await claim_one(repository)).checkpoint is None


async def test_the_holders_checkpoint_reaches_the_attempt_after_a_failure(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    first = await claim_one(repository)
    await repository.save_checkpoint(first.lease, {"page": 1}, LEASE)
    await repository.save_checkpoint(first.lease, {"page": 7, "seen": ["a", "b"]}, LEASE)
    await repository.fail(first.lease, "flaky", retry_after_seconds=1)
    clock.advance(2)

    second = await claim_one(repository)

    assert second.job.id == job_id and second.job.attempt == 2
    assert second.checkpoint == {"page": 7, "seen": ["a", "b"]}


async def test_saving_a_checkpoint_renews_the_lease_and_writes_no_event(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    events_before = await event_types(repository, job_id)
    clock.advance(LEASE - 1)

    renewal = await repository.save_checkpoint(claimed.lease, {"page": 1}, LEASE)

    assert renewal.expires_at == clock.now() + timedelta(seconds=LEASE)
    assert renewal.cancel_requested is False
    clock.advance(LEASE - 1)  # past the claim's expiry, inside the renewed one
    await repository.renew(claimed.lease, LEASE)
    assert await event_types(repository, job_id) == events_before


async def test_a_stale_leases_checkpoint_is_refused_and_never_stored(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository)
    stale = await claim_one(repository, "w1")
    await repository.save_checkpoint(stale.lease, {"page": 1}, LEASE)
    clock.advance(LEASE + 1)
    current = await claim_one(repository, "w2")
    assert current.checkpoint == {"page": 1}

    with pytest.raises(LeaseLost):
        await repository.save_checkpoint(stale.lease, {"page": "stale"}, LEASE)

    await repository.fail(current.lease, "flaky", retry_after_seconds=1)
    clock.advance(2)
    assert (await claim_one(repository, "w3")).checkpoint == {"page": 1}


async def test_an_expired_lease_cannot_save_even_before_anyone_reclaims(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository)
    claimed = await claim_one(repository)
    clock.advance(LEASE)  # the lease ends exactly now

    with pytest.raises(LeaseLost):
        await repository.save_checkpoint(claimed.lease, {"page": 1}, LEASE)

    assert (await claim_one(repository)).checkpoint is None


async def test_an_attempt_past_its_deadline_cannot_save(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository, timeout_seconds=5)
    claimed = await claim_one(repository)
    clock.advance(6)  # past the timeout, the lease itself not yet expired

    with pytest.raises(LeaseLost):
        await repository.save_checkpoint(claimed.lease, {"page": 1}, LEASE)


async def test_the_checkpoint_survives_lease_recovery(repository: JobRepository, clock: ManualClock) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    await repository.save_checkpoint(claimed.lease, {"page": 3}, LEASE)
    clock.advance(LEASE + 1)

    assert [job.job_id for job in await repository.recover_expired_leases()] == [job_id]
    again = await claim_one(repository, "w2")

    assert again.job.attempt == 2 and again.checkpoint == {"page": 3}


async def test_the_checkpoint_survives_a_snooze(repository: JobRepository, clock: ManualClock) -> None:
    await enqueue(repository)
    claimed = await claim_one(repository)
    await repository.save_checkpoint(claimed.lease, {"page": 4}, LEASE)
    await repository.snooze(claimed.lease, 10)
    clock.advance(11)

    assert (await claim_one(repository)).checkpoint == {"page": 4}


async def test_a_manual_retry_starts_without_the_checkpoint(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository, max_attempts=1)
    claimed = await claim_one(repository)
    await repository.save_checkpoint(claimed.lease, {"page": 5}, LEASE)
    failed = await repository.fail(claimed.lease, "broken")
    assert failed.status is JobStatus.FAILED

    retry = await repository.retry(OWNER, job_id)
    again = await claim_one(repository)

    assert again.job.id == retry.id and again.checkpoint is None
