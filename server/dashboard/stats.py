"""What the overview shows, and the cache that keeps many viewers from
multiplying reads.

An admin's overview is AdminService.GetQueueStats, asked with the viewer's
own credential (so a revoked admin token stops working at once) and cached
here per credential for a second, with one call in flight per credential
however many pages ask at once; across credentials the service's own
one-second cache answers, so the database sees one read a second at most.
An owner has no AdminService: their overview counts their own most recent
jobs, from JobService.List, cached the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

from leasehold._server.dashboard.sessions import Credential
from leasehold.v1 import admin_pb2, jobs_pb2

T = TypeVar("T")
CACHE_SECONDS = 1.0
# The owner's overview reads one page of this many of their newest jobs.
OWNER_SAMPLE = 500


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
    """An owner's overview: counts over their newest jobs (at most
    OWNER_SAMPLE), and the oldest queued job among them."""

    by_status: dict[str, int]
    by_kind: dict[str, dict[str, int]]
    sampled: int
    complete: bool
    oldest_queued: jobs_pb2.Job | None


def owner_summary(jobs: list[jobs_pb2.Job], complete: bool) -> OwnerSummary:
    by_status: Counter[str] = Counter()
    by_kind: dict[str, Counter[str]] = {}
    oldest: jobs_pb2.Job | None = None
    for job in jobs:
        status = status_name(job.status)
        by_status[status] += 1
        by_kind.setdefault(job.kind, Counter())[status] += 1
        if job.status == jobs_pb2.JOB_STATUS_QUEUED and (
            oldest is None or job.available_at.ToDatetime() < oldest.available_at.ToDatetime()
        ):
            oldest = job
    return OwnerSummary(
        dict(by_status),
        {kind: dict(counts) for kind, counts in sorted(by_kind.items())},
        len(jobs),
        complete,
        oldest,
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
