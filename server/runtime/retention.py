"""Retention (`serve --retention`): finished jobs older than the retention are
deleted with their events, in small batches, on every replica.

A batch is one short transaction of at most `RETENTION_BATCH` jobs. After each,
the sweeper waits as long as the batch took, so deleting never takes more than
half of the writer's time: claims and enqueues queue behind one small batch at
most, however large the backlog. Replicas sweeping at once take different rows
on PostgreSQL (SKIP LOCKED) and serialize on SQLite, and a row is deleted once.
"""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import structlog

from leasehold._server.clock import Clock
from leasehold._server.jobs.repository import JobRepository
from leasehold._server.runtime.maintenance import Maintenance

log = structlog.get_logger("leasehold.runtime")

RETENTION_BATCH = 200
# How often a sweep starts (DESIGN §12: at least once a minute).
RETENTION_INTERVAL_SECONDS = 60.0


class RetentionSweeper(Maintenance):
    name = "retention"

    def __init__(
        self,
        repository: JobRepository,
        clock: Clock,
        retention_seconds: float,
        batch: int = RETENTION_BATCH,
        interval_seconds: float = RETENTION_INTERVAL_SECONDS,
    ) -> None:
        if not retention_seconds > 0:
            raise ValueError("retention_seconds: must be more than 0 (0 keeps everything: run no sweeper)")
        super().__init__()
        self._repository = repository
        self._clock = clock
        self._retention = timedelta(seconds=retention_seconds)
        self._batch = batch
        self._interval = interval_seconds

    async def round(self) -> float:
        await self.sweep()
        return self._interval

    async def sweep(self) -> int:
        """Delete every job expired now, batch by batch; returns how many."""
        cutoff = self._clock.now() - self._retention
        total = 0
        while True:
            started = time.monotonic()
            deleted = await self._repository.delete_expired(cutoff, self._batch)
            total += deleted
            if deleted < self._batch:
                break
            await asyncio.sleep(time.monotonic() - started)
        if total:
            log.info("retention.deleted", jobs=total, finished_before=cutoff.isoformat())
        return total
