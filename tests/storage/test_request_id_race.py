"""Request ids across processes: two repositories on one database (two
replicas, each with its own writer and transactions) sent one request id at
once make one job, and every other call answers from the winner's row. On
PostgreSQL the loser's INSERT waits for the winner's transaction: committed,
the loser answers from it; rolled back, the loser acts itself."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import create_engine, insert, text

from leasehold._server.clock import SystemClock
from leasehold._server.jobs.idempotency import Method, RequestKey
from leasehold._server.jobs.records import JobFilter, NewJob
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.sql.tables import request_ids
from tests.conftest import Postgres
from tests.support import OWNER, make_repository

KEY = RequestKey(OWNER, "race-1", Method.ENQUEUE, "f" * 64)
NEW_JOB = NewJob(owner_id=OWNER, kind="example.echo", payload={})


@pytest.fixture
async def replicas(database_url: str) -> AsyncIterator[tuple[SqlJobRepository, SqlJobRepository]]:
    clock = SystemClock()
    first = await make_repository(database_url, clock)
    second = await make_repository(database_url, clock)
    try:
        yield first, second
    finally:
        await first.close()
        await second.close()


async def test_two_replicas_sent_one_request_id_at_once_make_one_job(
    replicas: tuple[SqlJobRepository, SqlJobRepository],
) -> None:
    first, second = replicas

    answers = await asyncio.gather(
        *(replica.enqueue_once([NEW_JOB], KEY) for replica in (first, second) for _ in range(10))
    )

    assert len({answer.answers[0][0].id for answer in answers}) == 1
    assert sum(not answer.repeated for answer in answers) == 1
    page = await first.list_jobs(OWNER, JobFilter(), 100, None)
    assert len(page.jobs) == 1


async def _waiting_on_a_lock(engine: Any) -> None:
    """Until some session waits on a lock (the replica's INSERT behind ours)."""
    for _ in range(500):
        with engine.connect() as conn:
            waiting = conn.execute(
                text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            ).scalar_one()
        if waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the replica's insert never waited for the open transaction")


@pytest.mark.parametrize("outcome", ["commit", "rollback"])
async def test_on_postgresql_the_loser_waits_for_the_winners_transaction(
    postgres: Postgres, outcome: str
) -> None:
    """SQLite has one writer at a time, so there is no open transaction to wait behind."""
    database_url = postgres.fresh_database_url()
    replica = await make_repository(database_url, SystemClock())
    made, _ = await replica.enqueue(NEW_JOB)
    engine = create_engine(database_url)  # the driver the server uses is a sync one
    try:
        with engine.connect() as winner:
            # Another replica's call, mid-transaction: its key row is in, not committed.
            winner.execute(
                insert(request_ids).values(
                    owner_id=OWNER,
                    request_id=KEY.request_id,
                    method=KEY.method.value,
                    fingerprint=KEY.fingerprint,
                    response=[{"job_id": made.id, "created": True}],
                    created_at=datetime.now(UTC),
                )
            )
            loser = asyncio.create_task(replica.enqueue_once([NEW_JOB], KEY))
            await _waiting_on_a_lock(engine)
            assert not loser.done()
            getattr(winner, outcome)()
            answered = await asyncio.wait_for(loser, 15)
    finally:
        engine.dispose()
        await replica.close()

    if outcome == "commit":
        assert answered.repeated and answered.answers == [(made, True)]
    else:
        assert not answered.repeated and answered.answers[0][0].id != made.id
