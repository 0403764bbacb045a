"""Retention (`serve --retention`): finished jobs older than the retention are
deleted with their events, in small batches, on every replica. The same loop
forgets request ids (`idempotency`) once their window has passed, whether or
not a retention is set: it runs on every server, and `--retention 0` only
keeps the jobs.

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
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta

import structlog

from leasehold._server.clock import Clock
from leasehold._server.jobs.idempotency import REQUEST_ID_WINDOW
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
        """`retention_seconds`: 0 keeps every job (request ids are still forgotten)."""
        if not retention_seconds >= 0:  # also refuses NaN
            raise ValueError("retention_seconds: must not be negative (0 keeps every job)")
        super().__init__()
        self._repository = repository
        self._clock = clock
        self._retention = timedelta(seconds=retention_seconds) if retention_seconds else None
        self._batch = batch
        self._interval = interval_seconds

    async def round(self) -> float:
        await self.forget_request_ids()
        await self.sweep()
        return self._interval

    async def sweep(self) -> int:
        """Delete every job expired now, batch by batch; returns how many (none
        without a retention)."""
        if self._retention is None:
            return 0
        cutoff = self._clock.now() - self._retention
        total = await self._in_batches(self._repository.delete_expired, cutoff)
        if total:
            log.info("retention.deleted", jobs=total, finished_before=cutoff.isoformat())
        return total

    async def forget_request_ids(self) -> int:
        """Forget every request id older than its window; returns how many. A
        repeat of a forgotten id acts again, as a new call."""
        cutoff = self._clock.now() - REQUEST_ID_WINDOW
        total = await self._in_batches(self._repository.forget_request_ids, cutoff)
        if total:
            log.info("retention.request_ids_forgotten", request_ids=total, made_before=cutoff.isoformat())
        return total

    async def _in_batches(self, delete: Callable[[datetime, int], Awaitable[int]], cutoff: datetime) -> int:
        total = 0
        while True:
            started = time.monotonic()
            deleted = await delete(cutoff, self._batch)
            total += deleted
            if deleted < self._batch:
                return total
            await asyncio.sleep(rest_after(time.monotonic() - started))


def rest_after(took: float, share: float = RETENTION_SHARE) -> float:
    """How long to rest after a batch that took `took` seconds, so that deleting
    takes `share` of the time."""
    return took * (1 - share) / share
