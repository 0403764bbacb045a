"""The remote attempts this replica handed out, so that a drain can give them
the same grace as the attempts it runs itself.

A remote worker's lease is not this process's to hand back: the worker holds
it, and its writes are fenced by it wherever they land. What a drain owes it is
time: the listener stays open while the worker finishes, so its `Complete`
reaches a server rather than a closed port. The server learns an attempt ended
from the finishing write (here), from a heartbeat that finds the lease lost,
or from the lease running out unrenewed (the worker died, or writes to another
replica): whichever comes first. Nothing is read from the database for it, so
a drain never waits on a database that is itself going away.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from leasehold._server.clock import Clock


@dataclass(frozen=True)
class HeldLease:
    token: str
    expires_at: datetime


class RemoteAttempts:
    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._held: dict[str, HeldLease] = {}
        # Set whenever an attempt ends. A waiter clears it before it counts, so
        # an end between the count and the wait is never missed.
        self.change = asyncio.Event()

    def claimed(self, job_id: str, token: str, expires_at: datetime) -> None:
        self._held[job_id] = HeldLease(token, expires_at)

    def renewed(self, job_id: str, token: str, expires_at: datetime) -> None:
        """A heartbeat through this replica renewed the lease."""
        held = self._held.get(job_id)
        if held is not None and held.token == token:
            self._held[job_id] = HeldLease(token, expires_at)

    def ended(self, job_id: str, token: str) -> None:
        """The attempt wrote its outcome, or its lease is gone."""
        held = self._held.get(job_id)
        if held is not None and held.token == token:
            del self._held[job_id]
            self.change.set()

    def ended_all(self, leases: Iterable[tuple[str, str]]) -> None:
        for job_id, token in leases:
            self.ended(job_id, token)

    def running(self) -> int:
        """Attempts whose lease is still live as far as this replica knows."""
        now = self._clock.now()
        for job_id in [job_id for job_id, held in self._held.items() if held.expires_at <= now]:
            del self._held[job_id]
        return len(self._held)

    def seconds_to_next_expiry(self) -> float | None:
        """When the next lease runs out unrenewed, or None when none is held."""
        if not self._held:
            return None
        soonest = min(held.expires_at for held in self._held.values())
        return max(0.0, (soonest - self._clock.now()).total_seconds())
