"""What the overview shows, and the cache that keeps many viewers from
multiplying reads.

An admin's overview is AdminService.GetQueueStats, asked with the viewer's
own credential (so a revoked admin token stops working at once) and cached
here per credential for a second, with one call in flight per credential
however many pages ask at once; across credentials the service's own
one-second cache answers, so the database sees one read a second at most.
An owner has no AdminService: their overview counts every job of theirs
with JobService.GetStats (an index read, never a page of jobs), cached the
same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from google.protobuf import timestamp_pb2

from leasehold._server.dashboard.sessions import Credential
from leasehold.v1 import admin_pb2, jobs_pb2

T = TypeVar("T")
CACHE_SECONDS = 1.0
# The owner's oldest queued job is looked for among this many of their newest
# queued jobs (one List page): no RPC orders an owner's jobs by due time.
QUEUED_SAMPLE = 500


class PerCredentialCache(Generic[T]):
    """A value per credential, fresh for `seconds`, fetched once however many
    ask at the same time. Keys are hashes: no credential is kept here."""

    def __init__(
        self,
        seconds: float = CACHE_SECONDS,
        max_entries: int = 1_000,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._seconds = seconds
        self._monotonic = monotonic
        self._max_entries = max_entries
        self._entries: dict[str, tuple[float, asyncio.Task[T]]] = {}
        self.fetches = 0

    async def get(self, credential: Credential, fetch: Callable[[], Awaitable[T]]) -> T:
        key = _key(credential)
        now = self._monotonic()
        entry = self._entries.get(key)
        if entry is None or now - entry[0] > self._seconds or _failed(entry[1]):
            if len(self._entries) >= self._max_entries:
                self._entries.clear()
            self.fetches += 1
            entry = (now, asyncio.ensure_future(fetch()))
            self._entries[key] = entry
        return await asyncio.shield(entry[1])

    def forget(self, credential: Credential) -> None:
        self._entries.pop(_key(credential), None)


def _key(credential: Credential) -> str:
    return hashlib.sha256(f"{credential.kind}\0{credential.value}".encode()).hexdigest()


def _failed(task: asyncio.Task[T]) -> bool:
    return task.done() and (task.cancelled() or task.exception() is not None)


@dataclass(frozen=True)
class Bar:
    """One minute of the throughput chart, as SVG rectangles' geometry."""

    x: float
    label: str
    succeeded: tuple[float, float]  # (y, height)
    failed: tuple[float, float]
    cancelled: tuple[float, float]
    total: int


CHART_WIDTH = 600.0
CHART_HEIGHT = 120.0


def throughput_bars(minutes: list[admin_pb2.MinuteThroughput]) -> tuple[list[Bar], int]:
    """Stacked bars for the chart, scaled to the busiest minute; and that peak."""
    peak = max((m.succeeded + m.failed + m.cancelled for m in minutes), default=0)
    scale = CHART_HEIGHT / peak if peak else 0.0
    width = CHART_WIDTH / max(len(minutes), 1)
    bars = []
    for index, minute in enumerate(minutes):
        base = CHART_HEIGHT
        parts = []
        for count in (minute.succeeded, minute.failed, minute.cancelled):
            height = count * scale
            base -= height
            parts.append((round(base, 2), round(height, 2)))
        bars.append(
            Bar(
                x=round(index * width, 2),
                label=minute.minute.ToDatetime().strftime("%H:%M"),
                succeeded=parts[0],
                failed=parts[1],
                cancelled=parts[2],
                total=minute.succeeded + minute.failed + minute.cancelled,
            )
        )
    return bars, peak


@dataclass(frozen=True)
class OwnerSummary:
    """An owner's overview: every job of theirs counted by status and by kind
    (GetStats), and the queued job due soonest among the newest
    `queued_looked_at` queued ones (a List page, so the page can say when
    older queued jobs were not looked at)."""

    by_status: dict[str, int]
    by_kind: dict[str, dict[str, int]]
    kinds_truncated: bool
    computed_at: timestamp_pb2.Timestamp
    oldest_queued: jobs_pb2.Job | None
    queued_looked_at: int


def counts_by_status(counts: jobs_pb2.JobCounts) -> dict[str, int]:
    return {status: int(getattr(counts, status)) for status in STATUSES}


def owner_summary(stats: jobs_pb2.GetStatsResponse, queued: list[jobs_pb2.Job]) -> OwnerSummary:
    """The overview from GetStats, and from `queued` (a page of the owner's
    queued jobs) the one due soonest. A job waiting for its parents is due at
    no time yet (its available_at is unset) and is passed over."""
    due = [job for job in queued if job.HasField("available_at")]
    oldest = min(due, key=lambda job: job.available_at.ToDatetime(), default=None)
    return OwnerSummary(
        by_status=counts_by_status(stats.total),
        by_kind={kind.kind: counts_by_status(kind.counts) for kind in stats.kinds},
        kinds_truncated=stats.kinds_truncated,
        computed_at=stats.computed_at,
        oldest_queued=oldest,
        queued_looked_at=len(queued),
    )


def status_name(status: int) -> str:
    """`JOB_STATUS_RUNNING` → `running`."""
    return jobs_pb2.JobStatus.Name(status).removeprefix("JOB_STATUS_").lower()  # type: ignore[arg-type]


STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")


def status_value(name: str) -> jobs_pb2.JobStatus | None:
    """`running` → JOB_STATUS_RUNNING; None for anything else."""
    if name not in STATUSES:
        return None
    return jobs_pb2.JobStatus.Value(f"JOB_STATUS_{name.upper()}")
