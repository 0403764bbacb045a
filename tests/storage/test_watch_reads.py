"""A watcher between events holds no read transaction, so checkpoints are never
stalled by a slow subscriber."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from leasehold._server import migrate
from leasehold._server.clock import ManualClock
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.jobs.watch import follow_events
from tests.support import OWNER, make_sqlite_repository, sqlite_url


async def test_a_paused_watcher_does_not_block_a_full_checkpoint(tmp_path: Path) -> None:
    repository = await make_sqlite_repository(tmp_path, ManualClock())
    try:
        job, _ = await repository.enqueue(NewJob(owner_id=OWNER, kind="example.echo", payload={}))
        claimed = (await repository.claim("w", 1, 30)).jobs[0]
        for i in range(20):
            await repository.append_event(claimed.lease, "step", {"i": i})
        stream = follow_events(repository, OWNER, job.id, 0)

        first = await anext(stream)  # the watcher now sits between two events
        checkpoint = await asyncio.to_thread(_truncate_checkpoint, tmp_path / "leasehold.db")
        rest = [await anext(stream) for _ in range(21)]
        await stream.aclose()
    finally:
        await repository.close()

    assert first.sequence == 1
    assert [event.sequence for event in rest] == list(range(2, 23))
    busy, wal_frames, _checkpointed = checkpoint
    assert busy == 0 and wal_frames == 0


def _truncate_checkpoint(path: Path) -> tuple[int, int, int]:
    conn = sqlite3.connect(path)
    try:
        return conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
    finally:
        conn.close()


async def test_a_watcher_past_the_end_of_a_running_job_ends_when_the_job_does(tmp_path: Path) -> None:
    """A cursor past a job's last event (say, kept from another job) gets no
    events; once the job ends the stream must end too, not wait forever."""
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    # Checking often for other processes' commits: its first look (which always
    # announces a change) is long past when the job ends, so it cannot end the
    # stream by accident.
    repository = SqlJobRepository(create_engines(url), ManualClock(), other_writers_poll_seconds=0.05)
    try:
        job, _ = await repository.enqueue(NewJob(owner_id=OWNER, kind="example.echo", payload={}))
        claimed = (await repository.claim("w", 1, 30)).jobs[0]
        received = []

        async def watch() -> None:
            async for event in follow_events(repository, OWNER, job.id, 50):
                received.append(event)

        watcher = asyncio.create_task(watch())
        await asyncio.sleep(0.5)  # subscribed and waiting, the job still running
        assert not watcher.done()
        await repository.succeed(claimed.lease)
        await asyncio.wait_for(watcher, 5)
    finally:
        await repository.close()

    assert received == []
