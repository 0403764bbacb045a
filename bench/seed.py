"""Template databases, seeded in-process through Leasehold's own repository.

Seeding goes through `SqlJobRepository.enqueue` (so rows, indexes and `job.queued` events are
exactly what the server writes) in concurrent chunks: concurrent calls are group-committed, one
await at a time would be one transaction per job. A template is seeded once per bench run,
checkpointed (SQLite), and copied for every round, so no round pays for, or benefits from, another's
leftovers.

These functions run in child processes (bench.child).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from bench.common import OWNER, checkpoint, sqlite_url
from leasehold._server import migrate
from leasehold._server.clock import SystemClock
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.logs import configure_logging

CHUNK = 500


async def _open(database: Path | str) -> SqlJobRepository:
    """A repository on a migrated database: a SQLite file, or a database URL (PostgreSQL)."""
    url = sqlite_url(database) if isinstance(database, Path) else database
    await asyncio.to_thread(migrate.upgrade, url)
    return SqlJobRepository(create_engines(url), SystemClock())


def owner_of(index: int, owners: int) -> str:
    """Who owns the `index`th seeded job when `owners` owners take turns (one: the bench owner)."""
    return OWNER if owners <= 1 else f"bench-owner-{index % owners:04d}"


async def _enqueue(repo: SqlJobRepository, kind: str, count: int, owners: int = 1) -> None:
    for start in range(0, count, CHUNK):
        stop = min(count, start + CHUNK)
        await asyncio.gather(
            *(repo.enqueue(NewJob(owner_of(i, owners), kind, {"n": i})) for i in range(start, stop))
        )


async def seed_jobs(database: str, kind: str, count: int, owners: int = 1) -> dict[str, Any]:
    """`count` queued jobs of `kind`, payload `{"n": i}`, owned by `owners` owners in turn."""
    configure_logging("warning")
    began = time.monotonic()
    repo = await _open(Path(database))
    try:
        await _enqueue(repo, kind, count, owners)
    finally:
        await repo.close()
    checkpoint(Path(database))
    return {"jobs": count, "seconds": time.monotonic() - began}


async def seed_jobs_url(database_url: str, kind: str, count: int) -> dict[str, Any]:
    """The same on a database URL (a PostgreSQL template): migrate, then enqueue."""
    configure_logging("warning")
    began = time.monotonic()
    repo = await _open(database_url)
    try:
        await _enqueue(repo, kind, count)
    finally:
        await repo.close()
    return {"jobs": count, "seconds": time.monotonic() - began}


async def seed_event_log(database: str, events: int) -> dict[str, Any]:
    """One succeeded `bench.noop` job whose log holds `events` handler events (`bench.tick`,
    payload `{"i": n}`) between its lifecycle events: the log a replay reads."""
    configure_logging("warning")
    began = time.monotonic()
    repo = await _open(Path(database))
    try:
        job, _ = await repo.enqueue(NewJob(OWNER, "bench.noop", {}))
        claimed = await repo.claim("bench-seeder", 1, 3600)
        if len(claimed.jobs) != 1 or claimed.jobs[0].job.id != job.id:
            raise RuntimeError("seed_event_log: could not claim the job it just enqueued")
        lease = claimed.jobs[0].lease
        for start in range(0, events, CHUNK):
            stop = min(events, start + CHUNK)
            await asyncio.gather(
                *(repo.append_event(lease, "bench.tick", {"i": i + 1}) for i in range(start, stop))
            )
        await repo.succeed(lease)
    finally:
        await repo.close()
    checkpoint(Path(database))
    return {"job_id": job.id, "events": events, "seconds": time.monotonic() - began}
