"""What remote workers add to the repository contract (DESIGN §10), on every
engine under an injected clock: claims filtered by kind, many heartbeats at
once with the cancel flag, server-side deadlines (timeouts and a cancel's
grace), snoozes, and a worker's own retry delay."""

from __future__ import annotations

from datetime import timedelta

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import limits, state_machine
from leasehold._server.jobs.records import JobStatus, Lease
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindFilter, KindPatterns
from leasehold.worker import LeaseLost
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types, recovered_ids
from tests.support import OWNER

REMOTE = KindPatterns.parse(["media.*", "pdf.render"])


async def test_a_claim_takes_only_the_kinds_its_filter_admits(repository: JobRepository) -> None:
    local = await enqueue(repository, kind="example.echo")
    media = await enqueue(repository, kind="media.transcode")
    pdf = await enqueue(repository, kind="pdf.render")
    lookalike = await enqueue(repository, kind="mediax")  # not under the `media.` prefix

    in_process = await repository.claim("runtime", 10, LEASE, KindFilter(excluding=REMOTE))
    assert [c.job.id for c in in_process.jobs] == [local, lookalike]

    remote = await repository.claim("w", 10, LEASE, KindFilter(only=frozenset({"pdf.render"})))
    assert [c.job.id for c in remote.jobs] == [pdf]
    other = await repository.claim("w", 10, LEASE, KindFilter(only=frozenset({"media.transcode", "x"})))
    assert [c.job.id for c in other.jobs] == [media]


async def test_an_underscore_in_a_remote_prefix_is_no_wildcard(repository: JobRepository) -> None:
    # LIKE treats `_` as any character; the prefix match must not.
    patterns = KindPatterns.parse(["a_b.*"])
    await enqueue(repository, kind="axb.job")
    claimed = await repository.claim("runtime", 10, LEASE, KindFilter(excluding=patterns))
    assert [c.job.kind for c in claimed.jobs] == ["axb.job"]


async def test_one_heartbeat_answers_every_lease_with_its_cancel_flag(
    repository: JobRepository, clock: ManualClock
) -> None:
    first = await enqueue(repository)
    await enqueue(repository)
    a, b = (await repository.claim("w", 2, LEASE)).jobs
    await repository.cancel(OWNER, first)
    stale = Lease(job_id=b.job.id, token="not-the-token", attempt=1)
    clock.advance(5)

    answers = await repository.heartbeat([a.lease, b.lease, stale], LEASE)

    assert answers[0] is not None and answers[0].cancel_requested
    assert answers[1] is not None and not answers[1].cancel_requested
    assert answers[0].expires_at == clock.now() + timedelta(seconds=LEASE)
    assert answers[2] is None  # a stale token on a job whose real lease was renewed


async def test_an_attempt_past_its_timeout_is_ended_even_while_it_heartbeats(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository, timeout_seconds=60, max_attempts=2)
    claimed = await claim_one(repository)
    for _ in range(2):  # the worker keeps its lease alive, 25 s and 50 s in
        clock.advance(25)
        assert (await repository.heartbeat([claimed.lease], LEASE))[0] is not None
    clock.advance(25)  # 75 s in, past the 60 s timeout, inside the renewed lease
    assert await repository.heartbeat([claimed.lease], LEASE) == [None]

    assert await recovered_ids(repository) == [job_id]

    job = await repository.get(OWNER, job_id)
    assert job.status is JobStatus.QUEUED
    assert job.error_message == state_machine.TIMEOUT_ERROR_TEXT
    assert job.error_type == state_machine.TIMEOUT_ERROR_TYPE
    assert job.available_at == clock.now() + timedelta(seconds=state_machine.backoff_seconds(1))
    with pytest.raises(LeaseLost):
        await repository.succeed(claimed.lease)

    clock.advance(10)
    second = await claim_one(repository)
    clock.advance(61)
    await repository.recover_expired_leases()
    assert (await repository.get(OWNER, job_id)).status is JobStatus.FAILED
    assert (await event_types(repository, job_id))[-1] == "job.failed"
    assert second.job.attempt == 2


async def test_the_longest_timeout_is_claimed_and_enforced_to_the_second(
    repository: JobRepository, clock: ManualClock
) -> None:
    # A deadline is now + timeout in microseconds; past 2,147 s that overflows a
    # 32-bit product, which on PostgreSQL failed every claim of the job.
    job_id = await enqueue(repository, timeout_seconds=limits.TIMEOUT_SECONDS_LIMIT)
    claimed = await claim_one(repository)
    assert claimed.job.id == job_id
    day = 2 * limits.TIMEOUT_SECONDS_LIMIT  # a lease that outlives the deadline
    assert (await repository.heartbeat([claimed.lease], day))[0] is not None

    clock.advance(limits.TIMEOUT_SECONDS_LIMIT - 1)
    assert (await repository.heartbeat([claimed.lease], day))[0] is not None
    clock.advance(1)
    assert await repository.heartbeat([claimed.lease], day) == [None]


