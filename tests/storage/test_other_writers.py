"""Commits made through another connection (another process on the same file)
are announced in this one, through SQLite's change counter, without any
per-watcher polling."""

from __future__ import annotations

import asyncio
from pathlib import Path

from leasehold._server import migrate
from leasehold._server.clock import SystemClock
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from tests.storage.feed_looks import SOON, count_looks, until
from tests.support import OWNER, sqlite_url


async def test_another_writers_commits_wake_this_process_and_its_own_do_not_look_foreign(
    tmp_path: Path,
) -> None:
    url = sqlite_url(tmp_path)
    await asyncio.to_thread(migrate.upgrade, url)
    ours = SqlJobRepository(create_engines(url), SystemClock(), other_writers_poll_seconds=0.05)
    theirs = SqlJobRepository(create_engines(url), SystemClock())
    try:
        job, _ = await ours.enqueue(NewJob(OWNER, "example.echo", {}))
        looks = count_looks(ours)
        claimed = (await ours.claim("w", 1, 30)).jobs[0]  # also starts the watch
        # Its first look has no baseline and announces a change, in case one was
        # missed; let that pass: a second look comes only after the first's announcement.
        await until(lambda: looks() >= 2)
        with ours.changes.watch_work() as work, ours.changes.watch_job(job.id) as subscription:
            # Our own commit: announced with its event, nothing to re-read.
            own = await ours.append_event(claimed.lease, "ours", {})
            seen = looks()
            await until(lambda: looks() >= seen + 3)  # several checks of the counter since
            events, complete = subscription.take()
            assert complete and [e.sequence for e in events] == [own.sequence]
            work.clear()

            # Theirs: this process cannot know what it was, only that it happened.
            await theirs.append_event(claimed.lease, "theirs", {})
            await asyncio.wait_for(subscription.wait(), SOON)
            events, complete = subscription.take()
            assert not complete and events == []
            await theirs.enqueue(NewJob(OWNER, "example.echo", {}))
            await asyncio.wait_for(work.wait(), SOON)
    finally:
        await theirs.close()
        await ours.close()
