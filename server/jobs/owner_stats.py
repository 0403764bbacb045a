"""An owner's overview (JobService.GetStats, DESIGN §19): how many of the
owner's jobs stand in each status, in all and per kind.

Every job the owner has counts, not a page of the newest: an engine answers
from its (owner, kind, status) index, and this module turns what it counted
into the record, in one place for every engine. Only the first `KIND_LIMIT`
kinds are listed, so an owner with a great many kinds gets a bounded answer;
the totals still count every kind.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from leasehold._server.jobs.records import JobStatus

# Kinds listed at most; `OwnerStats.kinds_truncated` says when there were more.
KIND_LIMIT = 1000
# Rows of (kind, status) counts an engine needs at most to list KIND_LIMIT
# kinds and to know whether there is one more: each kind has at most one row
# per status, so the first KIND_LIMIT kinds fill at most this many less one.
KIND_ROWS = KIND_LIMIT * len(JobStatus) + 1


@dataclass(frozen=True, slots=True)
class JobCounts:
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    cancelled: int = 0


@dataclass(frozen=True, slots=True)
class OwnerStats:
    total: JobCounts
    # (kind, its counts), ordered by kind; at most KIND_LIMIT of them.
    kinds: list[tuple[str, JobCounts]]
    kinds_truncated: bool
    computed_at: datetime


def counts_of(by_status: Counter[JobStatus]) -> JobCounts:
    return JobCounts(**{status.value: by_status[status] for status in JobStatus})


def assemble(
    now: datetime,
    *,
    by_status: Iterable[tuple[JobStatus, int]] | None,
    by_kind: Iterable[tuple[str, JobStatus, int]],
) -> OwnerStats:
    """The overview from what an engine counted: per (kind, status) at least
    the rows of the first KIND_LIMIT kinds in kind order and one more row if
    there are more kinds (`KIND_ROWS` of them ordered by kind suffice; more
    does no harm), and the owner's jobs per status, every job counted. An
    engine that read every kind's rows may pass `by_status` None: the totals
    are then their sum, from the same read."""
    per_kind: dict[str, Counter[JobStatus]] = defaultdict(Counter)
    summed: Counter[JobStatus] = Counter()
    for kind, status, jobs in by_kind:
        per_kind[kind][status] += jobs
        summed[status] += jobs
    total: Counter[JobStatus] = summed if by_status is None else Counter()
    for status, jobs in by_status or ():
        total[status] += jobs
    kinds = sorted(per_kind)
    return OwnerStats(
        total=counts_of(total),
        kinds=[(kind, counts_of(per_kind[kind])) for kind in kinds[:KIND_LIMIT]],
        kinds_truncated=len(kinds) > KIND_LIMIT,
        computed_at=now,
    )
