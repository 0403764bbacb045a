"""Riding out a storage blip inside a running attempt.

A busy database, a failed fsync or a full disk that is freed a moment later must
not cost a job an attempt: the attempt's writes (its events, its outcome) are
retried with backoff for as long as its lease can still be valid. Retrying is
safe because every such write is fenced by the lease token: once the lease is
gone the write is refused with LeaseLost, never applied twice to a later attempt.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import structlog

from leasehold._server.jobs.errors import StorageClosed, StorageFull, StorageUnavailable

T = TypeVar("T")

log = structlog.get_logger("leasehold.runtime")

FIRST_DELAY_SECONDS = 0.05
MAX_DELAY_SECONDS = 1.0


async def while_lease_holds(
    write: Callable[[], Awaitable[T]], lease_seconds: float, **log_fields: object
) -> T:
    """Run `write`, retrying transient storage errors for up to `lease_seconds`
    (the heartbeat renewed the lease at most a third of a lease ago, so the lease
    cannot outlive that). The last error is raised when the time is up, and at
    once when the storage is closing for shutdown."""
    give_up_at = time.monotonic() + lease_seconds
    delay = FIRST_DELAY_SECONDS
    while True:
        try:
            return await write()
        except (StorageUnavailable, StorageFull) as exc:
            if isinstance(exc, StorageClosed) or time.monotonic() + delay >= give_up_at:
                raise
            log.warning("job.write_retrying", **log_fields, error_class=type(exc).__name__)
        await asyncio.sleep(delay)
        delay = min(delay * 2, MAX_DELAY_SECONDS)
