"""One database read shared by every caller within a short interval.

Many dashboards polling GetQueueStats once a second each must cost the
database one read a second per replica, not one per dashboard: a caller finds
the last answer if it is younger than the interval, and callers that arrive
while a read is under way wait for that read instead of starting their own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Generic, TypeVar

from leasehold._server.clock import Clock

T = TypeVar("T")

# About a second: fresh enough for a page that refreshes every few seconds.
STATS_CACHE_SECONDS = 1.0


class CachedRead(Generic[T]):
    def __init__(self, read: Callable[[], Awaitable[T]], clock: Clock, interval_seconds: float) -> None:
        self._read = read
        self._clock = clock
        self._interval = interval_seconds
        self._lock = asyncio.Lock()
        self._value: T | None = None
        self._read_at: datetime | None = None
        self.reads = 0  # how many times the database was asked (for tests and metrics)

    def _fresh(self) -> bool:
        if self._read_at is None:
            return False
        age = (self._clock.now() - self._read_at).total_seconds()
        return 0 <= age < self._interval  # a clock stepped back reads again

    async def get(self) -> T:
        if self._fresh():
            assert self._value is not None
            return self._value
        async with self._lock:
            if not self._fresh():  # another caller may have read while this one waited
                value = await self._read()
                self._value, self._read_at = value, self._clock.now()
                self.reads += 1
            assert self._value is not None
            return self._value
