"""Waiting on job outcomes through the change hub instead of sleeping."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime

from leasehold._server.clock import Clock
from leasehold._server.jobs.records import Job, JsonObject, Lease, NewJob
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.claim_loop import Runtime, RuntimeSettings
from leasehold.worker import HandlerRegistry
from tests.support import OWNER


async def enqueue(
    repository: JobRepository, kind: str, payload: JsonObject | None = None, **kw: object
) -> Job:
    job, _ = await repository.enqueue(
        NewJob(owner_id=OWNER, kind=kind, payload=payload or {}, **kw)  # type: ignore[arg-type]
    )
    return job


async def wait_for_terminal(repository: JobRepository, job_id: str, timeout: float = 15) -> Job:
    """Wait for the job to finish, woken by its own events (a slow poll backs it up)."""
    async with asyncio.timeout(timeout):
        with repository.changes.watch_job(job_id) as changed:
            while True:
                changed.take()
                job = await repository.get(OWNER, job_id)
                if job.status.is_terminal:
                    return job
                try:
                    await asyncio.wait_for(changed.wait(), 0.5)
                except TimeoutError:
                    pass


@asynccontextmanager
async def running(
    repository: JobRepository,
    registry: HandlerRegistry,
    clock: Clock,
    settings: RuntimeSettings | None = None,
) -> AsyncIterator[Runtime]:
    runtime = Runtime(
        repository, registry, clock, settings or RuntimeSettings(poll_seconds=0.05, lease_seconds=6)
    )
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.stop()


class RenewSpy:
    """The real repository, with a signal each time a heartbeat renews a lease."""

    def __init__(self, inner: JobRepository) -> None:
        self._inner = inner
        self.renewed = asyncio.Event()

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

    async def renew(self, lease: Lease, lease_seconds: float) -> datetime:
        expires_at = await self._inner.renew(lease, lease_seconds)
        self.renewed.set()
        return expires_at
