"""Follow one job's event log: replay, then live, until its terminal event.

Each step is a short read that holds no transaction open while the caller is
busy sending, so a slow subscriber never stalls checkpoints. Live updates arrive
through the change hub; `poll_seconds` only covers writers in other processes.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from server.jobs.records import JobEvent
from server.jobs.repository import JobRepository

TERMINAL_EVENT_TYPES = frozenset({"job.succeeded", "job.failed", "job.cancelled"})
READ_BATCH = 500


async def follow_events(
    repository: JobRepository,
    owner_id: str,
    job_id: str,
    after_sequence: int,
    poll_seconds: float,
) -> AsyncIterator[JobEvent]:
    last = after_sequence
    with repository.changes.watch_job(job_id) as new_events:
        while True:
            new_events.clear()
            events = await repository.list_events(owner_id, job_id, last, READ_BATCH)
            if not events:
                # Read the status first, then the events once more: the terminal
                # event commits with the terminal status, so it is in that read.
                job = await repository.get(owner_id, job_id)
                if job.status.is_terminal:
                    for event in await repository.list_events(owner_id, job_id, last, READ_BATCH):
                        yield event
                    return
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_seconds):
                        await new_events.wait()
                continue
            for event in events:
                yield event
                last = event.sequence
                if event.type in TERMINAL_EVENT_TYPES:
                    return
