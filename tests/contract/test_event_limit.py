"""`max_events_per_job` on every engine: an append is refused once the job's log
holds that many events (its lifecycle events count, and are never refused), and
a lease that no longer holds is still LeaseLost, not told about the limit."""

from __future__ import annotations

import pytest

from leasehold._server.jobs.records import Lease
from leasehold.worker import EventLimitReached, LeaseLost
from tests.conftest import Steered
from tests.contract.helpers import claim_one, enqueue, event_types


async def test_an_append_past_the_limit_is_refused_and_the_job_can_still_end(steered: Steered) -> None:
    repository = await steered(max_events_per_job=3)
    job_id = await enqueue(repository)
    claimed = await claim_one(repository)  # job.queued, job.started: room for one more

    assert (await repository.append_event(claimed.lease, "step", {"n": 1})).sequence == 3
    with pytest.raises(EventLimitReached) as refused:
        await repository.append_event(claimed.lease, "step", {"n": 2})
    assert (refused.value.limit, refused.value.value) == ("max-events-per-job", 3)

    await repository.succeed(claimed.lease)
    assert await event_types(repository, job_id) == ["job.queued", "job.started", "step", "job.succeeded"]


async def test_a_lost_lease_at_the_limit_is_lease_lost(steered: Steered) -> None:
    repository = await steered(max_events_per_job=2)
    await enqueue(repository)
    claimed = await claim_one(repository)
    stale = Lease(claimed.lease.job_id, "not-the-token", claimed.lease.attempt)

    with pytest.raises(LeaseLost):
        await repository.append_event(stale, "step", {})
    with pytest.raises(EventLimitReached):
        await repository.append_event(claimed.lease, "step", {})


async def test_without_a_limit_appends_are_not_counted(steered: Steered) -> None:
    repository = await steered()
    await enqueue(repository)
    claimed = await claim_one(repository)
    for n in range(20):
        assert (await repository.append_event(claimed.lease, "step", {"n": n})).sequence == n + 3
