"""The replica's roster of remote workers (ListWorkers), on a manual clock and
the in-memory engine: a Claim puts its worker on the roster with its kinds, a
waiting Claim shows as claiming, a worker not seen for a lease is forgotten
unless it holds leases, the roster stays bounded, and what the database says
about leases is merged in by worker id."""

from __future__ import annotations

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.memory import MemoryJobRepository
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.routing import KindFilter, KindPatterns
from leasehold._server.remote.roster import RemoteWorker, WorkerRoster

LEASE = 30.0
REMOTE = KindPatterns.parse(["media.*"])


async def test_a_claim_puts_its_worker_on_the_roster_until_a_lease_passes() -> None:
    clock = ManualClock()
    repository = MemoryJobRepository(clock)
    roster = WorkerRoster(clock, LEASE)
    asked_at = clock.now()
    with roster.claiming("w-1", ["media.b", "media.a", "media.a"]):
        waiting = await roster.workers(repository, REMOTE)
    assert waiting.workers == [RemoteWorker("w-1", ("media.a", "media.b"), 0, asked_at, claiming=True)]

    clock.advance(LEASE)
    idle = await roster.workers(repository, REMOTE)
    assert idle.workers == [RemoteWorker("w-1", ("media.a", "media.b"), 0, asked_at, claiming=False)]
    clock.advance(1)
    assert (await roster.workers(repository, REMOTE)).workers == []


async def test_a_claim_that_waits_longer_than_a_lease_is_not_forgotten() -> None:
    clock = ManualClock()
    roster = WorkerRoster(clock, LEASE)
    with roster.claiming("w-1", ["media.a"]):
        clock.advance(3 * LEASE)
        assert roster.worker_ids() == ["w-1"]
    assert roster.worker_ids() == ["w-1"]  # seen again as its Claim ended


async def test_leases_held_are_merged_in_and_name_a_worker_claiming_elsewhere() -> None:
    clock = ManualClock()
    repository = MemoryJobRepository(clock)
    roster = WorkerRoster(clock, LEASE)
    for kind in ("media.a", "media.a", "media.z", "local.kind"):
        await repository.enqueue(NewJob(owner_id="alice", kind=kind, payload={}))
    await repository.claim("w-1", 2, LEASE, KindFilter(only=frozenset({"media.a"})))
    await repository.claim("w-elsewhere", 1, LEASE, KindFilter(only=frozenset({"media.z"})))
    await repository.claim("runtime", 1, LEASE, KindFilter(excluding=REMOTE))
    claimed_at = clock.now()
    clock.advance(5)
    with roster.claiming("w-1", ["media.a", "media.b"]):
        pass

    found = await roster.workers(repository, REMOTE)

    assert found.workers == [
        RemoteWorker("w-1", ("media.a", "media.b"), 2, claimed_at, claiming=False),
        RemoteWorker("w-elsewhere", ("media.z",), 1, claimed_at, claiming=False),
    ]
    assert not found.truncated


async def test_the_roster_and_the_answer_are_bounded() -> None:
    clock = ManualClock()
    repository = MemoryJobRepository(clock)
    roster = WorkerRoster(clock, LEASE, limit=3)
    for index in range(5):
        with roster.claiming(f"w-{index}", ["media.a"]):
            clock.advance(1)
    assert roster.worker_ids() == ["w-2", "w-3", "w-4"]  # the ones seen longest ago made room

    for worker in ("w-0", "w-1"):
        await repository.enqueue(NewJob(owner_id="alice", kind="media.a", payload={}))
        await repository.claim(worker, 1, LEASE, KindFilter(only=frozenset({"media.a"})))
    found = await roster.workers(repository, REMOTE)
    assert [worker.worker_id for worker in found.workers] == ["w-0", "w-1", "w-2"]
    assert found.truncated
