"""The long-poll claim behind WorkerService.Claim, on the in-memory engine: what
wakes it, and that a poll its caller abandons takes no job with it."""

from __future__ import annotations

import asyncio

import pytest

from leasehold._server.clock import ManualClock, SystemClock
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import JobStatus, NewJob
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.runtime.long_poll import ClaimRequest, LongPollClaimer
from tests.support import OWNER

KIND = "remote.work"
# A safety-net poll far longer than any test: only a wake-up can end a wait early.
POLL = 60.0
# How long a test waits for what should come at once: a quarter of POLL, so an answer within it
# was a wake-up, however loaded the machine.
WAIT = 15.0


async def until_asleep(claimer: LongPollClaimer) -> None:
    """Until the poll has looked once, found nothing and is asleep: a signal, where a sleep
    of any length may end before a loaded machine has taken that first look."""
    async with asyncio.timeout(WAIT):
        while claimer.waiting != 1:
            await asyncio.sleep(0)


def request(wait: float = 30.0) -> ClaimRequest:
    return ClaimRequest(worker_id="w", kinds=KindFilter(only=frozenset({KIND})), limit=1, wait_seconds=wait)


async def enqueue(repository: MemoryJobRepository, kind: str = KIND) -> str:
    job, _ = await repository.enqueue(NewJob(owner_id=OWNER, kind=kind, payload={}))
    return job.id


async def test_a_waiting_claim_is_woken_by_an_enqueue_not_by_its_poll() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)
    waiting = asyncio.ensure_future(claimer.claim(request()))
    await until_asleep(claimer)
    assert not waiting.done()

    job_id = await enqueue(repository)

    (claimed,) = await asyncio.wait_for(waiting, WAIT)
    assert claimed.job.id == job_id


async def test_a_waiting_claim_ignores_kinds_it_did_not_ask_for() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)
    waiting = asyncio.ensure_future(claimer.claim(request(wait=0.3)))
    other = await enqueue(repository, "remote.other")

    assert await asyncio.wait_for(waiting, WAIT) == []
    assert (await repository.get(OWNER, other)).status is JobStatus.QUEUED


async def test_a_waiting_claim_wakes_when_a_retry_falls_due() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)
    job_id = await enqueue(repository)
    (first,) = await claimer.claim(request())
    await repository.fail(first.lease, "busy", retry_after_seconds=0.3)

    (again,) = await asyncio.wait_for(claimer.claim(request()), WAIT)

    assert again.job.id == job_id and again.job.attempt == 2


async def test_an_empty_wait_ends_after_its_wait_seconds() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)

    assert await asyncio.wait_for(claimer.claim(request(wait=0.1)), WAIT) == []


async def test_a_poll_abandoned_while_its_claim_is_written_hands_the_job_back() -> None:
    clock = ManualClock()
    repository = MemoryJobRepository(clock)
    claimer = LongPollClaimer(repository, clock, lease_seconds=30, poll_seconds=POLL)
    job_id = await enqueue(repository)

    poll = asyncio.ensure_future(claimer.claim(request()))
    await asyncio.sleep(0)  # the poll has begun its claim, which has not yet run
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll

    job = await repository.get(OWNER, job_id)
    assert job.status is JobStatus.QUEUED and job.attempt == 0
    events = [e.type for e in await repository.list_events(OWNER, job_id, 0, 10)]
    assert events == ["job.queued", "job.started", "job.released"]
