"""The operator's records (AdminService, DESIGN §14): what the queue looks like
across every owner, which jobs a bulk action selects, and how a bulk action
walks them.

A bulk action never runs as one transaction: it takes `BULK_BATCH` matching
jobs at a time, newest first, each batch one short write that changes every
job through the state machine exactly as Cancel or Retry would. Walking from
the newest down means jobs enqueued while it runs (a retry's new jobs among
them) are never picked up, so it ends, however busy the queue.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter, defaultdict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from leasehold._server.jobs.records import Job, JobFilter, JobStatus

# Jobs per transaction of a bulk action: short enough that a claim waiting for
# one (on SQLite, for the file's one write lock) waits a few milliseconds.
BULK_BATCH = 250
# The share of the time a bulk action spends in its batches; it rests the rest
# (`runtime.retention.rest_after`, as a retention sweep rests), so the claims
# of the replica serving it keep most of the process and the database.
BULK_SHARE = 0.25

# GetQueueStats counts the jobs finished in this many minutes, one bucket a minute.
STATS_MINUTES = 60
# Rows GetQueueStats lists at most, of kinds and of owners with running jobs.
# Kinds and owner ids are callers' to invent; capped, the answer stays a few
# hundred kilobytes at most (a kind row is under 200 bytes, an owner row under
# 150), far below the 4 MiB a gRPC client accepts by default.
STATS_KIND_LIMIT = 1000
STATS_OWNER_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class AdminFilter:
    """`JobFilter` across owners: empty `owner_id` matches every owner."""

    jobs: JobFilter = field(default_factory=JobFilter)
    owner_id: str = ""

    @property
    def matches_every_owner_everything(self) -> bool:
        """Names no kind, owner or resource: only statuses, which every owner's
        jobs have. A bulk action with such a filter must be confirmed."""
        jobs = self.jobs
        return not (jobs.kind or jobs.resource_type or jobs.resource_id or self.owner_id)


@dataclass(frozen=True, slots=True)
class KindStats:
    kind: str
    queued: int = 0
    running: int = 0
    succeeded_last_hour: int = 0
    failed_last_hour: int = 0
    cancelled_last_hour: int = 0
    oldest_queued_due_at: datetime | None = None
    paused: bool = False


@dataclass(frozen=True, slots=True)
class MinuteCount:
    """Jobs that finished within one minute, by outcome."""

    minute: datetime
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True)
class QueueStats:
    kinds: list[KindStats]
    # (owner, running jobs), most first.
    running_by_owner: list[tuple[str, int]]
    # STATS_MINUTES of them, oldest first; the last is the current minute.
    finished_per_minute: list[MinuteCount]
    oldest_queued_due_at: datetime | None
    oldest_queued_job_id: str | None
    computed_at: datetime
    # Whether kinds or running_by_owner left some out (`STATS_KIND_LIMIT`,
    # `STATS_OWNER_LIMIT`); finished_per_minute and the oldest job still count all.
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """A worker that holds live leases (ListWorkers): the kinds of the running
    jobs it holds, how many, and the latest expiry among their leases, which
    is when it last renewed one plus the lease length."""

    worker_id: str
    kinds: tuple[str, ...]
    jobs_held: int
    latest_lease_expires_at: datetime


def lease_holders(rows: Iterable[tuple[str, str, int, datetime]]) -> list[LeaseHolder]:
    """Holders ordered by worker id, from counts of live leases per (worker,
    kind) with each group's latest expiry, as an engine groups them."""
    kinds: dict[str, set[str]] = defaultdict(set)
    held: Counter[str] = Counter()
    latest: dict[str, datetime] = {}
    for worker_id, kind, jobs, expires_at in rows:
        kinds[worker_id].add(kind)
        held[worker_id] += jobs
        latest[worker_id] = max(latest.get(worker_id, expires_at), expires_at)
    return [
        LeaseHolder(worker_id, tuple(sorted(kinds[worker_id])), held[worker_id], latest[worker_id])
        for worker_id in sorted(held)
    ]


@dataclass(frozen=True, slots=True)
class BulkBatch:
    """One transaction of a bulk action: how many jobs it matched, the jobs it
    changed or made (for the metrics), and where the next batch starts: below
    this place in the engine's insertion order (None: this batch found no job,
    and the walk is over)."""

    matched: int
    changed: list[Job]
    next_position: int | None


def with_statuses(job_filter: AdminFilter, statuses: frozenset[JobStatus]) -> AdminFilter:
    return replace(job_filter, jobs=replace(job_filter.jobs, statuses=statuses))


def minute_of(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0)


