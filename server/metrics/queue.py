"""Queue depth and oldest-queued age, read from the database when scraped.

The database is the truth across replicas, so each replica reports the whole
queue (take max, not sum, across replicas). A scrape arrives on the HTTP
server's thread; the read runs on the app's event loop. It is made at most once
per `QUEUE_READ_INTERVAL_SECONDS`, however many scrapers ask: a lock makes
concurrent scrapes wait for one read and share it. The age is counted from the
cached oldest due time at each scrape, so it keeps growing between reads.
Kinds are labelled as every other instrument labels them (`KindLabels`): the
kinds folded into `other` are summed (depth) and their oldest taken (age).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator
from datetime import datetime

import structlog
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from leasehold._server.clock import Clock
from leasehold._server.jobs.records import QueuedKind
from leasehold._server.metrics.kind_labels import KindLabels

log = structlog.get_logger("leasehold.metrics")

# Shorter than any sensible scrape interval (Prometheus defaults to 15 s to
# 1 min), so one scraper sees fresh numbers while many cost one query.
QUEUE_READ_INTERVAL_SECONDS = 5.0
# A scrape must not hang on a database that does not answer.
QUEUE_READ_TIMEOUT_SECONDS = 5.0

DEPTH = "leasehold_queue_depth"
OLDEST = "leasehold_oldest_queued_seconds"
DEPTH_HELP = "Queued jobs whose time has come, waiting for a worker (whole database)."
OLDEST_HELP = "How long the oldest due queued job has waited since it fell due (whole database)."


class QueueCollector(Collector):
    """The two queue gauges, from a cached read of `read()`."""

    def __init__(
        self,
        read: Callable[[], Awaitable[list[QueuedKind]]],
        loop: asyncio.AbstractEventLoop,
        clock: Clock,
        interval_seconds: float = QUEUE_READ_INTERVAL_SECONDS,
        kind_label: KindLabels | None = None,
    ) -> None:
        self._read = read
        self._kind_label = kind_label or KindLabels()
        self._loop = loop
        self._clock = clock
        self._interval = interval_seconds
        self._lock = threading.Lock()
        self._kinds: list[QueuedKind] | None = None
        self._read_at: datetime | None = None

    def describe(self) -> list[GaugeMetricFamily]:
        # Without this, registering would call collect() (and read the database).
        return [
            GaugeMetricFamily(DEPTH, DEPTH_HELP, labels=["kind"]),
            GaugeMetricFamily(OLDEST, OLDEST_HELP, labels=["kind"]),
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        kinds, now = self._current()
        depth = GaugeMetricFamily(DEPTH, DEPTH_HELP, labels=["kind"])
        oldest = GaugeMetricFamily(OLDEST, OLDEST_HELP, labels=["kind"])
        for label, (jobs, oldest_due_at) in fold(kinds or (), self._kind_label).items():
            depth.add_metric([label], jobs)
            oldest.add_metric([label], max(0.0, (now - oldest_due_at).total_seconds()))
        yield depth
        yield oldest

    def _current(self) -> tuple[list[QueuedKind] | None, datetime]:
        with self._lock:
            now = self._clock.now()
            fresh = self._read_at is not None and 0 <= (now - self._read_at).total_seconds() < self._interval
            if not fresh:
                # Stamped even when the read fails: a database that is away is
                # asked again after the interval, not by every scrape.
                self._read_at = now
                self._kinds = self._read_now()
            return self._kinds, now

    def _read_now(self) -> list[QueuedKind] | None:
        """The read on the app's loop; None (the gauges left out) when it fails,
        since a scrape that errors would hide every other metric too."""
        future = asyncio.run_coroutine_threadsafe(_call(self._read), self._loop)
        try:
            return future.result(QUEUE_READ_TIMEOUT_SECONDS)
        except Exception as exc:
            future.cancel()
            log.warning("metrics.queue_read_failed", error_class=type(exc).__name__, error=str(exc))
            return None


def fold(kinds: Iterable[QueuedKind], kind_label: KindLabels) -> dict[str, tuple[int, datetime]]:
    """Per label value: the queued jobs of its kinds and the oldest due time
    among them."""
    folded: dict[str, tuple[int, datetime]] = {}
    for queued in kinds:
        label = kind_label(queued.kind)
        jobs, oldest = folded.get(label, (0, queued.oldest_due_at))
        folded[label] = (jobs + queued.depth, min(oldest, queued.oldest_due_at))
    return folded


async def _call(read: Callable[[], Awaitable[list[QueuedKind]]]) -> list[QueuedKind]:
    return await read()
