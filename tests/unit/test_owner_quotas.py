"""The per-owner limits' domain rules (`owner_limits`), on the in-memory
engine: calls of one owner adding new kinds at once cannot together pass the
limit in one process, 0 switches a limit off, and a request adding nothing
new takes no lock and no count, and one whose values this process has seen
takes no read at all."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import LimitExceeded
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.owner_limits import OwnedField, OwnerLimits, OwnerQuotas, Wanted
from leasehold._server.jobs.records import NewJob
from tests.support import OWNER


class Counting(MemoryJobRepository):
    """Counts the distinct-value counts and the known-value probes it is asked for."""

    counted = 0
    probed = 0

    async def known_values(self, owner_id: str, owned: OwnedField, among: Sequence[str]) -> frozenset[str]:
        self.probed += 1
        return await super().known_values(owner_id, owned, among)

    async def count_distinct(self, owner_id: str, owned: OwnedField, up_to: int) -> int:
        self.counted += 1
        return await super().count_distinct(owner_id, owned, up_to)


def _job(kind: str) -> NewJob:
    return NewJob(owner_id=OWNER, kind=kind, payload={})


async def _enqueue(quotas: OwnerQuotas, repository: MemoryJobRepository, *kinds: str) -> None:
    jobs = [_job(kind) for kind in kinds]
    async with quotas.admitting(Wanted.jobs(jobs, batch=True)):
        await asyncio.sleep(0)  # let the others run their checks meanwhile
        await repository.enqueue_batch(jobs)


async def test_concurrent_calls_of_one_owner_do_not_pass_the_limit_together() -> None:
    repository = MemoryJobRepository(ManualClock())
    quotas = OwnerQuotas(repository, OwnerLimits(max_kinds=5))

    outcomes = await asyncio.gather(
        *(_enqueue(quotas, repository, f"k{n}.a", f"k{n}.b") for n in range(6)), return_exceptions=True
    )

    assert sum(isinstance(outcome, LimitExceeded) for outcome in outcomes) == 4
    assert await repository.count_distinct(OWNER, OwnedField.KIND, 100) == 4


async def test_zero_switches_a_limit_off() -> None:
    repository = Counting(ManualClock())
    quotas = OwnerQuotas(repository, OwnerLimits(max_kinds=0))

    await _enqueue(quotas, repository, *(f"k{n}" for n in range(50)))

    assert repository.counted == 0


async def test_known_kinds_cost_no_count() -> None:
    repository = Counting(ManualClock())
    quotas = OwnerQuotas(repository, OwnerLimits(max_kinds=2))
    await _enqueue(quotas, repository, "a", "b")
    counted = repository.counted

    await _enqueue(quotas, repository, "a", "b", "a")

    assert repository.counted == counted


async def test_values_this_process_has_seen_cost_no_read() -> None:
    repository = Counting(ManualClock())
    quotas = OwnerQuotas(repository, OwnerLimits(max_kinds=2))
    await _enqueue(quotas, repository, "a")
    other = OwnerQuotas(repository, OwnerLimits(max_kinds=2))  # another replica: it has seen nothing
    probed = repository.probed

    await _enqueue(quotas, repository, "a", "a")
    assert repository.probed == probed
    await _enqueue(other, repository, "a")
    assert repository.probed == probed + 1
    await _enqueue(other, repository, "a")
    assert repository.probed == probed + 1


def test_a_negative_limit_is_refused_naming_its_setting() -> None:
    with pytest.raises(ValueError, match="max_schedules_per_owner"):
        OwnerLimits(max_schedules=-1)
