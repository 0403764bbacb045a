"""Retention (`serve --retention`): finished jobs older than the retention are
deleted with their events, in small batches, on every replica.

A batch is one short transaction of at most `RETENTION_BATCH` jobs. After each,
the sweeper rests long enough that deleting takes at most `RETENTION_SHARE` of
the time, so a claim or an enqueue rarely meets a batch, and one that does
waits behind one small batch at most, however large the backlog. The rest is
measured from the batch as the sweeper saw it, queueing and commit included: a
busy writer (or a checkpoint the batch's pages brought on) slows the sweep down
with it. Replicas sweeping at once take different rows on PostgreSQL (SKIP
LOCKED) and serialize on SQLite, and a row is deleted once.
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
# The share of the time a sweep spends deleting while it has a backlog. A claim's
# p99 stays near its idle value only while fewer than one claim in a hundred
# meets a batch; at a tenth, claims back to back on SQLite meet one in about 110
# (the `retention` benchmark). Half, the first choice, made it one in nine.
RETENTION_SHARE = 0.1
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
            await asyncio.sleep(rest_after(time.monotonic() - started))
        if total:
            log.info("retention.deleted", jobs=total, finished_before=cutoff.isoformat())
        return total


def rest_after(took: float, share: float = RETENTION_SHARE) -> float:
    """How long to rest after a batch that took `took` seconds, so that deleting
    takes `share` of the time."""
    return took * (1 - share) / share
