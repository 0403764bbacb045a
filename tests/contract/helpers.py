"""Small steps the contract tests share."""

from __future__ import annotations

from leasehold._server.jobs.records import ClaimedJob, NewJob
from leasehold._server.jobs.repository import JobRepository
from tests.support import OWNER

LEASE = 30.0


async def enqueue(repository: JobRepository, **overrides: object) -> str:
    fields: dict[str, object] = {"owner_id": OWNER, "kind": "example.echo", "payload": {}}
    fields.update(overrides)
    job, _ = await repository.enqueue(NewJob(**fields))  # type: ignore[arg-type]
    return job.id


async def claim_one(repository: JobRepository, worker: str = "w1") -> ClaimedJob:
    result = await repository.claim(worker, 1, LEASE)
    assert len(result.jobs) == 1
    return result.jobs[0]


async def event_types(repository: JobRepository, job_id: str) -> list[str]:
    return [e.type for e in await repository.list_events(OWNER, job_id, 0, 1000)]


async def recovered_ids(repository: JobRepository) -> list[str]:
    """`recover_expired_leases`, by job id."""
    return [job.job_id for job in await repository.recover_expired_leases()]
