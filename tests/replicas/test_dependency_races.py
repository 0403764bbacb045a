"""A parent's ending racing its child's Enqueue on another replica (DESIGN
§18): two `SqlJobRepository` instances on one PostgreSQL database are two
replicas, each with its own writer thread and connection.

The guarantee (server/jobs/operations/graphs.py): a child's Enqueue locks each
parent row (`Rows.lock_parents`: UPDATE ... SET has_dependents = true RETURNING
status) before it reads the parent's status, and a parent's ending locks the
same row (its transition's UPDATE), then reads its children's edges (SELECT ...
FOR UPDATE OF jobs). Whichever commits first, the other sees it, so no child
is ever left waiting on a parent that has already ended.

The interleavings are made, not hoped for. A test-only hook (`Hold`) stops one
replica's writer thread inside its open transaction, just after a chosen
statement, holding the row locks that statement took; the test then starts the
other replica's call and waits until PostgreSQL reports that call's session
blocked behind the held one (`pg_blocking_pids`), and only then lets the first
go on. Each test checks the outcome first (after a success, the child
released: claimable, `pending_dependencies == 0`, `job.dependencies_met` in
its log; after a failure, the child cancelled naming its parent), then that
the interleaving was the one intended.

Mutants checked by hand (each a temporary edit of server/, reverted). M1, M2
and M4 pass the whole contract suite (tests/contract) and are caught only here:

- M1, the status read outside the lock: `SqlRows.lock_parents` reads the
  parents' statuses with a plain SELECT, then marks them with the UPDATE,
  ignoring what it returns -> `test_a_childs_enqueue_blocked_behind_its_parents_ending`
  fails (all four variants): the child is written waiting on a parent that
  was ending, and nothing releases (or cancels) it.
- M2, no lock on the children: `WAITING_CHILDREN` without `FOR UPDATE OF jobs`
  -> `test_two_parents_ending_on_two_replicas_release_their_child_once` fails:
  both endings count from the same `pending_dependencies`, one decrement is
  lost, and the child waits forever.
- M4, the ending reads its children before locking its own row:
  `SqlRows.transition_leases` runs `waiting_children` for its leases' jobs
  before its UPDATE, and the settling uses that early read ->
  `test_a_parents_ending_blocked_behind_its_childs_enqueue` fails (both
  variants): the read came before B's commit, so it missed B's edge.
- M3, the parents locked but never marked: `LOCK_PARENTS` without
  `has_dependents = true` -> the (b) test, the with-a-sibling (a) variants,
  the fan-in and the stress fail (as do 16 contract tests).

The stress test on PostgreSQL caught M1 in some runs and M4 in the run made,
by luck of the timing; the deterministic tests catch them every time.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs import state_machine as sm
from leasehold._server.jobs.records import ClaimedJob, Job, JobStatus, Lease, NewJob
from leasehold._server.jobs.repository import JobRepository
from tests.conftest import Postgres
from tests.contract.helpers import LEASE, event_types
from tests.replicas.holds import Hold, Replicas, blocked_behind
from tests.support import OWNER, fresh_database_url, make_repository

pytestmark = pytest.mark.timeout(60)

STRESS_PAIRS = 200
STRESS_SEED = 33
STRESS_SPREAD_SECONDS = 0.2


def new(**fields: Any) -> NewJob:
    values: dict[str, Any] = {"owner_id": OWNER, "kind": "example.echo", "payload": {}}
    values.update(fields)
    return NewJob(**values)


async def running_parent(repository: JobRepository) -> ClaimedJob:
    """A new job, claimed by `repository`."""
    parent, _ = await repository.enqueue(new(kind="example.parent"))
    (claimed,) = (await repository.claim("parent-worker", 1, LEASE)).jobs
    assert claimed.job.id == parent.id
    return claimed


@dataclass(frozen=True)
class Ending:
    """How the parent ends, and what that makes of a waiting child."""

    transition: sm.Transition
    end: Callable[[JobRepository, Lease], Awaitable[Job]]
    status: JobStatus

    def held(self, job_id: str) -> Callable[..., bool]:
        """Matches this ending's transition of `job_id` (`SqlRows.transition_leases`)."""

        def matches(transition: sm.Transition, leases: Sequence[Lease], *_: Any) -> bool:
            return transition is self.transition and any(lease.job_id == job_id for lease in leases)

        return matches


ENDINGS = {
    "success": Ending(
        sm.SUCCEED,
        lambda repository, lease: repository.succeed(lease, {"parent": "done"}),
        JobStatus.SUCCEEDED,
    ),
    "failure": Ending(
        sm.FAIL, lambda repository, lease: repository.fail(lease, "boom", retryable=False), JobStatus.FAILED
    ),
}


