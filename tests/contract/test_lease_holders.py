"""ListWorkers's storage on every engine: which remote workers hold live leases
of running jobs (of any owner), how many, of which kinds, and their latest
lease expiry. The in-process runtime's leases never count; expired leases and
finished jobs do not either."""

from __future__ import annotations

from datetime import timedelta

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.admin import LeaseHolder
from leasehold._server.jobs.records import ClaimedJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import NO_PATTERNS, KindFilter, KindPatterns
from tests.contract.helpers import LEASE, enqueue

REMOTE = KindPatterns.parse(["media.*", "pdf.render"])


async def _claim(repository: JobRepository, worker: str, kind: str, count: int = 1) -> list[ClaimedJob]:
    claimed = await repository.claim(worker, count, LEASE, KindFilter(only=frozenset({kind})))
    assert len(claimed.jobs) == count
    return claimed.jobs


async def test_remote_workers_are_counted_by_their_live_leases(
    repository: JobRepository, clock: ManualClock
) -> None:
    for kind, owner in (
        ("pdf.render", "alice"),
        ("media.cut", "alice"),
        ("media.cut", "bob"),
        ("pdf.render", "carol"),
        ("media.mix", "alice"),
        ("example.echo", "alice"),
        ("example.echo", "bob"),
    ):
        await enqueue(repository, kind=kind, owner_id=owner)
    await _claim(repository, "w-b", "pdf.render")
    clock.advance(LEASE / 2)
    claimed_at = clock.now()
    held_by_a = await _claim(repository, "w-a", "media.cut", 2)  # two owners' jobs
    held_by_a += await _claim(repository, "w-a", "pdf.render")
    (finished,) = await _claim(repository, "w-done", "media.mix")
    await _claim(repository, "runtime-1", "example.echo")  # the in-process runtime
    await _claim(repository, "w-listed", "example.echo")  # remote by its name alone
    await repository.succeed(finished.lease)
    clock.advance(LEASE / 2 + 1)  # w-b's lease has expired
    renewals = await repository.heartbeat([claimed.lease for claimed in held_by_a], LEASE)
    assert all(renewal is not None for renewal in renewals)

    holders = await repository.lease_holders(REMOTE, ["w-listed", "w-gone"])

    assert holders == [
        LeaseHolder("w-a", ("media.cut", "pdf.render"), 3, clock.now() + timedelta(seconds=LEASE)),
        LeaseHolder("w-listed", ("example.echo",), 1, claimed_at + timedelta(seconds=LEASE)),
    ]


async def test_without_remote_kinds_only_named_workers_count(repository: JobRepository) -> None:
    await enqueue(repository, kind="media.cut")
    await enqueue(repository, kind="media.cut")
    await _claim(repository, "w-a", "media.cut")
    await _claim(repository, "w-b", "media.cut")

    assert await repository.lease_holders(NO_PATTERNS, []) == []
    assert [holder.worker_id for holder in await repository.lease_holders(NO_PATTERNS, ["w-b"])] == ["w-b"]
