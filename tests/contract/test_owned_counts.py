"""The per-owner limits' reads on every engine: which kinds and resource types
an owner's jobs already have, how many distinct ones (counted no further than
asked), and how many schedules, never counting another owner's."""

from __future__ import annotations

from leasehold._server.jobs.owner_limits import OwnedField
from leasehold._server.jobs.repository import JobRepository
from tests.contract.helpers import claim_one, enqueue
from tests.contract.test_schedules import schedule
from tests.support import OTHER_OWNER, OWNER

KIND, RESOURCE_TYPE = OwnedField.KIND, OwnedField.RESOURCE_TYPE


async def test_an_owner_without_jobs_has_no_values(repository: JobRepository) -> None:
    await enqueue(repository, owner_id=OTHER_OWNER, kind="a.work", resource_type="doc", resource_id="1")

    assert await repository.known_values(OWNER, KIND, ["a.work"]) == frozenset()
    assert await repository.count_distinct(OWNER, KIND, 10) == 0
    assert await repository.count_distinct(OWNER, RESOURCE_TYPE, 10) == 0
    assert await repository.count_schedules(OWNER, 10) == 0


async def test_known_values_are_those_the_owner_has(repository: JobRepository) -> None:
    await enqueue(repository, kind="a.work", resource_type="doc", resource_id="1")
    await enqueue(repository, kind="b.work")
    await enqueue(repository, owner_id=OTHER_OWNER, kind="c.work", resource_type="image", resource_id="1")

    assert await repository.known_values(OWNER, KIND, ["a.work", "b.work", "c.work", "d.work"]) == {
        "a.work",
        "b.work",
    }
    assert await repository.known_values(OWNER, RESOURCE_TYPE, ["doc", "image"]) == {"doc"}
    assert await repository.known_values(OWNER, KIND, []) == frozenset()


async def test_distinct_values_are_counted_once_each_in_every_status(repository: JobRepository) -> None:
    for kind in ("a.work", "a.work", "b.work", "c.work"):
        await enqueue(repository, kind=kind)
    await claim_one(repository)  # one of them running now: still the same kinds
    await enqueue(repository, kind="x.work", resource_type="doc", resource_id="1")
    await enqueue(repository, kind="x.work", resource_type="doc", resource_id="2")
    await enqueue(repository, kind="x.work", resource_type="sheet", resource_id="1")
    await enqueue(repository, owner_id=OTHER_OWNER, kind="z.work", resource_type="image", resource_id="1")

    assert await repository.count_distinct(OWNER, KIND, 100) == 4
    # A job without a resource has no resource type: it is not counted as one.
    assert await repository.count_distinct(OWNER, RESOURCE_TYPE, 100) == 2


async def test_the_count_stops_at_up_to(repository: JobRepository) -> None:
    for number in range(7):
        await enqueue(repository, kind=f"k{number}.work", resource_type=f"t{number}", resource_id="1")

    assert await repository.count_distinct(OWNER, KIND, 3) == 3
    assert await repository.count_distinct(OWNER, KIND, 7) == 7
    assert await repository.count_distinct(OWNER, KIND, 8) == 7
    assert await repository.count_distinct(OWNER, RESOURCE_TYPE, 5) == 5


async def test_schedules_are_counted_per_owner_up_to_the_limit(repository: JobRepository) -> None:
    for number in range(4):
        await repository.create_schedule(schedule(f"s{number}"))
    await repository.create_schedule(schedule("theirs", owner=OTHER_OWNER))

    assert await repository.count_schedules(OWNER, 10) == 4
    assert await repository.count_schedules(OWNER, 2) == 2
    assert await repository.count_schedules(OTHER_OWNER, 10) == 1
