"""A repeating maintenance task that never dies of an error: the base of the
rescuer, the schedule timer and the retention sweeper.

Each round's storage errors are logged and the next round tries again, which is
the right answer to a database that is briefly away or full; a bug is logged
with its traceback and does not stop later rounds either.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod

import structlog

from leasehold._server.jobs.errors import StorageFull, StorageUnavailable
from leasehold._server.runtime.asyncio_helpers import cancel_and_wait

log = structlog.get_logger("leasehold.runtime")


class Maintenance(ABC):
    """Runs `round()` at start, then again after the delay each round returns,
    or sooner when `wake()` is called."""

    name = "maintenance"

    def __init__(self) -> None:
        self._task: asyncio.Task[None] | None = None
        self._woken = asyncio.Event()

    @abstractmethod
    async def round(self) -> float:
        """One round; returns the seconds to wait before the next."""

    def wake(self) -> None:
        """Start the next round now (something it looks at has changed)."""
        self._woken.set()

    async def start(self) -> None:
        """Start the timer. Calling it again while running does nothing."""
        if self._task is not None and not self._task.done():
            return
        self._task = asyncio.create_task(self._loop(), name=f"leasehold-{self.name}")

    async def stop(self) -> None:
        """Stop, even in the middle of a round: the storage writer commits that
        round's write or not on its own, so there is nothing to wait for."""
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)

    async def _loop(self) -> None:
        while True:
            self._woken.clear()
            delay = await self._round_logging_errors()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), timeout=max(delay, 0.0))

    async def _round_logging_errors(self) -> float:
        try:
            return await self.round()
        except (StorageUnavailable, StorageFull) as exc:
            log.warning(f"runtime.{self.name}_failed", error=str(exc))
        except Exception as exc:
            log.error(f"runtime.{self.name}_failed", error_class=type(exc).__name__, exc_info=exc)
        return self.retry_seconds

    # How long to wait after a failed round.
    retry_seconds = 5.0
