"""A bulk batch on PostgreSQL meets a row another transaction holds: it waits
for it, leaves it out once it no longer matches, and the walk still cancels
every other job, each once."""

from __future__ import annotations

import asyncio
import threading

import sqlalchemy as sa

from leasehold._server.clock import SystemClock
from leasehold._server.jobs import admin
from leasehold._server.jobs.admin import AdminFilter
from leasehold._server.jobs.records import JobFilter, JobStatus, NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.conftest import Postgres
from tests.database_reads import sync_url

QUEUED_ONLY = AdminFilter(JobFilter(statuses=frozenset({JobStatus.QUEUED})))


async def test_a_row_taken_meanwhile_drops_out_of_its_batch_and_the_walk_goes_on(postgres: Postgres) -> None:
    url = postgres.fresh_database_url()
    repository = SqlJobRepository(create_engines(url), SystemClock())
    engine = sa.create_engine(sync_url(url))
    try:
        made = await repository.enqueue_batch(
            [NewJob(owner_id="alice", kind="k", payload={}) for _ in range(7)]
        )
        newest = made[-1][0].id
        holding, release = threading.Event(), threading.Event()

        def take_newest() -> None:
            # Another replica's transaction: it holds the newest job's row, then starts it.
            with engine.begin() as conn:
                conn.execute(sa.text("UPDATE jobs SET status = 'running' WHERE id = :id"), {"id": newest})
                holding.set()
                release.wait(10)

        taker = threading.Thread(target=take_newest)
        taker.start()
        await asyncio.to_thread(holding.wait, 10)
        batches: list[int] = []

        async def step(below: int | None) -> admin.BulkBatch:
            if below is None:  # the first batch waits on the held row until its holder commits
                asyncio.get_running_loop().call_later(0.2, release.set)
            batch = await repository.bulk_cancel(QUEUED_ONLY, below, 3, 30.0, False)
            batches.append(batch.matched)
            return batch

        matched = await admin.walk(step)
        await asyncio.to_thread(taker.join, 10)
        assert matched == 6
        assert sum(batches) == 6 and batches[-1] == 0  # each job in one batch; an empty one ends it
        with engine.connect() as conn:
            statuses = dict(conn.execute(sa.text("SELECT status, count(*) FROM jobs GROUP BY status")).all())
        assert statuses == {"cancelled": 6, "running": 1}
    finally:
        engine.dispose()
        await repository.close()


async def test_a_bulk_retry_waiting_on_another_replicas_retries_adds_none_twice(postgres: Postgres) -> None:
    """Retrying changes no source row, so the locked read's own re-check cannot
    see a retry another replica's BulkRetry committed while it waited: the
    batch must ask again once it holds the locks."""
    url = postgres.fresh_database_url()
    repository = SqlJobRepository(create_engines(url), SystemClock())
    engine = sa.create_engine(sync_url(url))
    try:
        await repository.enqueue_batch([NewJob(owner_id="alice", kind="k", payload={}) for _ in range(5)])
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET status = 'failed'"))
        holding, release = threading.Event(), threading.Event()

        def retry_elsewhere() -> None:
            # Another replica's BulkRetry: it locks the sources and inserts their retries.
            with engine.begin() as conn:
                conn.execute(sa.text("SELECT id FROM jobs WHERE status = 'failed' FOR UPDATE"))
                conn.execute(
                    sa.text(
                        "INSERT INTO jobs (id, owner_id, kind, payload, status, max_attempts,"
                        " timeout_seconds, available_at, created_at, updated_at, retry_of_job_id)"
                        " SELECT 'r' || id, owner_id, kind, payload, 'queued', max_attempts,"
                        " timeout_seconds, available_at, created_at, updated_at, id"
                        " FROM jobs WHERE status = 'failed'"
                    )
                )
                holding.set()
                release.wait(10)

        other = threading.Thread(target=retry_elsewhere)
        other.start()
        await asyncio.to_thread(holding.wait, 10)
        asyncio.get_running_loop().call_later(0.2, release.set)
        failed_only = AdminFilter(JobFilter(statuses=frozenset({JobStatus.FAILED})))
        matched = await admin.walk(lambda below: repository.bulk_retry(failed_only, below, 3, False))
        await asyncio.to_thread(other.join, 10)
        assert matched == 0
        with engine.connect() as conn:
            per_source = conn.execute(
                sa.text(
                    "SELECT count(*) FROM jobs WHERE retry_of_job_id IS NOT NULL GROUP BY retry_of_job_id"
                )
            ).scalars()
            assert sorted(per_source) == [1] * 5
    finally:
        engine.dispose()
        await repository.close()
