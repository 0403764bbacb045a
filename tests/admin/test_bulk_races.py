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
