"""Numbering events in their owners' feeds, once, above the engines.

A unit of work's events are numbered and written at its very end, each owner's
in one block after that owner's newest position, with the owner's feed head
locked from then until the commit. So two units of work that write events of
one owner take their numbers one after the other, and the second only once the
first has committed (on PostgreSQL the head's row lock makes the second wait;
on SQLite there is one writer at a time anyway). A reader that sees a position
therefore already sees every lower one of that owner: nothing committed later
can land below what a subscriber has read, on any replica. Taking the heads
last, in owner order, keeps the lock short (the insert and the commit) and
keeps two units of work from taking them in opposite orders.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from leasehold._server.jobs.operations.rows import Rows
from leasehold._server.jobs.records import FeedEvent, JobEvent, JobSubject


def seal(
    rows: Rows, events: Sequence[JobEvent], known: Mapping[str, JobSubject] | None = None
) -> list[FeedEvent]:
    """Number `events` (in the order the unit of work made them) in their
    owners' feeds and write them: the last thing a unit of work does. `known`:
    the subjects of jobs the operations had in hand (every row a transition
    or an enqueue wrote); the others are looked up."""
    if not events:
        return []
    subjects = dict(known or {})
    missing = [job_id for job_id in dict.fromkeys(event.job_id for event in events) if job_id not in subjects]
    if missing:
        subjects.update(rows.feed_subjects(missing))
    counts = Counter(subjects[event.job_id].owner_id for event in events)
    newest = rows.advance_feed_heads(dict(sorted(counts.items())))
    position = {owner: newest[owner] - count for owner, count in counts.items()}
    numbered: list[FeedEvent] = []
    for event in events:
        subject = subjects[event.job_id]
        position[subject.owner_id] += 1
        numbered.append(FeedEvent(event, position[subject.owner_id], subject))
    rows.write_events(numbered)
    return numbered


def subjects_of(written: Iterable[Mapping[Any, Any]]) -> dict[str, JobSubject]:
    """The subjects of rows an operation wrote, those that carry them (a brief
    transition's RETURNING does not: `seal` looks those jobs up)."""
    return {row["id"]: JobSubject.of(row) for row in written if "owner_id" in row}
