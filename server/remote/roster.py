"""Which remote workers there are (AdminService.ListWorkers), as this replica
sees them, merged with what the database says about the leases they hold.

A WorkerService Claim names its worker and kinds; nothing else a worker sends
does (a Heartbeat names only leases). So each replica keeps a small roster of
the workers whose Claims it served: their kinds, when they last asked, and
whether a Claim of theirs waits now. A worker not seen here within one lease
is forgotten (a worker asks again as soon as it has a free slot, and a busy one
shows through its leases instead). Which jobs a worker holds, and when it last
renewed a lease, come from the database, so a worker that claims on another
replica still appears through its leases.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta

from leasehold._server.clock import Clock
from leasehold._server.jobs.admin import LeaseHolder
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.jobs.routing import KindPatterns

# Workers one ListWorkers answer lists at most, and the roster keeps at most:
# past it, the worker seen longest ago makes room (a waiting one never does).
WORKER_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class RemoteWorker:
    worker_id: str
    kinds: tuple[str, ...]
    jobs_held: int
    # Its last lease renewal when it holds jobs, else its last Claim here.
    last_seen_at: datetime | None
    claiming: bool


@dataclass(frozen=True, slots=True)
class WorkerList:
    workers: list[RemoteWorker]
    truncated: bool


@dataclass(slots=True)
class _Entry:
    kinds: tuple[str, ...]
    last_seen_at: datetime
    waiting: int = 0


class WorkerRoster:
    """The workers whose Claims this replica served within one lease
    (`lease_seconds`, the server's)."""

    def __init__(self, clock: Clock, lease_seconds: float, limit: int = WORKER_LIMIT) -> None:
        self._clock = clock
        self._window = timedelta(seconds=lease_seconds)
        self._limit = limit
        self._entries: dict[str, _Entry] = {}

    @contextmanager
    def claiming(self, worker_id: str, kinds: Iterable[str]) -> Iterator[None]:
        """Around one Claim call: the worker is seen when it asks and again
        when its Claim ends, and counts as claiming in between."""
        entry = self._seen(worker_id, tuple(sorted(set(kinds))))
        entry.waiting += 1
        try:
            yield
        finally:
            entry.waiting -= 1
            entry.last_seen_at = self._clock.now()

    def _seen(self, worker_id: str, kinds: tuple[str, ...]) -> _Entry:
        self._forget_stale()
        entry = self._entries.pop(worker_id, None)  # re-inserted: the dict stays in order last seen
        if entry is None:
            entry = _Entry(kinds, self._clock.now())
            self._make_room()
        entry.kinds, entry.last_seen_at = kinds, self._clock.now()
        self._entries[worker_id] = entry
        return entry

    def _make_room(self) -> None:
        while len(self._entries) >= self._limit:
            idle = next((worker for worker, entry in self._entries.items() if not entry.waiting), None)
            if idle is None:
                return  # every one waits now: none is stale
            del self._entries[idle]

    def _forget_stale(self) -> None:
        now = self._clock.now()
        stale = [
            worker
            for worker, entry in self._entries.items()
            if not entry.waiting and now - entry.last_seen_at > self._window
        ]
        for worker in stale:
            del self._entries[worker]

    def worker_ids(self) -> list[str]:
        self._forget_stale()
        return sorted(self._entries)

    async def workers(self, repository: JobRepository, remote_kinds: KindPatterns) -> WorkerList:
        """The roster merged with the leases remote workers hold on any replica,
        ordered by worker id, at most WORKER_LIMIT of them."""
        holders = await repository.lease_holders(remote_kinds, self.worker_ids())
        self._forget_stale()
        return merge(dict(self._entries), holders, self._window, self._limit)


def merge(
    roster: dict[str, _Entry], holders: Iterable[LeaseHolder], lease: timedelta, limit: int
) -> WorkerList:
    """One worker per id from the roster and the lease holders. A heartbeat
    renews a lease to one lease length from then, so the latest expiry less a
    lease is the worker's last renewal."""
    held = {holder.worker_id: holder for holder in holders}
    names = sorted(set(roster) | set(held))
    workers = []
    for worker_id in names[:limit]:
        entry, holder = roster.get(worker_id), held.get(worker_id)
        if holder is not None:
            last_seen: datetime | None = holder.latest_lease_expires_at - lease
        else:
            last_seen = entry.last_seen_at if entry is not None else None
        workers.append(
            RemoteWorker(
                worker_id=worker_id,
                kinds=entry.kinds if entry is not None else holder.kinds if holder is not None else (),
                jobs_held=holder.jobs_held if holder is not None else 0,
                last_seen_at=last_seen,
                claiming=entry is not None and entry.waiting > 0,
            )
        )
    return WorkerList(workers, truncated=len(names) > limit)
