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
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import URL, create_engine, make_url, text

from bench.baselines.grpc_noop import FEED_KIND, FEED_RESOURCE_TYPE, feed_event, feed_resource_id
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


# Retention (bench.figures.retention): jobs that finished long ago, with the events a real run
# leaves (job.queued, job.started, job.succeeded), followed by a queue to claim from.
EXPIRED_KIND = "bench.expired"
EXPIRED_AGE_SECONDS = 30 * 86_400
_MICROS = 1_000_000


def sync_url(database_url: str) -> URL:
    """A database URL of Leasehold's (aiosqlite, or psycopg) as SQLAlchemy's synchronous
    engines take it, for the bench's own statements."""
    url = make_url(database_url)
    return url.set(drivername="sqlite+pysqlite") if url.get_backend_name() == "sqlite" else url


def _age_expired(database_url: str, age_seconds: float) -> None:
    """Turn every queued `EXPIRED_KIND` job into one that succeeded `age_seconds` before it was
    enqueued, in four statements: each row and event is what claim and succeed would have
    written (attempt 1, a started_at and a completed_at, sequences 2 and 3), only older. The
    two event inserts are apart: under a UNION ALL PostgreSQL types the payload literals as
    text, which a JSON column refuses."""
    age = int(age_seconds * _MICROS)
    engine = create_engine(sync_url(database_url))
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "UPDATE job_events SET created_at = created_at - :age"
                    " WHERE job_id IN (SELECT id FROM jobs WHERE kind = :kind)"
                ),
                {"age": age, "kind": EXPIRED_KIND},
            )
            conn.execute(
                text(
                    "UPDATE jobs SET status = 'succeeded', attempt = 1, last_event_sequence = 3,"
                    " created_at = created_at - :age, available_at = available_at - :age,"
                    " started_at = created_at - :age + 1000, updated_at = created_at - :age + 2000,"
                    " completed_at = created_at - :age + 2000,"
                    " deadline_at = created_at - :age + 1000 + timeout_seconds * :micros"
                    " WHERE kind = :kind AND status = 'queued'"
                ),
                {"age": age, "kind": EXPIRED_KIND, "micros": _MICROS},
            )
            for sequence, event_type, payload, stamp in (
                (2, "job.started", '{"attempt": 1}', "started_at"),
                (3, "job.succeeded", "{}", "completed_at"),
            ):
                conn.execute(
                    text(
                        "INSERT INTO job_events (job_id, sequence, type, payload, created_at)"
                        f" SELECT id, {sequence}, '{event_type}', '{payload}', {stamp} FROM jobs"
                        " WHERE kind = :kind"
                    ),
                    {"kind": EXPIRED_KIND},
                )
    finally:
        engine.dispose()


async def seed_expired_jobs(database_url: str, expired: int, queued_kind: str, queued: int) -> dict[str, Any]:
    """`expired` succeeded `EXPIRED_KIND` jobs (3 events each) that completed
    `EXPIRED_AGE_SECONDS` ago, then `queued` queued jobs of `queued_kind`, on a SQLite file or
    a PostgreSQL database. The expired ones are enqueued through the repository like every
    seeded job, then aged with plain SQL."""
    configure_logging("warning")
    began = time.monotonic()
    repo = await _open(database_url)
    try:
        await _enqueue(repo, EXPIRED_KIND, expired)
    finally:
        await repo.close()
    await asyncio.to_thread(_age_expired, database_url, EXPIRED_AGE_SECONDS)
    repo = await _open(database_url)
    try:
        await _enqueue(repo, queued_kind, queued)
    finally:
        await repo.close()
    url = make_url(database_url)
    if url.get_backend_name() == "sqlite":
        checkpoint(Path(str(url.database)))
    return {"expired": expired, "queued": queued, "seconds": time.monotonic() - began}


async def seed_feed(database: str, jobs: int, events_per_job: int) -> dict[str, Any]:
    """The bench owner's feed holding `jobs * events_per_job` events: `jobs` succeeded
    `bench.noop` jobs, each with a resource (`bench.record`, `record-NNNNNNN`) and the log a run
    leaves (`job.queued`, `job.started`, `bench.tick`s, `job.succeeded`), one job's events after
    the other in the feed (the shape bench.baselines.grpc_noop streams).

    The first job goes through the repository (enqueue, claim, append, succeed), so its rows are
    what the server writes; the rest are copies of it made with plain SQL, in three statements,
    because a million events through the repository would take minutes a run."""
    configure_logging("warning")
    began = time.monotonic()
    repo = await _open(Path(database))
    try:
        job, _ = await repo.enqueue(
            NewJob(
                OWNER, FEED_KIND, {"n": 0}, resource_type=FEED_RESOURCE_TYPE, resource_id=feed_resource_id(0)
            )
        )
        claimed = await repo.claim("bench-seeder", 1, 3600)
        if len(claimed.jobs) != 1 or claimed.jobs[0].job.id != job.id:
            raise RuntimeError("seed_feed: could not claim the job it just enqueued")
        lease = claimed.jobs[0].lease
        for sequence in range(3, events_per_job):
            await repo.append_event(lease, *feed_event(sequence, events_per_job))
        await repo.succeed(lease)
    finally:
        await repo.close()
    await asyncio.to_thread(_copy_feed_job, Path(database), job.id, jobs, events_per_job)
    checkpoint(Path(database))
    return {"jobs": jobs, "events": jobs * events_per_job, "seconds": time.monotonic() - began}


def _copy_feed_job(database: Path, template_id: str, jobs: int, events_per_job: int) -> None:
    """Jobs 1 .. `jobs - 1` as copies of `template_id` (job 0, whose events hold positions 1 ..
    `events_per_job`): ids, resource ids and payloads of their own, the template's events with
    each `bench.tick`'s `i` kept, and positions continuing in job order."""
    conn = sqlite3.connect(database, isolation_level=None)
    try:
        columns = [row[1] for row in conn.execute("PRAGMA table_info(jobs)") if row[1] != "seq"]
        own = {
            "id": "printf('job_%032x', n.i)",
            "resource_id": "printf('record-%07d', n.i)",
            "payload": "json_object('n', n.i)",
        }
        values = ", ".join(own.get(column, f"t.{column}") for column in columns)
        numbers = "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < :last)"
        conn.execute("BEGIN")
        conn.execute(
            f"{numbers} INSERT INTO jobs ({', '.join(columns)})"
            f" SELECT {values} FROM n, jobs t WHERE t.id = :template ORDER BY n.i",
            {"last": jobs - 1, "template": template_id},
        )
        conn.execute(
            f"{numbers} INSERT INTO job_events"
            " (job_id, sequence, type, payload, created_at, owner_id, position)"
            " SELECT printf('job_%032x', n.i), e.sequence, e.type, e.payload, e.created_at, e.owner_id,"
            " n.i * :per_job + e.position FROM n, job_events e WHERE e.job_id = :template"
            " ORDER BY n.i, e.sequence",
            {"last": jobs - 1, "template": template_id, "per_job": events_per_job},
        )
        conn.execute(
            "UPDATE feed_heads SET last_position = :total WHERE owner_id = :owner",
            {"total": jobs * events_per_job, "owner": OWNER},
        )
        conn.execute("COMMIT")
        seen = conn.execute(
            "SELECT count(*), min(position), max(position) FROM job_events WHERE owner_id = ?", (OWNER,)
        ).fetchone()
    finally:
        conn.close()
    if tuple(seen) != (jobs * events_per_job, 1, jobs * events_per_job):
        raise RuntimeError(f"seed_feed: the feed holds (count, first, last) {tuple(seen)}")
