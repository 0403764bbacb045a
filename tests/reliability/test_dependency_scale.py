"""A fan-out of 10,000 children and a fan-in of 100 parents (DESIGN §18), on
SQLite and PostgreSQL, through the repository.

Releasing children costs the completing transaction O(its children), never a
scan. These tests check that every child is released (claimable, with its
parents' results) and report how long the completing call took, the parent's
success, which is one transaction: its own UPDATE, then the children's edges
read by index and the children written and logged. The figures are printed
and kept in the reliability summary for the closing note; nothing here bounds
a wall-clock time (CI machines vary too much for that to mean anything).

For scale, each test also times the success of a job with no children, on the
same database just before.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import JobStatus, NewJob
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.contract.helpers import LEASE, claim_one, enqueue, event_types
from tests.reliability.conftest import Figures
from tests.support import OWNER, make_repository

pytestmark = pytest.mark.timeout(120)

FAN_OUT = 10_000
FAN_IN = 100
# Children enqueued per call (BatchEnqueue takes at most 1,000 items).
ENQUEUE_CHUNK = 1_000
CLAIM_CHUNK = 1_000


def new(**fields: Any) -> NewJob:
    values: dict[str, Any] = {"owner_id": OWNER, "kind": "example.echo", "payload": {}}
    values.update(fields)
    return NewJob(**values)


@pytest.fixture
async def repository(database_url: str, clock: ManualClock) -> AsyncIterator[SqlJobRepository]:
    repo = await make_repository(database_url, clock)
    try:
        yield repo
    finally:
        await repo.close()


async def lone_success_seconds(repository: SqlJobRepository) -> float:
    """How long the success of a job with no children takes here."""
    await enqueue(repository, kind="example.lone")
    claimed = await claim_one(repository)
    began = time.perf_counter()
    await repository.succeed(claimed.lease, {"lone": True})
    return time.perf_counter() - began


def engine_of(database_url: str) -> str:
    return "postgresql" if database_url.startswith("postgresql") else "sqlite"


async def test_a_parent_releases_ten_thousand_children_in_its_own_commit(
    repository: SqlJobRepository, database_url: str, figures: Figures
) -> None:
    baseline = await lone_success_seconds(repository)
    parent = await enqueue(repository, kind="example.parent")
    began = time.perf_counter()
    children: list[str] = []
    for _ in range(FAN_OUT // ENQUEUE_CHUNK):
        answers = await repository.enqueue_batch([new(depends_on=(parent,)) for _ in range(ENQUEUE_CHUNK)])
        children.extend(job.id for job, created in answers if created)
    enqueued = time.perf_counter() - began
    assert len(children) == FAN_OUT
    claimed_parent = await claim_one(repository)
    assert claimed_parent.job.id == parent
    assert (await repository.claim("w1", 10, LEASE)).jobs == []  # all still waiting

    began = time.perf_counter()
    ended = await repository.succeed(claimed_parent.lease, {"fan": "out"})
    completing = time.perf_counter() - began
    assert ended.status is JobStatus.SUCCEEDED

    claimed: list[str] = []
    while batch := (await repository.claim("w1", CLAIM_CHUNK, LEASE)).jobs:
        assert all(c.parent_results == {parent: {"fan": "out"}} for c in batch)
        claimed.extend(c.job.id for c in batch)
    assert sorted(claimed) == sorted(children)
    for child in children[:: FAN_OUT // 10]:
        assert await event_types(repository, child) == ["job.queued", "job.dependencies_met", "job.started"]

    engine = engine_of(database_url)
    print(
        f"\n{engine}: fan-out of {FAN_OUT}: the parent's success (releasing every child) "
        f"{completing * 1000:.0f} ms; a success with no children {baseline * 1000:.1f} ms; "
        f"enqueueing the children {enqueued:.1f} s"
    )
    figures(f"{engine} fan-out {FAN_OUT} success ms", completing * 1000)
    figures(f"{engine} lone success ms", baseline * 1000)


async def test_a_hundredth_parent_releases_its_child(
    repository: SqlJobRepository, database_url: str, figures: Figures
) -> None:
    baseline = await lone_success_seconds(repository)
    answers = await repository.enqueue_batch([new(kind="example.parent") for _ in range(FAN_IN)])
    parents = [job.id for job, _ in answers]
    child, _ = await repository.enqueue(new(depends_on=tuple(parents)))
    assert child.pending_dependencies == FAN_IN
    leases = {c.job.id: c.lease for c in (await repository.claim("w1", FAN_IN, LEASE)).jobs}
    assert set(leases) == set(parents)

    counting: list[float] = []
    for index, parent in enumerate(parents[:-1]):
        began = time.perf_counter()
        await repository.succeed(leases[parent], {"parent": index})
        counting.append(time.perf_counter() - began)
    assert (await repository.get(OWNER, child.id)).pending_dependencies == 1
    assert (await repository.claim("w1", 10, LEASE)).jobs == []
    began = time.perf_counter()
    await repository.succeed(leases[parents[-1]], {"parent": FAN_IN - 1})
    completing = time.perf_counter() - began

    (claimed,) = (await repository.claim("w1", 10, LEASE)).jobs
    assert claimed.job.id == child.id
    assert claimed.parent_results == {parent: {"parent": index} for index, parent in enumerate(parents)}
    assert await event_types(repository, child.id) == ["job.queued", "job.dependencies_met", "job.started"]

    engine = engine_of(database_url)
    counting.sort()
    median = counting[len(counting) // 2]
    print(
        f"\n{engine}: fan-in of {FAN_IN}: the last parent's success (releasing the child) "
        f"{completing * 1000:.1f} ms; each earlier parent's (counting one off) "
        f"median {median * 1000:.1f} ms; "
        f"a success with no children {baseline * 1000:.1f} ms"
    )
    figures(f"{engine} fan-in {FAN_IN} last success ms", completing * 1000)
    figures(f"{engine} fan-in earlier success median ms", median * 1000)
    figures(f"{engine} lone success ms", baseline * 1000)