async def assert_settled(
    repository: JobRepository, ending: Ending, child_ids: Sequence[str], parent: str
) -> None:
    """Every child settled as its parent's ending says. After a success: due,
    queued with nothing pending, `job.dependencies_met` once in its log, and
    claimed by the next claim with its parent's result. After a failure:
    cancelled naming the parent (and so never claimed)."""
    for child_id in child_ids:
        job = await repository.get(OWNER, child_id)
        assert job.pending_dependencies == 0, (child_id, job)
        if ending.status is JobStatus.SUCCEEDED:
            assert job.status is JobStatus.QUEUED and job.available_at != sm.AWAITING_PARENTS, job
            assert await event_types(repository, child_id) == ["job.queued", "job.dependencies_met"]
        else:
            assert job.status is JobStatus.CANCELLED and job.error_type == sm.DEPENDENCY_FAILED_ERROR_TYPE, (
                job
            )
            assert parent in (job.error_message or ""), job
            events = await repository.list_events(OWNER, child_id, 0, 100)
            assert [e.type for e in events] == ["job.queued", "job.dependency_failed", "job.cancelled"]
            assert events[1].payload == {"parent_job_id": parent}
    claimed = (await repository.claim("child-worker", len(child_ids) + 1, LEASE)).jobs
    if ending.status is JobStatus.SUCCEEDED:
        assert sorted(c.job.id for c in claimed) == sorted(child_ids)
        assert all(c.parent_results == {parent: {"parent": "done"}} for c in claimed)
    else:
        assert claimed == []


def names(job_id: str) -> Callable[..., bool]:
    return lambda _owner, job_ids: job_id in job_ids


def settles(job_id: str) -> Callable[..., bool]:
    return lambda parent_ids: job_id in parent_ids


# ----- the race, both ways round ----------------------------------------------------------


@pytest.mark.parametrize("sibling", [False, True], ids=["first-child", "with-a-waiting-sibling"])
@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
async def test_a_childs_enqueue_blocked_behind_its_parents_ending(
    replicas: Replicas,
    postgres: Postgres,
    hold_after: Callable[[str, Callable[..., bool]], Hold],
    ending: Ending,
    sibling: bool,
) -> None:
    """(a) A has updated the parent's row to succeeded (or failed), not yet
    committed, when B's Enqueue of a child arrives: B's lock_parents waits for
    A's commit, then reads the final status, so the child is written settled
    at its enqueue (due; or cancelled naming the parent). With a waiting
    sibling (enqueued earlier) A's own commit settles the sibling.

    Mutant M1 (the parents' statuses read by a plain SELECT before the lock)
    fails this: B reads `running` without waiting, A commits finding no edge
    of B's child, and B writes the child waiting for a parent that has ended."""
    parent = await running_parent(replicas.a)
    siblings = [(await replicas.b.enqueue(new(depends_on=(parent.job.id,))))[0].id] if sibling else []
    hold = hold_after("transition_leases", ending.held(parent.job.id))

    ended = asyncio.ensure_future(ending.end(replicas.a, parent.lease))
    await hold.wait_reached()
    enqueue = asyncio.ensure_future(replicas.b.enqueue(new(depends_on=(parent.job.id,))))
    blocked = await blocked_behind(postgres, hold.backend_pid, enqueue)
    assert not enqueue.done()
    hold.release()
    assert (await ended).status is ending.status
    child, created = await enqueue

    assert created
    await assert_settled(replicas.b, ending, [child.id, *siblings], parent.job.id)
    # The interleaving intended: B waited for A, then saw the parent ended.
    assert blocked
    assert child.pending_dependencies == 0


@pytest.mark.parametrize("ending", ENDINGS.values(), ids=ENDINGS.keys())
async def test_a_parents_ending_blocked_behind_its_childs_enqueue(
    replicas: Replicas,
    postgres: Postgres,
    hold_after: Callable[[str, Callable[..., bool]], Hold],
    ending: Ending,
) -> None:
    """(b) B's Enqueue has locked the parent's row (and marked it as waited on)
    and not yet committed when A's success (or failure) of the parent arrives:
    A's UPDATE waits for B's commit, then finds `has_dependents` set and reads
    B's edge, so A's own commit settles the child (due; or cancelled).

    Mutant M4 (the ending reads its children before its own UPDATE) fails
    this: A's early read came before B's commit and misses B's edge."""
    parent = await running_parent(replicas.a)
    hold = hold_after("lock_parents", names(parent.job.id))

    enqueue = asyncio.ensure_future(replicas.b.enqueue(new(depends_on=(parent.job.id,))))
    await hold.wait_reached()
    ended = asyncio.ensure_future(ending.end(replicas.a, parent.lease))
    blocked = await blocked_behind(postgres, hold.backend_pid, ended)
    assert not ended.done()
    hold.release()
    child, created = await enqueue
    assert (await ended).status is ending.status

    assert created
    await assert_settled(replicas.b, ending, [child.id], parent.job.id)
    # The interleaving intended: the child was written waiting (the parent was
    # running when B locked it), and A's ending waited for B and released it.
    assert blocked
    assert child.pending_dependencies == 1


