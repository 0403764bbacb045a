"""Open WatchEvents and Subscribe streams: counted against their limits, and ended when the
server drains.

A stream holds a slot from the moment it is accepted until it ends in any way
(its job's terminal event, the client going away, an error, the drain), so a
refused caller can try again as soon as one of its streams closes. The counts
live in this process only: a limit protects this server's memory and file
descriptors, which is what a stream costs.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from leasehold._server.jobs.errors import LimitExceeded, ServerDraining
from leasehold._server.jobs.watch import RESUME_WATCH

DEFAULT_MAX_WATCH_STREAMS = 10_000
DEFAULT_MAX_WATCH_STREAMS_PER_OWNER = 1_000


@dataclass(frozen=True)
class WatchLimits:
    max_streams: int = DEFAULT_MAX_WATCH_STREAMS
    max_streams_per_owner: int = DEFAULT_MAX_WATCH_STREAMS_PER_OWNER

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError("max_watch_streams: must be at least 1")
        if self.max_streams_per_owner < 1:
            raise ValueError("max_watch_streams_per_owner: must be at least 1")


class WatchStreams:
    def __init__(self, limits: WatchLimits | None = None) -> None:
        self._limits = limits or WatchLimits()
        self._by_owner: Counter[str] = Counter()
        self._open = 0
        self._draining = False

    @property
    def open(self) -> int:
        return self._open

    def draining(self) -> bool:
        """Whether streams must end now (passed to follow_events as its check)."""
        return self._draining

    def drain(self) -> None:
        """Refuse new streams; open ones end once woken (ChangeHub.interrupt_watchers)."""
        self._draining = True

    @contextmanager
    def slot(self, owner_id: str) -> Iterator[None]:
        """One stream's place, held while the stream is open. Raises ServerDraining
        or LimitExceeded instead of opening it."""
        if self._draining:
            raise ServerDraining(RESUME_WATCH)
        limits = self._limits
        if self._open >= limits.max_streams:
            raise LimitExceeded(
                "max-watch-streams", limits.max_streams, "WatchEvents and Subscribe streams: this server"
            )
        if self._by_owner[owner_id] >= limits.max_streams_per_owner:
            raise LimitExceeded(
                "max-watch-streams-per-owner",
                limits.max_streams_per_owner,
                "WatchEvents and Subscribe streams: the caller",
            )
        self._open += 1
        self._by_owner[owner_id] += 1
        try:
            yield
        finally:
            self._open -= 1
            self._by_owner[owner_id] -= 1
            if not self._by_owner[owner_id]:
                del self._by_owner[owner_id]
