"""A watch ends at the drain however it is caught: waiting for the next event,
or handing the last one to its caller (the gRPC stream sending it) at the very
moment the drain begins. The second is the easy one to miss: the stream then
goes back to waiting, and its wake-up was spent before it looked."""

from __future__ import annotations

import asyncio

import pytest

from leasehold._server.jobs.errors import ServerDraining
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.watch import follow_events
from tests.contract.helpers import claim_one, enqueue
from tests.support import OWNER

SOON = 5.0


class Drain:
    def __init__(self, repository: JobRepository) -> None:
        self._repository = repository
        self.begun = False

    def begin(self) -> None:
        """What LeaseholdApp's drain does for watches: the flag, then the wake-up."""
        self.begun = True
        self._repository.changes.interrupt_watchers()


async def test_a_watch_handing_over_a_replayed_event_ends_at_the_drain(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    drain = Drain(repository)
    stream = follow_events(repository, OWNER, job_id, 0, lambda: drain.begun)
    assert (await anext(stream)).type == "job.queued"
    drain.begin()  # while the stream is suspended at its yield
    with pytest.raises(ServerDraining):
        await asyncio.wait_for(anext(stream), SOON)


async def test_a_watch_handing_over_a_live_event_ends_at_the_drain(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    drain = Drain(repository)
    stream = follow_events(repository, OWNER, job_id, 0, lambda: drain.begun)
    assert (await anext(stream)).type == "job.queued"
    claimed = await claim_one(repository)
    assert (await asyncio.wait_for(anext(stream), SOON)).type == "job.started"
    drain.begin()
    await repository.append_event(claimed.lease, "progress", {"step": 1})  # the live feed goes on
    with pytest.raises(ServerDraining):
        await asyncio.wait_for(anext(stream), SOON)


async def test_a_waiting_watch_ends_at_the_drain(repository: JobRepository) -> None:
    job_id = await enqueue(repository)
    drain = Drain(repository)
    stream = follow_events(repository, OWNER, job_id, 0, lambda: drain.begun)
    assert (await anext(stream)).type == "job.queued"
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(0)  # let it reach its wait
    assert not waiting.done()
    drain.begin()
    with pytest.raises(ServerDraining):
        await asyncio.wait_for(waiting, SOON)
