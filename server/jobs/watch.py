"""Follow one job's event log: replay, then live, until its terminal event.

Replay reads the log in pages, each a short read that holds no transaction open
while the caller is busy sending, so a slow subscriber never stalls checkpoints.
Live events come from the change hub's memory without touching the database; the
log is read again only when the hub cannot vouch for the next event: a gap in
sequences, a subscription that overflowed, or a commit by another process (which
the storage engine announces). A quiet watcher costs nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from leasehold._server.jobs.errors import ServerDraining
from leasehold._server.jobs.records import JobEvent
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.state_machine import TERMINAL_EVENT_TYPES

# What a watcher cut off by a drain is told to do: true for one server as for many.
RESUME_WATCH = "watch again once it is back (or on any replica) and resume with after_sequence"

READ_BATCH = 500


async def follow_events(
    repository: JobRepository,
    owner_id: str,
    job_id: str,
    after_sequence: int,
    stopping: Callable[[], bool] = lambda: False,
) -> AsyncIterator[JobEvent]:
    """`stopping()` turning true (checked before each read of the log and each
    look at the live feed; see ChangeHub.interrupt_watchers) ends the stream with
    ServerDraining: the caller resumes elsewhere from the last event it got."""
    last = after_sequence
    delivered_any = False
    # Subscribe before the first read: whatever commits after that read is
    # then in the subscription, so nothing falls between the two.
    with repository.changes.watch_job(job_id) as subscription:
        while True:
            # Catch up from the log (this also checks the job is the caller's).
            while True:
                _check(stopping)
                events = await repository.list_events(owner_id, job_id, last, READ_BATCH)
                for event in events:
                    yield event
                    last = event.sequence
                    if event.type in TERMINAL_EVENT_TYPES:
                        return
                delivered_any |= bool(events)
                if len(events) < READ_BATCH:
                    break
            if not delivered_any:
                # Nothing after `after_sequence` yet: the job may already be over,
                # its terminal event at or before that point, and nothing will come.
                job = await repository.get(owner_id, job_id)
                if job.status.is_terminal:
                    for event in await repository.list_events(owner_id, job_id, last, READ_BATCH):
                        yield event
                    return
            # Live, from memory, until the hub cannot vouch for the next event.
            while True:
                # Checked here, with no await before the wait below: a drain that
                # began while the caller held the last event (its wake-up spent
                # before the take) is seen now rather than never.
                _check(stopping)
                buffered, complete = subscription.take()
                if any(event.type in TERMINAL_EVENT_TYPES and event.sequence <= last for event in buffered):
                    return  # it ended at or before the caller's cursor: nothing more will come
                fresh = [event for event in buffered if event.sequence > last]
                if not complete or not _continues(fresh, last):
                    break
                if not fresh:
                    await subscription.wait()
                    continue
                for event in fresh:
                    yield event
                    last = event.sequence
                    delivered_any = True
                    if event.type in TERMINAL_EVENT_TYPES:
                        return


def _check(stopping: Callable[[], bool]) -> None:
    if stopping():
        raise ServerDraining(RESUME_WATCH)


def _continues(events: list[JobEvent], last: int) -> bool:
    """Whether `events` are exactly the ones after `last`, with no gap."""
    return all(event.sequence == last + offset for offset, event in enumerate(events, start=1))
