"""Graphs of jobs: a child waits for its parents, falls due in the commit of
its last parent's ending, ends with a parent that failed (or runs anyway,
under RUN), and reads its parents' results when it starts."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import dependencies, steering
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.admin import AdminFilter
from leasehold._server.jobs.errors import InvalidArgument
from leasehold._server.jobs.records import (
    ClaimedJob,
    JobFilter,
    JobStatus,
    NewJob,
    ParentFailurePolicy,
    WaitReason,
)
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.steering import Occupancy
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types
from tests.support import OWNER

OTHER_OWNER = "someone-else"


def new(**fields: object) -> NewJob:
    values: dict[str, object] = {"owner_id": OWNER, "kind": "example.echo", "payload": {}}
    values.update(fields)
    return NewJob(**values)  # type: ignore[arg-type]


async def claim_all(repository: JobRepository, limit: int = 100) -> list[ClaimedJob]:
    return (await repository.claim("w1", limit, LEASE)).jobs


async def test_a_diamond_runs_in_order_and_its_last_job_reads_both_parents_results(
    repository: JobRepository,
) -> None:
    # A -> B, A -> C, B + C -> D, as one batch listed child first.
    answers = await repository.enqueue_batch(
        [
            new(payload={"step": "d"}, depends_on_items=(2, 3)),
            new(payload={"step": "a"}),
            new(payload={"step": "b"}, depends_on_items=(1,)),
            new(payload={"step": "c"}, depends_on_items=(1,)),
        ]
    )
    d, a, b, c = (job for job, created in answers)
    assert all(created for _, created in answers)
    assert d.depends_on == (b.id, c.id) and d.pending_dependencies == 2
    assert d.status is JobStatus.QUEUED and d.on_parent_failure is ParentFailurePolicy.CANCEL
    assert a.depends_on == () and a.on_parent_failure is None

    (first,) = await claim_all(repository)
    assert first.job.id == a.id and first.parent_results == {}
    await repository.succeed(first.lease, {"a": 1})

    second = await claim_all(repository)
    assert sorted(claimed.job.id for claimed in second) == sorted([b.id, c.id])
    assert all(claimed.parent_results == {a.id: {"a": 1}} for claimed in second)
    by_id = {claimed.job.id: claimed for claimed in second}
    await repository.succeed(by_id[b.id].lease, {"b": 2})
    assert (await repository.get(OWNER, d.id)).pending_dependencies == 1
    assert await claim_all(repository) == []
    await repository.succeed(by_id[c.id].lease, {"c": 3})

    (last,) = await claim_all(repository)
    assert last.job.id == d.id
    assert last.parent_results == {b.id: {"b": 2}, c.id: {"c": 3}}
    assert await event_types(repository, d.id) == ["job.queued", "job.dependencies_met", "job.started"]


async def test_a_waiting_job_is_queued_for_dependencies_and_never_claimed(
    repository: JobRepository, clock: ManualClock
) -> None:
    parent = await enqueue(repository)
    child, _ = await repository.enqueue(new(depends_on=(parent,)))
    running = await claim_one(repository)
    assert running.job.id == parent

    clock.advance(10)
    result = await repository.claim("w1", 10, LEASE)
    assert result.jobs == []
    # What is foreseen is the parent's lease expiring, not the waiting job.
    assert result.next_wakeup_at == running.lease_expires_at
    job = await repository.get(OWNER, child.id)
    assert job.status is JobStatus.QUEUED and job.pending_dependencies == 1
    assert job.available_at == sm.AWAITING_PARENTS
    occupancy = Occupancy(kind_running=0, owner_running=0, rate_tokens=None)
    reason = steering.wait_reason(repository.steering, job, clock.now(), occupancy, True)
    assert reason is WaitReason.DEPENDENCIES


async def test_a_child_falls_due_at_its_run_at_once_released(
    repository: JobRepository, clock: ManualClock
) -> None:
    parent = await enqueue(repository)
    run_at = clock.now() + timedelta(minutes=5)
    child, _ = await repository.enqueue(new(depends_on=(parent,), run_at=run_at))
    await repository.succeed((await claim_one(repository)).lease)

    assert (await repository.get(OWNER, child.id)).available_at == run_at
    assert await claim_all(repository) == []
    clock.advance(301)
    assert [claimed.job.id for claimed in await claim_all(repository)] == [child.id]


async def test_a_failed_parent_cancels_its_descendants_naming_it(repository: JobRepository) -> None:
    answers = await repository.enqueue_batch(
        [
            new(max_attempts=1),
            new(depends_on_items=(0,)),
            new(depends_on_items=(1,)),
            new(depends_on_items=(1,), on_parent_failure=ParentFailurePolicy.RUN),
        ]
    )
    parent, child, grandchild, runner = (job for job, _ in answers)
    claimed = await claim_one(repository)
    await repository.fail(claimed.lease, "boom", error_type="ValueError")

    for job_id, named in ((child.id, parent.id), (grandchild.id, child.id)):
        job = await repository.get(OWNER, job_id)
        assert job.status is JobStatus.CANCELLED
        assert job.error_type == dependencies.DEPENDENCY_FAILED_ERROR_TYPE
        assert named in (job.error_message or "")
        events = await repository.list_events(OWNER, job_id, 0, 100)
        assert [event.type for event in events] == ["job.queued", "job.dependency_failed", "job.cancelled"]
        assert events[1].payload == {"parent_job_id": named}
    # A RUN child runs whatever its parent's outcome, even a cancellation by cascade.
    (claimed_runner,) = await claim_all(repository)
    assert claimed_runner.job.id == runner.id and claimed_runner.parent_results == {}


async def test_a_run_child_runs_after_a_failed_parent(repository: JobRepository) -> None:
    failing = await enqueue(repository, max_attempts=1)
    fine = await enqueue(repository)
    child, _ = await repository.enqueue(
        new(depends_on=(failing, fine), on_parent_failure=ParentFailurePolicy.RUN)
    )
    for claimed in await claim_all(repository):
        if claimed.job.id == failing:
            await repository.fail(claimed.lease, "boom")
        else:
            await repository.succeed(claimed.lease, {"ok": True})

    (claimed_child,) = await claim_all(repository)
    assert claimed_child.job.id == child.id
    assert claimed_child.parent_results == {fine: {"ok": True}}


async def test_a_cancelled_queued_parent_cascades(repository: JobRepository) -> None:
    parent = await enqueue(repository)
    child, _ = await repository.enqueue(new(depends_on=(parent,)))
    await repository.cancel(OWNER, parent)
    assert (await repository.get(OWNER, child.id)).status is JobStatus.CANCELLED


async def test_bulk_cancel_of_a_parent_cascades_as_a_failure(repository: JobRepository) -> None:
    parent = await enqueue(repository, kind="example.parent")
    child, _ = await repository.enqueue(new(depends_on=(parent,)))
    await repository.bulk_cancel(AdminFilter(JobFilter(kind="example.parent")), None, 100, 30.0, False)
    job = await repository.get(OWNER, child.id)
    assert job.status is JobStatus.CANCELLED and job.error_type == "DependencyFailed"


async def test_a_parent_that_already_ended_is_counted_at_enqueue(repository: JobRepository) -> None:
    done = await enqueue(repository)
    await repository.succeed((await claim_one(repository)).lease, {"v": 1})
    failed = await enqueue(repository, max_attempts=1)
    await repository.fail((await claim_one(repository)).lease, "boom")

    ready, _ = await repository.enqueue(new(depends_on=(done,)))
    assert ready.pending_dependencies == 0 and ready.status is JobStatus.QUEUED
    assert await event_types(repository, ready.id) == ["job.queued", "job.dependencies_met"]
    doomed, created = await repository.enqueue(new(depends_on=(done, failed)))
    assert created and doomed.status is JobStatus.CANCELLED and failed in (doomed.error_message or "")
    (claimed,) = await claim_all(repository)
    assert claimed.job.id == ready.id and claimed.parent_results == {done: {"v": 1}}


@pytest.mark.parametrize("batch", [False, True])
async def test_an_unknown_parent_and_another_owners_read_the_same(
    repository: JobRepository, batch: bool
) -> None:
    foreign = await enqueue(repository, owner_id=OTHER_OWNER)
    messages = []
    for parent in (foreign, "j_unknown00000000000000000000"):
        with pytest.raises(InvalidArgument) as caught:
            if batch:
                await repository.enqueue_batch([new(), new(depends_on=(parent,))])
            else:
                await repository.enqueue(new(depends_on=(parent,)))
        messages.append((caught.value.field, str(caught.value).replace(parent, "<id>")))
    assert messages[0] == messages[1]
    assert messages[0][0] == ("requests[1].depends_on[0]" if batch else "depends_on[0]")
    # Nothing was written, not even the batch's valid item.
    assert (await repository.list_jobs(OWNER, JobFilter(), 10, None)).jobs == []
    assert (await repository.list_jobs(OTHER_OWNER, JobFilter(), 10, None)).jobs[0].id == foreign


async def test_a_cycle_in_a_batch_is_refused(repository: JobRepository) -> None:
    with pytest.raises(InvalidArgument) as caught:
        await repository.enqueue_batch([new(depends_on_items=(1,)), new(depends_on_items=(0,))])
    assert caught.value.field == "requests[0].depends_on_refs"
    assert (await repository.list_jobs(OWNER, JobFilter(), 10, None)).jobs == []


async def test_a_deduplicated_child_keeps_its_parents(repository: JobRepository) -> None:
    first_parent = await enqueue(repository)
    second_parent = await enqueue(repository)
    child, created = await repository.enqueue(
        new(resource_type="doc", resource_id="1", depends_on=(first_parent,))
    )
    again, created_again = await repository.enqueue(
        new(resource_type="doc", resource_id="1", depends_on=(second_parent,))
    )
    assert created and not created_again
    assert again.id == child.id and again.depends_on == (first_parent,)


async def test_retry_of_a_cancelled_child_copies_its_parents(repository: JobRepository) -> None:
    parent = await enqueue(repository, max_attempts=1)
    child, _ = await repository.enqueue(new(depends_on=(parent,)))
    await repository.fail((await claim_one(repository)).lease, "boom")
    # The parent is still failed: the retry ends at once, as its source did.
    retried = await repository.retry(OWNER, child.id)
    assert retried.depends_on == (parent,) and retried.status is JobStatus.CANCELLED
    # Once the parent is retried and succeeds... the new parent is a new job:
    # a retry of the child waits on the original parent, which stays failed.
    waiting_parent = await enqueue(repository)
    second, _ = await repository.enqueue(new(depends_on=(waiting_parent,)))
    await repository.cancel(OWNER, second.id)
    retried_waiting = await repository.retry(OWNER, second.id)
    assert retried_waiting.status is JobStatus.QUEUED and retried_waiting.pending_dependencies == 1
    await repository.succeed((await claim_one(repository)).lease)
    (claimed,) = await claim_all(repository)
    assert claimed.job.id == retried_waiting.id


async def test_children_are_listed_by_their_parent(repository: JobRepository) -> None:
    parent = await enqueue(repository)
    await enqueue(repository)
    children = [(await repository.enqueue(new(depends_on=(parent,))))[0].id for _ in range(3)]
    page = await repository.list_jobs(OWNER, JobFilter(depends_on=parent), 10, None)
    assert [job.id for job in page.jobs] == children[::-1]
    assert (await repository.list_jobs(OTHER_OWNER, JobFilter(depends_on=parent), 10, None)).jobs == []


async def test_retention_keeps_a_parent_while_a_child_is_still_to_run(
    repository: JobRepository, clock: ManualClock
) -> None:
    parent = await enqueue(repository)
    other = await enqueue(repository, kind="example.other")
    child, _ = await repository.enqueue(new(depends_on=(parent, other)))
    first = await claim_one(repository)
    assert first.job.id == parent
    await repository.succeed(first.lease, {"kept": True})
    clock.advance(3600)

    assert await repository.delete_expired(clock.now(), 100) == 0
    second = await claim_one(repository)
    assert second.job.id == other
    await repository.succeed(second.lease)
    (child_claim,) = await claim_all(repository)
    assert child_claim.parent_results == {parent: {"kept": True}}
    await repository.succeed(child_claim.lease)
    clock.advance(3600)
    assert await repository.delete_expired(clock.now(), 100) == 3


async def test_parent_results_are_bounded(repository: JobRepository) -> None:
    big = "x" * (200 * 1024)
    parents = [await enqueue(repository) for _ in range(25)]
    for claimed in await claim_all(repository):
        await repository.succeed(claimed.lease, {"blob": big})
    await repository.enqueue(new(depends_on=tuple(parents)))
    (child,) = await claim_all(repository)
    kept = list(child.parent_results)
    assert kept == parents[: len(kept)] and 0 < len(kept) < len(parents)
    total = sum(len(big) + 12 for _ in kept)
    assert total <= dependencies.PARENT_RESULTS_LIMIT_BYTES


async def test_a_fan_in_of_100_parents_releases_once(repository: JobRepository) -> None:
    parents = [job.id for job, _ in await repository.enqueue_batch([new() for _ in range(100)])]
    child, _ = await repository.enqueue(new(depends_on=tuple(parents)))
    assert child.pending_dependencies == 100
    claimed = await claim_all(repository, limit=100)
    for claim in claimed[:99]:
        await repository.succeed_status(claim.lease)
    assert (await repository.get(OWNER, child.id)).pending_dependencies == 1
    await repository.succeed(claimed[99].lease)
    (last,) = await claim_all(repository)
    assert last.job.id == child.id
    assert await event_types(repository, child.id) == ["job.queued", "job.dependencies_met", "job.started"]


async def test_a_fan_out_is_released_by_its_parent_in_one_write(repository: JobRepository) -> None:
    parent = await enqueue(repository)
    for _ in range(2):
        await repository.enqueue_batch([new(depends_on=(parent,)) for _ in range(500)])
    await repository.succeed((await claim_one(repository)).lease)
    claimed = await claim_all(repository, limit=1000)
    assert len(claimed) == 1000


async def test_a_refused_parent_fails_only_its_own_call(repository: JobRepository) -> None:
    """Plain enqueues made at once may share one write; one naming a parent
    it may not does not take the others down with it."""
    calls = [repository.enqueue(new()) for _ in range(5)]
    calls.insert(2, repository.enqueue(new(depends_on=("j_unknown00000000000000000000",))))
    outcomes = await asyncio.gather(*calls, return_exceptions=True)
    assert [isinstance(outcome, InvalidArgument) for outcome in outcomes] == [
        False,
        False,
        True,
        False,
        False,
        False,
    ]
    assert len((await repository.list_jobs(OWNER, JobFilter(), 10, None)).jobs) == 5


async def test_a_parent_of_another_owner_is_refused_even_among_gathered_writes(
    repository: JobRepository,
) -> None:
    """Plain enqueues of several owners made at once may share one write; a
    job naming another owner's job as its parent is refused all the same, and
    so learns nothing of it (the engines that gather writes accepted it once,
    and handed the other owner's result to the child)."""
    foreign = await enqueue(repository, owner_id=OTHER_OWNER)
    for _ in range(3):
        outcomes = await asyncio.gather(
            repository.enqueue(new(owner_id=OTHER_OWNER)),
            repository.enqueue(new(depends_on=(foreign,))),
            return_exceptions=True,
        )
        assert isinstance(outcomes[1], InvalidArgument), outcomes[1]
        assert not isinstance(outcomes[0], Exception)
    assert (await repository.list_jobs(OWNER, JobFilter(), 10, None)).jobs == []
    assert (await repository.list_jobs(OTHER_OWNER, JobFilter(depends_on=foreign), 10, None)).jobs == []


@pytest.mark.parametrize("shape", ["two refs, one key", "an id and a ref, one key"])
async def test_one_job_named_twice_as_a_parent_is_waited_for_once(
    repository: JobRepository, shape: str
) -> None:
    """Two names can turn out to be one job once resource keys deduplicate
    (the caller cannot know): the child waits for it once, not forever."""
    if shape == "two refs, one key":
        answers = await repository.enqueue_batch(
            [
                new(resource_type="doc", resource_id="1"),
                new(resource_type="doc", resource_id="1"),
                new(depends_on_items=(0, 1)),
            ]
        )
    else:
        existing = await enqueue(repository, resource_type="doc", resource_id="1")
        answers = await repository.enqueue_batch(
            [new(resource_type="doc", resource_id="1"), new(depends_on=(existing,), depends_on_items=(0,))]
        )
    parent, child = answers[0][0], answers[-1][0]
    assert child.depends_on == (parent.id,) and child.pending_dependencies == 1
    await repository.succeed((await claim_one(repository)).lease)
    assert [claimed.job.id for claimed in await claim_all(repository)] == [child.id]