async def test_two_parents_ending_on_two_replicas_release_their_child_once(
    replicas: Replicas, postgres: Postgres, hold_after: Callable[[str, Callable[..., bool]], Hold]
) -> None:
    """A fan-in across replicas: the child's two parents succeed on A and on B
    at once. A has read (and locked) the child with 2 pending when B's ending
    reaches it: B's read waits for A's commit and counts from 1, so the child
    is released once, by B.

    Mutant M2 (WAITING_CHILDREN without FOR UPDATE) fails this: B reads 2
    without waiting, both write 1, and the child waits forever."""
    await replicas.a.enqueue_batch([new(kind="example.parent"), new(kind="example.parent")])
    (first,) = (await replicas.a.claim("parent-worker", 1, LEASE)).jobs
    (second,) = (await replicas.b.claim("parent-worker", 1, LEASE)).jobs
    child, _ = await replicas.a.enqueue(new(depends_on=(first.job.id, second.job.id)))
    assert child.pending_dependencies == 2
    hold = hold_after("waiting_children", settles(first.job.id))

    on_a = asyncio.ensure_future(replicas.a.succeed(first.lease, {"parent": "first"}))
    await hold.wait_reached()
    on_b = asyncio.ensure_future(replicas.b.succeed(second.lease, {"parent": "second"}))
    blocked = await blocked_behind(postgres, hold.backend_pid, on_b)
    hold.release()
    await asyncio.gather(on_a, on_b)

    job = await replicas.a.get(OWNER, child.id)
    assert (job.status, job.pending_dependencies) == (JobStatus.QUEUED, 0), job
    assert await event_types(replicas.a, child.id) == ["job.queued", "job.dependencies_met"]
    (claimed,) = (await replicas.a.claim("child-worker", 10, LEASE)).jobs
    assert claimed.job.id == child.id
    assert claimed.parent_results == {first.job.id: {"parent": "first"}, second.job.id: {"parent": "second"}}
    assert blocked


# ----- many races at once -------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["postgresql", "sqlite"])
async def test_many_children_enqueued_on_one_replica_while_the_other_ends_their_parents(
    engine: str, request: pytest.FixtureRequest, tmp_path: Path, clock: ManualClock
) -> None:
    """STRESS_PAIRS parents running on A; each one's child is enqueued on B
    while A succeeds the parent, each pair started at a seeded random moment
    within STRESS_SPREAD_SECONDS (alternating which call starts first), so
    both replicas' group commits cross many times. No child is left waiting,
    whichever way each race went; the split between children released at
    their Enqueue and children released by their parent's ending is printed.
    (On SQLite the two replicas' writes are serialized by the database lock:
    the same check, as two processes on one file.)"""
    url = fresh_database_url(engine, request, tmp_path)
    a = await make_repository(url, clock)
    b = await make_repository(url, clock)
    try:
        await a.enqueue_batch([new(kind="example.parent") for _ in range(STRESS_PAIRS)])
        leases: list[ClaimedJob] = []
        while len(leases) < STRESS_PAIRS:
            batch = (await a.claim("parent-worker", 100, LEASE)).jobs
            assert batch
            leases.extend(batch)

        rng = random.Random(STRESS_SEED)

        async def race(index: int, claimed: ClaimedJob) -> Job:
            # A seeded spread of start times, so the pairs' calls fall into
            # many different group commits on both replicas.
            await asyncio.sleep(rng.random() * STRESS_SPREAD_SECONDS)
            enqueue = b.enqueue(new(depends_on=(claimed.job.id,)))
            success = a.succeed(claimed.lease, {"parent": "done"})
            if index % 2:
                (child, _), _ = await asyncio.gather(enqueue, success)
            else:
                _, (child, _) = await asyncio.gather(success, enqueue)
            return child

        children = await asyncio.gather(*(race(index, claimed) for index, claimed in enumerate(leases)))

        assert len(children) == STRESS_PAIRS
        at_enqueue = sum(1 for child in children if child.pending_dependencies == 0)
        by_ending = STRESS_PAIRS - at_enqueue
        print(
            f"\n{engine}: {at_enqueue} children released at their Enqueue, "
            f"{by_ending} by their parent's ending"
        )
        still_waiting = []
        for child in children:
            job = await b.get(OWNER, child.id)
            if (job.status, job.pending_dependencies) != (JobStatus.QUEUED, 0):
                still_waiting.append((child.id, job.status, job.pending_dependencies))
        assert still_waiting == []
        claimed_children: list[str] = []
        while True:
            batch = (await b.claim("child-worker", 100, LEASE)).jobs
            if not batch:
                break
            claimed_children.extend(c.job.id for c in batch)
        assert sorted(claimed_children) == sorted(child.id for child in children)
        for child in children[:: STRESS_PAIRS // 20]:
            assert await event_types(b, child.id) == ["job.queued", "job.dependencies_met", "job.started"]
    finally:
        await a.close()
        await b.close()
