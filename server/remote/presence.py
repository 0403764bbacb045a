"""Which kinds remote workers are asking for, as this replica sees them: what
Get's `no_worker` wait reason is decided from."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta

from leasehold._server.clock import Clock


class WorkerPresence:
    """A kind counts as asked for while a WorkerService Claim naming it waits,
    and for `window_seconds` after one ended (a worker asks again as soon as
    it has a free slot). A worker busy with jobs of the kind asks for nothing;
    `wait_reason` counts its running jobs instead."""

    def __init__(self, clock: Clock, window_seconds: float) -> None:
        self._clock = clock
        self._window = timedelta(seconds=window_seconds)
        self._waiting: dict[str, int] = {}
        self._last_asked: dict[str, datetime] = {}

    @contextmanager
    def claiming(self, kinds: Iterable[str]) -> Iterator[None]:
        """Around one Claim call."""
        names = sorted(set(kinds))
        for kind in names:
            self._waiting[kind] = self._waiting.get(kind, 0) + 1
        try:
            yield
        finally:
            now = self._clock.now()
            for kind in names:
                self._waiting[kind] -= 1
                if not self._waiting[kind]:
                    del self._waiting[kind]
                self._last_asked[kind] = now

    def asked_for(self, kind: str) -> bool:
        if kind in self._waiting:
            return True
        last = self._last_asked.get(kind)
        return last is not None and self._clock.now() - last <= self._window
