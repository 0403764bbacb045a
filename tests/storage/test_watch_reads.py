"""A watcher between events holds no read transaction, so checkpoints are never
stalled by a slow subscriber."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from server.clock import ManualClock
from server.jobs.records import NewJob
from server.jobs.watch import follow_events
from tests.support import OWNER, make_sqlite_repository


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
