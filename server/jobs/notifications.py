"""In-process announcements of committed changes.

Storage engines call `publish_*` only after a commit, so whoever wakes up reads
data that is already durable. Listeners are plain `asyncio.Event`s: setting an
event twice is harmless, and a waiter that cleared its event before reading can
never miss a change committed after that read.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager


class ChangeHub:
    def __init__(self) -> None:
        self._work_listeners: set[asyncio.Event] = set()
        self._event_listeners: defaultdict[str, set[asyncio.Event]] = defaultdict(set)

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
    def watch_job(self, job_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever `job_id` gets new events."""
        signal = asyncio.Event()
        self._event_listeners[job_id].add(signal)
        try:
            yield signal
        finally:
            listeners = self._event_listeners.get(job_id)
            if listeners is not None:
                listeners.discard(signal)
                if not listeners:
                    del self._event_listeners[job_id]

    def publish_work(self) -> None:
        for signal in self._work_listeners:
            signal.set()

    def publish_events(self, job_ids: Iterable[str]) -> None:
        for job_id in job_ids:
            for signal in self._event_listeners.get(job_id, ()):
                signal.set()
