"""Handler events and cancel checks of many running jobs are written and read
together (on both databases): the events of a writer batch take their sequences
in one statement and go in with one INSERT, and the cancel checks asked in one
turn of the loop are one SELECT, never one statement per job."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from leasehold._server.clock import ManualClock
from leasehold._server.jobs.errors import LeaseLost
from leasehold._server.jobs.records import ClaimedJob, Lease, NewJob
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.support import OWNER, make_repository

LEASE = 30.0
JOBS = 40


@pytest.fixture
async def running(
    database_url: str, clock: ManualClock
) -> AsyncIterator[tuple[SqlJobRepository, list[ClaimedJob]]]:
    repository = await make_repository(database_url, clock)
    assert isinstance(repository, SqlJobRepository)
    try:
        for _ in range(JOBS):
            await repository.enqueue(NewJob(owner_id=OWNER, kind="example.echo", payload={}))
        yield repository, list((await repository.claim("w", JOBS, LEASE)).jobs)
    finally:
        await repository.close()


def _counting(engine: Engine, prefix: str, into: list[str]) -> Any:
    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith(prefix):
            into.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    return count


async def test_the_events_of_many_jobs_appended_at_once_take_one_statement_per_batch(
    running: tuple[SqlJobRepository, list[ClaimedJob]],
) -> None:
    repository, claimed = running
    sequences: list[str] = []
    writer = repository._engines.writer
    count = _counting(writer, "UPDATE JOBS SET LAST_EVENT_SEQUENCE", sequences)
    try:
        events = await asyncio.gather(
            *(repository.append_event(c.lease, "progress", {"step": 1}) for c in claimed)
        )
    finally:
        event.remove(writer, "before_cursor_execute", count)

    # Each job's log goes on from its own last event (job.queued, job.started).
    assert [(e.job_id, e.sequence) for e in events] == [(c.job.id, 3) for c in claimed]
    assert 1 <= len(sequences) < JOBS // 4, len(sequences)
    for c in claimed:
        log = await repository.list_events(OWNER, c.job.id, 0, 10)
        assert [e.type for e in log] == ["job.queued", "job.started", "progress"]


async def test_appends_on_one_job_in_one_batch_stay_gap_free_and_a_stale_lease_is_refused(
    running: tuple[SqlJobRepository, list[ClaimedJob]],
) -> None:
    repository, claimed = running
    lease = claimed[0].lease
    stale = Lease(job_id=lease.job_id, token="not-the-token", attempt=lease.attempt)
    answers = await asyncio.gather(
        *(repository.append_event(lease, "progress", {"n": n}) for n in range(5)),
        repository.append_event(stale, "progress", {"n": -1}),
        return_exceptions=True,
    )

    *appended, refused = answers
    assert isinstance(refused, LeaseLost)
    assert sorted(e.sequence for e in appended) == [3, 4, 5, 6, 7]  # type: ignore[union-attr]
    log = await repository.list_events(OWNER, lease.job_id, 0, 20)
    assert [e.sequence for e in log] == list(range(1, 8))
    assert [e.payload for e in log[2:]] == [{"n": n} for n in range(5)]


async def test_cancel_checks_asked_together_are_one_read_with_each_answer_its_own(
    running: tuple[SqlJobRepository, list[ClaimedJob]],
) -> None:
    repository, claimed = running
    await repository.cancel(OWNER, claimed[1].job.id)
    stale = Lease(job_id=claimed[2].job.id, token="not-the-token", attempt=1)
    reads: list[str] = []
    reader = repository._engines.reader.sync_engine
    count = _counting(reader, "SELECT JOBS.ID, JOBS.LEASE_TOKEN, JOBS.CANCEL_REQUESTED_AT", reads)
    try:
        answers = await asyncio.gather(
            *(repository.cancel_requested(c.lease) for c in claimed),
            repository.cancel_requested(stale),
            return_exceptions=True,
        )
    finally:
        event.remove(reader, "before_cursor_execute", count)

    *checks, refused = answers
    assert checks == [index == 1 for index in range(JOBS)]
    assert isinstance(refused, LeaseLost)
    assert len(reads) == 1


async def test_the_watchers_of_a_commit_wake_before_its_writer_is_answered(
    running: tuple[SqlJobRepository, list[ClaimedJob]],
) -> None:
    # A remote writer's answer is a gRPC send: behind it, every watcher of the
    # batch would wait for every answer of the batch.
    repository, claimed = running
    lease = claimed[0].lease
    order: list[str] = []
    with repository.changes.watch_job(lease.job_id) as subscription:

        async def watcher() -> None:
            await subscription.wait()
            order.append("watcher")

        watching = asyncio.create_task(watcher())
        await asyncio.sleep(0)
        await repository.append_event(lease, "progress", {})
        order.append("answer")
        await watching
    assert order == ["watcher", "answer"]