def minutes_ending_at(now: datetime) -> list[datetime]:
    """The starts of the STATS_MINUTES minutes up to and including `now`'s."""
    last = minute_of(now)
    return [last - timedelta(minutes=back) for back in range(STATS_MINUTES - 1, -1, -1)]


def stats_since(now: datetime) -> datetime:
    """Where the stats' window of finished jobs begins: the first of its minutes."""
    return minutes_ending_at(now)[0]


def per_minute(now: datetime, counts: Mapping[tuple[datetime, JobStatus], int]) -> list[MinuteCount]:
    """Every minute of the window, empty ones included, from counts keyed by
    (minute start, outcome)."""
    return [
        MinuteCount(
            minute,
            succeeded=counts.get((minute, JobStatus.SUCCEEDED), 0),
            failed=counts.get((minute, JobStatus.FAILED), 0),
            cancelled=counts.get((minute, JobStatus.CANCELLED), 0),
        )
        for minute in minutes_ending_at(now)
    ]


def assemble_stats(
    now: datetime,
    *,
    live: Iterable[tuple[str, JobStatus, int]],
    running_by_owner: Iterable[tuple[str, int]],
    oldest_due_by_kind: Mapping[str, datetime],
    finished: Iterable[tuple[str, JobStatus, datetime, int]],
    oldest: tuple[str, datetime] | None,
    paused: set[str],
) -> QueueStats:
    """The stats from what an engine counted: queued and running jobs per
    (kind, status), running per owner, each kind's oldest due queued job,
    finished jobs per (kind, outcome, minute) since `stats_since(now)`, the
    oldest due queued job, and the paused kinds."""
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for kind, status, jobs in live:
        counts[kind][status.value] += jobs
    by_minute: Counter[tuple[datetime, JobStatus]] = Counter()
    for kind, status, minute, jobs in finished:
        counts[kind][f"{status.value}_last_hour"] += jobs
        by_minute[(minute, status)] += jobs
    every_kind = [
        KindStats(
            kind,
            queued=counts[kind]["queued"],
            running=counts[kind]["running"],
            succeeded_last_hour=counts[kind]["succeeded_last_hour"],
            failed_last_hour=counts[kind]["failed_last_hour"],
            cancelled_last_hour=counts[kind]["cancelled_last_hour"],
            oldest_queued_due_at=oldest_due_by_kind.get(kind),
            paused=kind in paused,
        )
        for kind in sorted(set(counts) | paused)
    ]
    kinds = busiest_kinds(every_kind, STATS_KIND_LIMIT)
    owners = sorted(
        ((owner, jobs) for owner, jobs in running_by_owner if jobs), key=lambda pair: (-pair[1], pair[0])
    )
    return QueueStats(
        kinds=kinds,
        running_by_owner=owners[:STATS_OWNER_LIMIT],
        truncated=len(kinds) < len(every_kind) or len(owners) > STATS_OWNER_LIMIT,
        finished_per_minute=per_minute(now, by_minute),
        oldest_queued_due_at=oldest[1] if oldest else None,
        oldest_queued_job_id=oldest[0] if oldest else None,
        computed_at=now,
    )


def busiest_kinds(kinds: list[KindStats], limit: int) -> list[KindStats]:
    """At most `limit` of `kinds` (ordered by kind), still ordered by kind:
    those an operator most needs to see, when there are more. Paused kinds
    first (someone acted on them), then the most queued and running, then the
    most finished within the hour, then by kind."""
    if len(kinds) <= limit:
        return kinds

    def weight(kind: KindStats) -> tuple[bool, int, int, str]:
        finished = kind.succeeded_last_hour + kind.failed_last_hour + kind.cancelled_last_hour
        return (not kind.paused, -(kind.queued + kind.running), -finished, kind.kind)

    return sorted(sorted(kinds, key=weight)[:limit], key=lambda kind: kind.kind)


BatchStep = Callable[[int | None], Awaitable[BulkBatch]]


async def walk(
    step: BatchStep, rest_after: Callable[[float], float] | None = None, below: int | None = None
) -> int:
    """Run `step` batch after batch, the first below `below` (None: every
    job), each next one below where the last ended, until the walk is over;
    returns the jobs matched. `rest_after(took)`: how long to rest after a
    batch that took `took` seconds (None: not at all)."""
    matched = 0
    position = below
    while True:
        started = time.monotonic()
        batch = await step(position)
        matched += batch.matched
        if batch.next_position is None:
            return matched
        position = batch.next_position
        if rest_after is not None:
            await asyncio.sleep(rest_after(time.monotonic() - started))
