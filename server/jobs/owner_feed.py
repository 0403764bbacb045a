"""Follow an owner's feed: every committed event of every job the owner has,
in the order they committed, each once; replayed from the database, then live.

It is `watch.follow_events` for a whole owner. Replay reads the feed in pages,
each a short read holding no transaction while the caller is busy sending.
Live events come from the change hub's memory; the feed is read again only when
the hub cannot vouch for the next one: its position is not the one after the
last (another process committed in between, or the subscription overflowed),
or another process announced a commit to this owner's feed. A subscriber that
falls behind therefore costs the server a bounded buffer, never its backlog.

Positions count each owner's events 1, 2, 3 … in commit order
(`operations.feed`), so "the one after the last" is exact. On the wire they
are fixed-width hexadecimal: opaque to callers, and sorting as strings in
feed order.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Collection
from dataclasses import dataclass

from leasehold._server.jobs.errors import FeedPositionExpired, InvalidArgument, ServerDraining
from leasehold._server.jobs.records import FeedEvent
from leasehold._server.jobs.repository import JobRepository

RESUME_FEED = "subscribe again once it is back (or on any replica) and resume with after_position"

READ_BATCH = 500
_POSITION = re.compile(r"[0-9a-f]{16}")


def encode_position(position: int) -> str:
    return f"{position:016x}"


def decode_position(text: str, field: str = "after_position") -> int:
    if not _POSITION.fullmatch(text):
        raise InvalidArgument(field, "not a feed position this service issued")
    return int(text, 16)


@dataclass(frozen=True, slots=True)
class FeedFilter:
    """Which events a subscriber wants; an empty part wants everything."""

    kinds: frozenset[str] = frozenset()
    resource_type: str = ""
    event_types: frozenset[str] = frozenset()

    def matches(self, numbered: FeedEvent) -> bool:
        subject = numbered.subject
        return (
            (not self.kinds or subject.kind in self.kinds)
            and (not self.resource_type or subject.resource_type == self.resource_type)
            and (not self.event_types or numbered.event.type in self.event_types)
        )


async def follow_feed(
    repository: JobRepository,
    owner_id: str,
    after_position: int | None,
    wanted: FeedFilter,
    tail: bool = False,
    stopping: Callable[[], bool] = lambda: False,
) -> AsyncIterator[FeedEvent]:
    """The owner's events after `after_position` (None: from the oldest kept;
    `tail`: from now on) that `wanted` matches, without end. Raises
    FeedPositionExpired once retention has deleted events the caller has not
    had, InvalidArgument for a position past the end of the feed, and
    ServerDraining once `stopping()` (see `watch.follow_events`)."""
    # Subscribe before the first read: whatever commits after that read is
    # then in the subscription, so nothing falls between the two.
    with repository.changes.watch_feed(owner_id) as subscription:
        head = await repository.feed_head(owner_id)
        if tail:
            last = floor = head.last_position
        elif after_position is None:
            # From the oldest kept: what retention deleted before the first
            # read is no gap of the caller's.
            last, floor = 0, None
        else:
            if after_position > head.last_position:
                raise InvalidArgument("after_position", "is past the end of the feed")
            last = floor = after_position
        while True:
            while True:
                _check(stopping)
                page = await repository.read_feed(owner_id, last, READ_BATCH)
                if floor is None:
                    floor = page.expired_through
                if page.expired_through > max(last, floor):
                    raise FeedPositionExpired(encode_position(last), encode_position(page.expired_through))
                for numbered in page.events:
                    last = numbered.position
                    if wanted.matches(numbered):
                        yield numbered
                if len(page.events) < READ_BATCH:
                    break
            # Live, from memory, until the hub cannot vouch for the next event.
            while True:
                # Checked with no await before the wait below (see follow_events).
                _check(stopping)
                buffered, complete = subscription.take()
                fresh = sorted((numbered for numbered in buffered if numbered.position > last), key=_position)
                if not complete or not _continues(fresh, last):
                    break
                if not fresh:
                    await subscription.wait()
                    continue
                for numbered in fresh:
                    last = numbered.position
                    if wanted.matches(numbered):
                        yield numbered


def _position(numbered: FeedEvent) -> int:
    return numbered.position


def _check(stopping: Callable[[], bool]) -> None:
    if stopping():
        raise ServerDraining(RESUME_FEED)


def _continues(events: Collection[FeedEvent], last: int) -> bool:
    """Whether `events` are exactly the ones after `last`, with no gap."""
    return all(numbered.position == last + offset for offset, numbered in enumerate(events, start=1))
