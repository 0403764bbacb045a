"""What callers see while no writable database answers.

Health turns NOT_SERVING, so a load balancer moves callers to a replica that
can serve them; calls meanwhile get UNAVAILABLE from the storage itself. One log
line says the database was lost and one that it is back, however many writes
failed between. While it is lost, a probe writes nothing every so often (capped
backoff), so an idle replica finds the database back by itself, not on the
next caller's write.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from leasehold._server.jobs.reachability import Reachability
from leasehold._server.runtime.asyncio_helpers import cancel_and_wait

log = structlog.get_logger("leasehold.storage")

PROBE_FIRST_SECONDS = 0.25
PROBE_MOST_SECONDS = 2.0


class DatabaseWatch:
    def __init__(
        self,
        reachability: Reachability,
        ping: Callable[[], Awaitable[None]],
        set_serving: Callable[[bool], Awaitable[None]],
    ) -> None:
        """`ping` is one empty write (it succeeds only where a writable
        database commits it); `set_serving` turns health to SERVING or not."""
        self._reachability = reachability
        self._ping = ping
        self._set_serving = set_serving
        self._lost_at: float | None = None
        self._probe: asyncio.Task[None] | None = None
        self._health: asyncio.Task[None] | None = None
        reachability.watch(self._changed)

    def _changed(self, reachable: bool) -> None:
        if reachable:
            down = time.monotonic() - self._lost_at if self._lost_at is not None else 0.0
            self._lost_at = None
            log.info("storage.reachable", down_seconds=round(down, 3))
            if self._probe is not None:
                self._probe.cancel()
                self._probe = None
        else:
            self._lost_at = time.monotonic()
            log.warning(
                "storage.unreachable",
                message="no writable database answers: health is NOT_SERVING, and calls get "
                "UNAVAILABLE (retry them) until it does",
            )
            if self._probe is None:
                self._probe = asyncio.create_task(self._probing(), name="leasehold-database-probe")
        if self._health is None or self._health.done():
            self._health = asyncio.create_task(self._follow_health(), name="leasehold-database-health")

    async def _follow_health(self) -> None:
        """Health follows the latest state, however quickly it flips: each
        setting is applied in turn until the one applied is still the state."""
        while True:
            serving = self._reachability.reachable
            await self._set_serving(serving)
            if self._reachability.reachable == serving:
                return

    async def _probing(self) -> None:
        delay = PROBE_FIRST_SECONDS
        while True:
            await asyncio.sleep(delay)
            try:
                await self._ping()  # a success reports the database reached, which ends this task
            except Exception as exc:  # the writer reported it, and the log has the switch already
                log.debug("storage.probe_failed", error_class=type(exc).__name__)
            delay = min(delay * 2, PROBE_MOST_SECONDS)

    async def stop(self) -> None:
        for task in (self._probe, self._health):
            if task is not None:
                await cancel_and_wait(task)
