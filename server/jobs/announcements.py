"""What one process tells the others that share its database after a commit:
whether it made work claimable, which jobs' logs grew, and which owners' feeds.

One text format for every transport (PostgreSQL's NOTIFY, the sibling bus of
`serve --processes`): `origin;work;items`, where items are job ids and, marked
with `@`, owners' feed keys (`notifications.feed_key`). The events themselves
stay in the database; an announcement only says where to look, which keeps it
small and keeps a subscriber's gap-free reading in one place.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from leasehold._server.jobs.notifications import ChangeHub

# PostgreSQL refuses a NOTIFY payload of 8,000 bytes or more; job ids are ASCII.
MAX_PAYLOAD_BYTES = 7_900
_FIELD = ";"
_ID = ","
_FEED = "@"
# Says "assume anything changed": for a receiver that may have missed announcements.
_UNKNOWN = "?"


@dataclass(frozen=True)
class Announcement:
    origin: str
    work: bool
    job_ids: list[str]
    feed_keys: list[str]
    # The sender may have lost announcements on their way here: read everything once.
    unknown: bool = False

    def publish(self, changes: ChangeHub) -> None:
        if self.unknown:
            changes.publish_unknown_changes()
            return
        if self.work:
            changes.publish_work()
        if self.job_ids:
            changes.publish_job_changes(self.job_ids)
        if self.feed_keys:
            changes.publish_feed_changes(self.feed_keys)


def payloads(origin: str, work: bool, job_ids: Sequence[str], feed_keys: Sequence[str] = ()) -> Iterator[str]:
    """The payloads for one batch: as few as fit the size limit; the first
    carries the work flag. The owners whose feeds the batch added to travel
    among the job ids as their keys marked with `_FEED` (a job id never begins so)."""
    head = f"{origin}{_FIELD}{int(work)}{_FIELD}"
    chunk: list[str] = []
    size = len(head)
    for job_id in [*job_ids, *(_FEED + key for key in feed_keys)]:
        if chunk and size + len(job_id) + 1 > MAX_PAYLOAD_BYTES:
            yield head + _ID.join(chunk)
            head = f"{origin}{_FIELD}0{_FIELD}"
            chunk, size = [], len(head)
        chunk.append(job_id)
        size += len(job_id) + 1
    if chunk or work:
        yield head + _ID.join(chunk)


def unknown_changes(origin: str) -> str:
    """The payload that tells a receiver to read everything once."""
    return f"{origin}{_FIELD}{_UNKNOWN}{_FIELD}"


def parse(payload: str) -> Announcement | None:
    """The announcement, or None for a payload that is not ours."""
    parts = payload.split(_FIELD)
    if len(parts) != 3 or parts[1] not in ("0", "1", _UNKNOWN):
        return None
    origin, work, ids = parts
    if work == _UNKNOWN:
        return Announcement(origin, False, [], [], unknown=True)
    items = [item for item in ids.split(_ID) if item]
    return Announcement(
        origin,
        work == "1",
        [item for item in items if not item.startswith(_FEED)],
        [item[1:] for item in items if item.startswith(_FEED)],
    )
