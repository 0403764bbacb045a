"""In-process announcements of committed changes.

Storage engines publish only after a commit, so whoever wakes up acts on data
that is already durable. Work listeners are plain `asyncio.Event`s: setting one
twice is harmless, and a claimer that cleared its event before looking can never
miss work committed after that look.

Events are fanned out from memory: each subscription to a job, and each to an
owner's feed, gets the committed events themselves, so a thousand watchers of
busy jobs cost no database reads while they keep up. The database stays the
source of truth: a subscription that fell too far behind, or that may have
missed writes made by another process, says so, and its reader catches up from
the event log (or the feed).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

from leasehold._server.jobs.records import FeedEvent, JobEvent

T = TypeVar("T")

# Events a subscription holds for a reader that has not taken them yet. Past
# this the reader is told to read the log instead, so a stalled subscriber
# costs bounded memory. Subscribers of one job share the event objects, so at
# worst (every event at the 256 KiB payload limit) this pins 64 MiB per job.
SUBSCRIPTION_BUFFER = 256
# The service's own events (state changes), as opposed to a handler's.
LIFECYCLE_PREFIX = "job."


class Subscription(Generic[T]):
    """What was published for one subject (a job, an owner) in this process
    since the subscription began, in the order it was published."""

    def __init__(self) -> None:
        self._signal = asyncio.Event()
        self._items: deque[T] = deque()
        self._complete = True

    def take(self) -> tuple[list[T], bool]:
        """What was published since the last take, and whether that is all of
        it (False: some was dropped, or another process may have written)."""
        items, complete = list(self._items), self._complete
        self._items.clear()
        self._complete = True
        self._signal.clear()
        return items, complete

    async def wait(self) -> None:
        """Until something was published since the last `take`."""
        await self._signal.wait()

    def _deliver(self, item: T) -> None:
        if len(self._items) < SUBSCRIPTION_BUFFER:
            self._items.append(item)
        else:
            self._complete = False
        self._signal.set()

    def _mark_incomplete(self) -> None:
        self._complete = False
        self._signal.set()


# A job's events; an owner's feed.
JobSubscription = Subscription[JobEvent]
FeedSubscription = Subscription[FeedEvent]


def feed_key(owner_id: str) -> str:
    """What a commit's announcement says of an owner whose feed it added to: a
    short digest, so that it is bounded in size and says nothing readable; two
    owners sharing one only cost their subscribers an extra read."""
    return hashlib.blake2b(owner_id.encode(), digest_size=6).hexdigest()


class ChangeHub:
    def __init__(self) -> None:
        self._work_listeners: set[asyncio.Event] = set()
        self._subscriptions: defaultdict[str, set[JobSubscription]] = defaultdict(set)
        self._lifecycle_listeners: defaultdict[str, set[asyncio.Event]] = defaultdict(set)
        self._feeds: defaultdict[str, set[FeedSubscription]] = defaultdict(set)
        self._feed_owners: defaultdict[str, set[str]] = defaultdict(set)

    @contextmanager
    def watch_work(self, signal: asyncio.Event | None = None) -> Iterator[asyncio.Event]:
        """An event (`signal`, or a new one) set whenever new work may have become
        claimable."""
        signal = signal or asyncio.Event()
        self._work_listeners.add(signal)
        try:
            yield signal
        finally:
            self._work_listeners.discard(signal)

    @contextmanager
    def watch_job(self, job_id: str) -> Iterator[JobSubscription]:
        """A subscription to the events of `job_id` committed from now on."""
        subscription = JobSubscription()
        self._subscriptions[job_id].add(subscription)
        try:
            yield subscription
        finally:
            subscribers = self._subscriptions.get(job_id)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._subscriptions[job_id]

    @contextmanager
    def watch_feed(self, owner_id: str) -> Iterator[FeedSubscription]:
        """A subscription to the owner's feed: its events committed from now on."""
        subscription = FeedSubscription()
        key = feed_key(owner_id)
        self._feeds[owner_id].add(subscription)
        self._feed_owners[key].add(owner_id)
        try:
            yield subscription
        finally:
            subscribers = self._feeds.get(owner_id)
            if subscribers is not None:
                subscribers.discard(subscription)
                if not subscribers:
                    del self._feeds[owner_id]
                    owners = self._feed_owners[key]
                    owners.discard(owner_id)
                    if not owners:
                        del self._feed_owners[key]

    @contextmanager
    def watch_lifecycles(self, job_ids: Iterable[str], *signals: asyncio.Event) -> Iterator[None]:
        """Set every one of `signals` whenever one of these jobs may have
        changed state (a lifecycle event committed here, or any change another
        process announced): lighter than `watch_job`, which keeps the events."""
        watched = set(job_ids)
        for job_id in watched:
            self._lifecycle_listeners[job_id].update(signals)
        try:
            yield
        finally:
            for job_id in watched:
                listeners = self._lifecycle_listeners.get(job_id)
                if listeners is not None:
                    listeners.difference_update(signals)
                    if not listeners:
                        del self._lifecycle_listeners[job_id]

    def publish_work(self) -> None:
        for signal in self._work_listeners:
            signal.set()

    def publish_events(self, events: Iterable[FeedEvent]) -> None:
        """Committed events, numbered in their owners' feeds, in commit order."""
        feeds = self._feeds
        for numbered in events:
            event = numbered.event
            for subscription in self._subscriptions.get(event.job_id, ()):
                subscription._deliver(event)
            if feeds:
                for feed in feeds.get(numbered.subject.owner_id, ()):
                    feed._deliver(numbered)
            if event.type.startswith(LIFECYCLE_PREFIX):
                for signal in self._lifecycle_listeners.get(event.job_id, ()):
                    signal.set()

    def publish_job_changes(self, job_ids: Iterable[str]) -> None:
        """Another process committed events of these jobs: their subscribers
        read the log again."""
        for job_id in job_ids:
            for subscription in self._subscriptions.get(job_id, ()):
                subscription._mark_incomplete()
            for signal in self._lifecycle_listeners.get(job_id, ()):
                signal.set()

    def publish_feed_changes(self, keys: Iterable[str]) -> None:
        """Another process committed events to the feeds of owners with these
        keys (`feed_key`): their subscribers read the feed again."""
        for key in keys:
            for owner_id in self._feed_owners.get(key, ()):
                for feed in self._feeds.get(owner_id, ()):
                    feed._mark_incomplete()

    def interrupt_watchers(self) -> None:
        """Wake every subscriber without news, so that each looks at why it
        should stop (the server is draining)."""
        for subscribers in self._subscriptions.values():
            for subscription in subscribers:
                subscription._signal.set()
        for feeds in self._feeds.values():
            for feed in feeds:
                feed._signal.set()

    def publish_unknown_changes(self) -> None:
        """Someone else (another process on the same database) committed
        something: every listener looks at the database again."""
        self.publish_work()
        for subscribers in self._subscriptions.values():
            for subscription in subscribers:
                subscription._mark_incomplete()
        for feeds in self._feeds.values():
            for feed in feeds:
                feed._mark_incomplete()
        for listeners in self._lifecycle_listeners.values():
            for signal in listeners:
                signal.set()