async def test_a_running_job_that_ignores_a_cancel_ends_cancelled_after_the_grace(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    await repository.cancel(OWNER, job_id, grace_seconds=10)
    clock.advance(9)
    (renewal,) = await repository.heartbeat([claimed.lease], LEASE)
    assert renewal is not None and renewal.cancel_requested
    assert await recovered_ids(repository) == []

    clock.advance(1)
    assert await repository.heartbeat([claimed.lease], LEASE) == [None]
    assert await recovered_ids(repository) == [job_id]

    assert (await repository.get(OWNER, job_id)).status is JobStatus.CANCELLED
    assert (await event_types(repository, job_id))[-2:] == ["job.cancel_requested", "job.cancelled"]
    with pytest.raises(LeaseLost):
        await repository.mark_cancelled(claimed.lease)


async def test_a_cancel_grace_never_extends_the_timeout(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository, timeout_seconds=20, max_attempts=1)
    await claim_one(repository)
    clock.advance(15)
    await repository.cancel(OWNER, job_id, grace_seconds=600)
    clock.advance(5)

    assert await recovered_ids(repository) == [job_id]
    # Past the timeout with a cancel pending: the cancel wins, as it does over a failure.
    assert (await repository.get(OWNER, job_id)).status is JobStatus.CANCELLED


async def test_a_snooze_requeues_after_its_delay_without_counting_the_attempt(
    repository: JobRepository, clock: ManualClock
) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)

    job = await repository.snooze(claimed.lease, 90)

    assert job.status is JobStatus.QUEUED and job.attempt == 0
    assert job.available_at == clock.now() + timedelta(seconds=90)
    events = await repository.list_events(OWNER, job_id, 0, 10)
    assert events[-1].type == "job.snoozed"
    assert events[-1].payload == {"attempt": 1, "available_at": state_machine.rfc3339(job.available_at)}
    assert (await repository.claim("w", 1, LEASE)).jobs == []
    clock.advance(90)
    assert (await claim_one(repository)).job.attempt == 1
    with pytest.raises(LeaseLost):
        await repository.snooze(claimed.lease, 5)


async def test_a_snooze_with_a_cancel_pending_ends_the_job_cancelled(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)
    await repository.cancel(OWNER, job_id)

    assert (await repository.snooze(claimed.lease, 30)).status is JobStatus.CANCELLED


async def test_a_failure_waits_the_delay_its_worker_asks_for(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository)
    claimed = await claim_one(repository)

    job = await repository.fail(claimed.lease, "rate limited", error_type="HTTP429", retry_after_seconds=120)

    assert job.status is JobStatus.QUEUED
    assert job.available_at == clock.now() + timedelta(seconds=120)


async def test_a_failure_without_a_delay_waits_the_backoff_of_the_jobs_own_attempt(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository, max_attempts=5)
    first = await claim_one(repository)
    await repository.fail(first.lease, "boom")
    clock.advance(state_machine.backoff_seconds(1))
    second = await claim_one(repository)
    # A remote worker's lease names only the token: the backoff comes from the row.
    remote_lease = Lease(job_id=second.job.id, token=second.lease.token, attempt=0)

    job = await repository.fail(remote_lease, "boom again")

    assert job.available_at == clock.now() + timedelta(seconds=state_machine.backoff_seconds(2))


async def test_a_job_the_claimer_never_takes_is_no_reason_to_look_again(
    repository: JobRepository, clock: ManualClock
) -> None:
    """Else a runtime beside a queued remote job would claim in a loop: the job
    is due now, for ever, for someone else."""
    await enqueue(repository, kind="media.transcode")
    local_later = await enqueue(repository, kind="example.echo")
    (claimed,) = (await repository.claim("runtime", 1, LEASE, KindFilter(excluding=REMOTE))).jobs
    assert claimed.job.id == local_later  # the local job, now running

    in_process = await repository.claim("runtime", 1, LEASE, KindFilter(excluding=REMOTE))
    assert in_process.jobs == []
    assert in_process.next_wakeup_at == claimed.lease_expires_at  # not the remote job's "now"

    other_worker = await repository.claim("w", 1, LEASE, KindFilter(only=frozenset({"pdf.render"})))
    assert other_worker.next_wakeup_at == claimed.lease_expires_at
