"""A claim that waits for work is made by the write that makes the work, in that
write's own transaction (DESIGN §15's trickle: one commit between an Enqueue
and its handler), on every engine; giving the wait up claims nothing."""

from __future__ import annotations

import asyncio

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import ClaimResult, JobStatus, NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import ANY_KIND, KindFilter
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types, recovered_ids
from tests.support import OWNER

WAIT = 30.0  # never reached: each test ends the wait itself


def waiting_claim(
    repository: JobRepository, give_up: asyncio.Event, limit: int = 4, kinds: KindFilter = ANY_KIND
) -> asyncio.Task[ClaimResult | None]:
    return asyncio.create_task(repository.claim_with_next_work("w", limit, LEASE, kinds, give_up, WAIT))


async def settle() -> None:
    """Let the waiting claim register with the engine."""
    for _ in range(5):
        await asyncio.sleep(0)


async def test_the_enqueue_that_makes_the_work_makes_the_waiting_claim(repository: JobRepository) -> None:
    waiting = waiting_claim(repository, asyncio.Event())
    await settle()

    job_id = await enqueue(repository)
    # Already leased when the Enqueue returns: the claim committed with it.
    assert (await repository.get(OWNER, job_id)).status is JobStatus.RUNNING

    result = await waiting
    assert result is not None
    assert [c.job.id for c in result.jobs] == [job_id]
    assert result.jobs[0].job.attempt == 1
    assert await event_types(repository, job_id) == ["job.queued", "job.started"]


async def test_a_batch_enqueue_fills_the_waiting_claim_up_to_its_limit_in_claim_order(
    repository: JobRepository,
) -> None:
    waiting = waiting_claim(repository, asyncio.Event(), limit=2)
    await settle()
    made = await repository.enqueue_batch(
        [NewJob(owner_id=OWNER, kind="example.echo", payload={"n": n}) for n in range(3)]
    )

    result = await waiting
    assert result is not None
    assert [c.job.id for c in result.jobs] == [job.id for job, _ in made[:2]]
    assert (await repository.get(OWNER, made[2][0].id)).status is JobStatus.QUEUED


async def test_giving_up_claims_nothing_and_later_work_waits_in_the_queue(repository: JobRepository) -> None:
    give_up = asyncio.Event()
    waiting = waiting_claim(repository, give_up)
    await settle()
    give_up.set()
    assert await waiting is None

    job_id = await enqueue(repository)
    assert (await repository.get(OWNER, job_id)).status is JobStatus.QUEUED
    assert (await claim_one(repository)).job.id == job_id


async def test_a_wait_that_times_out_claims_nothing(repository: JobRepository) -> None:
    result = await repository.claim_with_next_work("w", 1, LEASE, ANY_KIND, asyncio.Event(), 0.01)
    assert result is None
    job_id = await enqueue(repository)
    assert (await repository.get(OWNER, job_id)).status is JobStatus.QUEUED


async def test_a_cancelled_wait_leaves_the_next_job_queued(repository: JobRepository) -> None:
    waiting = waiting_claim(repository, asyncio.Event())
    await settle()
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)

    job_id = await enqueue(repository)
    assert (await repository.get(OWNER, job_id)).status is JobStatus.QUEUED


async def test_writes_that_make_no_work_leave_the_claim_waiting(
    repository: JobRepository, clock: ManualClock
) -> None:
    await enqueue(repository)
    running = await claim_one(repository)
    give_up = asyncio.Event()
    waiting = waiting_claim(repository, give_up)
    await settle()

    await repository.append_event(running.lease, "progress", {})
    await repository.heartbeat([running.lease], LEASE)
    await repository.succeed(running.lease)
    await settle()
    assert not waiting.done()

    give_up.set()
    assert await waiting is None


async def test_a_lease_the_rescuer_recovers_goes_to_the_waiting_claim(
    repository: JobRepository, clock: ManualClock
) -> None:
    """A stalled worker's job is work again once its lease is recovered, so the
    recovery's own commit claims it for the worker that is waiting."""
    job_id = await enqueue(repository)
    await claim_one(repository)  # its worker stalls: no heartbeat, no write
    waiting = waiting_claim(repository, asyncio.Event())
    await settle()
    clock.advance(LEASE + 1)

    assert await recovered_ids(repository) == [job_id]

    result = await asyncio.wait_for(waiting, 5)
    assert result is not None
    assert [(c.job.id, c.job.attempt) for c in result.jobs] == [(job_id, 2)]
    assert (await event_types(repository, job_id))[-2:] == ["job.lease_expired", "job.started"]


async def test_work_the_filter_refuses_answers_the_claim_with_no_jobs(repository: JobRepository) -> None:
    waiting = waiting_claim(repository, asyncio.Event(), kinds=KindFilter(only=frozenset({"pdf.render"})))
    await settle()
    job_id = await enqueue(repository, kind="example.echo")

    result = await waiting
    assert result is not None and result.jobs == []
    assert (await repository.get(OWNER, job_id)).status is JobStatus.QUEUED


async def test_a_wait_cancelled_just_after_its_claim_was_made_hands_the_job_back(
    repository: JobRepository,
) -> None:
    waiting = waiting_claim(repository, asyncio.Event())
    await settle()
    job_id = await enqueue(repository)
    # The enqueue's commit leased the job to the waiting claim; its caller goes
    # away before it could take the answer.
    waiting.cancel()
    outcome = await asyncio.gather(waiting, return_exceptions=True)
    assert isinstance(outcome[0], asyncio.CancelledError)

    job = await repository.get(OWNER, job_id)
    assert (job.status, job.attempt) == (JobStatus.QUEUED, 0)  # handed back, not counted
    assert (await claim_one(repository)).job.attempt == 1
