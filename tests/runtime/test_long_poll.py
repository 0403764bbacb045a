"""The long-poll claim behind WorkerService.Claim, on the in-memory engine: what
wakes it (held attempts' news too), and that a poll its caller abandons takes no
job with it."""

from __future__ import annotations

import asyncio

import pytest

from leasehold._server.clock import ManualClock, SystemClock
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import JobStatus, Lease, NewJob
from leasehold._server.jobs.routing import KindFilter
from leasehold._server.runtime.long_poll import ClaimRequest, HeldNews, LongPollClaimer
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


def request(wait: float = 30.0, held: tuple[Lease, ...] = ()) -> ClaimRequest:
    return ClaimRequest(
        worker_id="w", kinds=KindFilter(only=frozenset({KIND})), limit=1, wait_seconds=wait, held=held
    )


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

    (claimed,) = (await asyncio.wait_for(waiting, WAIT)).jobs
    assert claimed.job.id == job_id


async def test_a_waiting_claim_ignores_kinds_it_did_not_ask_for() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)
    waiting = asyncio.ensure_future(claimer.claim(request(wait=0.3)))
    other = await enqueue(repository, "remote.other")

    assert (await asyncio.wait_for(waiting, WAIT)).jobs == []
    assert (await repository.get(OWNER, other)).status is JobStatus.QUEUED


async def test_a_waiting_claim_wakes_when_a_retry_falls_due() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)
    job_id = await enqueue(repository)
    (first,) = (await claimer.claim(request())).jobs
    await repository.fail(first.lease, "busy", retry_after_seconds=0.3)

    (again,) = (await asyncio.wait_for(claimer.claim(request()), WAIT)).jobs

    assert again.job.id == job_id and again.job.attempt == 2


async def test_an_empty_wait_ends_after_its_wait_seconds() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)

    outcome = await asyncio.wait_for(claimer.claim(request(wait=0.1)), WAIT)
    assert (outcome.jobs, outcome.held) == ([], [])


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


async def _holding(repository: MemoryJobRepository, claimer: LongPollClaimer) -> Lease:
    await enqueue(repository)
    (held,) = (await claimer.claim(request())).jobs
    return held.lease


async def test_a_cancel_of_a_held_attempt_ends_the_wait_with_the_news() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)
    lease = await _holding(repository, claimer)
    waiting = asyncio.ensure_future(claimer.claim(request(held=(lease,))))
    await until_asleep(claimer)
    assert not waiting.done()

    await repository.cancel(OWNER, lease.job_id)

    outcome = await asyncio.wait_for(waiting, WAIT)
    assert outcome.jobs == []
    assert outcome.held == [HeldNews(lease.job_id, cancel_requested=True, lost=False)]


async def test_a_held_attempt_already_cancelled_or_lost_is_news_at_once() -> None:
    clock = ManualClock()
    repository = MemoryJobRepository(clock)
    claimer = LongPollClaimer(repository, clock, lease_seconds=30, poll_seconds=POLL)
    cancelled = await _holding(repository, claimer)
    await repository.cancel(OWNER, cancelled.job_id)
    stale = Lease(job_id=cancelled.job_id, token="not-the-token", attempt=1)

    outcome = await asyncio.wait_for(claimer.claim(request(held=(cancelled, stale))), WAIT)

    assert outcome.held == [
        HeldNews(cancelled.job_id, cancel_requested=True, lost=False),
        HeldNews(cancelled.job_id, cancel_requested=False, lost=True),
    ]


async def test_a_held_attempt_without_news_does_not_end_the_wait() -> None:
    repository = MemoryJobRepository(SystemClock())
    claimer = LongPollClaimer(repository, SystemClock(), lease_seconds=30, poll_seconds=POLL)
    lease = await _holding(repository, claimer)
    waiting = asyncio.ensure_future(claimer.claim(request(held=(lease,))))
    await until_asleep(claimer)

    # Its own progress is not news; new work still ends the wait.
    await repository.append_event(lease, "progress", {"step": 1})
    await asyncio.sleep(0)
    job_id = await enqueue(repository)

    outcome = await asyncio.wait_for(waiting, WAIT)
    assert [claimed.job.id for claimed in outcome.jobs] == [job_id] and outcome.held == []
