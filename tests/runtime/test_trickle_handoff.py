"""A job enqueued while a slot is idle starts after one commit: the enqueue's,
which also leases it to the waiting runtime (DESIGN §15). Before, a second
commit (the runtime's own claim) sat between the call and the handler."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from sqlalchemy import event

from leasehold._server.clock import SystemClock
from leasehold._server.jobs.records import JobStatus
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.runtime.claim_loop import RuntimeSettings
from leasehold.worker import HandlerRegistry, JobContext
from tests.runtime.helpers import enqueue, running, wait_for_terminal

IDLE_SETTLE_SECONDS = 0.2
JOBS = 5


async def test_each_job_enqueued_to_an_idle_runtime_starts_after_its_enqueue_commit_alone(
    sqlite_live_repository: SqlJobRepository,
) -> None:
    repository = sqlite_live_repository
    commits: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.endswith("COMMIT"):
            commits.append(statement)

    commits_at_start: dict[str, int] = {}

    async def note(ctx: JobContext) -> None:
        commits_at_start[ctx.job_id] = len(commits)

    registry = HandlerRegistry()
    registry.register("test.note", note)
    writer = repository._engines.writer
    # Poll rarely, so only a commit can have started the job this fast.
    settings = RuntimeSettings(concurrency=4, poll_seconds=5.0, lease_seconds=30)
    async with running(repository, registry, SystemClock(), settings):
        for _ in range(JOBS):
            await asyncio.sleep(IDLE_SETTLE_SECONDS)  # idle, its claim waiting for work
            event.listen(writer, "before_cursor_execute", count)
            try:
                before = len(commits)
                job = await enqueue(repository, "test.note")
                done = await wait_for_terminal(repository, job.id)
            finally:
                event.remove(writer, "before_cursor_execute", count)
            assert done.status is JobStatus.SUCCEEDED
            # The handler ran after exactly one commit: the enqueue's, which leased it.
            assert commits_at_start[job.id] - before == 1, (commits_at_start[job.id], before)


async def test_a_slots_next_job_is_claimed_in_the_commit_that_records_its_last_outcome(
    sqlite_live_repository: SqlJobRepository,
) -> None:
    """A drain through one slot: the slot is free once its handler stops, so its
    next claim is queued beside the outcome and commits with it, one commit a
    job. Freed only after the outcome's commit, every job would cost two."""
    repository = sqlite_live_repository
    commits: list[str] = []

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.endswith("COMMIT"):
            commits.append(statement)

    commits_at_start: list[int] = []

    async def note(ctx: JobContext) -> None:
        commits_at_start.append(len(commits))

    registry = HandlerRegistry()
    registry.register("test.note", note)
    jobs = [await enqueue(repository, "test.note") for _ in range(JOBS)]
    writer = repository._engines.writer
    event.listen(writer, "before_cursor_execute", count)
    try:
        settings = RuntimeSettings(concurrency=1, poll_seconds=5.0, lease_seconds=30)
        async with running(repository, registry, SystemClock(), settings):
            for job in jobs:
                assert (await wait_for_terminal(repository, job.id)).status is JobStatus.SUCCEEDED
    finally:
        event.remove(writer, "before_cursor_execute", count)

    steps = [later - earlier for earlier, later in itertools.pairwise(commits_at_start)]
    assert steps == [1] * (JOBS - 1), commits_at_start
