"""The runtime's asyncio plumbing, shared by its roles: cancelling a task without
swallowing a cancel aimed at the caller, the threads sync handlers run in, and the
monitor that notices a handler blocking the event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
from collections.abc import Callable
from typing import Any, TypeVar

import structlog

T = TypeVar("T")

log = structlog.get_logger("leasehold.runtime")


async def cancel_and_wait(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait for it to end, without swallowing a cancel aimed at
    the caller itself."""
    current = asyncio.current_task()
    cancels_before = current.cancelling() if current is not None else 0
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        if current is not None and current.cancelling() > cancels_before:
            raise


# Threads for sync handlers: made as needed, so at most as many as ran at once.
DEFAULT_MAX_THREADS = 256
# An event loop this late for its own timer is blocked (by a handler that computes
# without awaiting, most likely), and every RPC and watch stream of the process waits.
LOOP_BLOCKED_SECONDS = 0.25
# How often the monitor looks, while attempts run; and how often it may warn.
LOOP_CHECK_SECONDS = 0.1
LOOP_WARN_EVERY_SECONDS = 10.0


class SyncHandlerThreads:
    """Where sync handlers run: a pool of worker threads, made on first use.

    A pool of its own rather than the loop's default executor, which is sized to
    the machine (a few threads on two cores) and would queue handlers behind one
    another while the runtime's slots are free. Threads are created only as
    handlers need them; a slot runs one handler at a time, so the pool holds at
    most as many busy threads as there are slots, plus those still finishing a
    handler whose attempt already ended (a thread cannot be stopped)."""

    def __init__(self, max_threads: int) -> None:
        self._max_threads = max_threads
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def run(self, function: Callable[[Any], T], argument: Any) -> T:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(
                self._max_threads, thread_name_prefix="leasehold-handler"
            )
        call = contextvars.copy_context().run
        return await asyncio.get_running_loop().run_in_executor(self._pool, call, function, argument)


class LoopStallMonitor:
    """Notices an event loop that a handler keeps from running.

    While attempts run, a timer every `LOOP_CHECK_SECONDS` measures how late it
    fired; later than `blocked_seconds` logs `runtime.loop_blocked` (a warning,
    at most one every `LOOP_WARN_EVERY_SECONDS`, with how many were left out),
    naming the kinds of the async handlers running at the time: one of them is
    the likeliest culprit. Sync handlers run in threads and are not counted. It
    costs nothing while no attempt runs, and a counter update per attempt."""

    def __init__(self, blocked_seconds: float) -> None:
        self._blocked_seconds = blocked_seconds
        self._running = 0
        self._async_kinds: dict[str, int] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._expected = 0.0
        self._next_warning = 0.0
        self._left_out = 0

    def attempt_started(self, kind: str, in_thread: bool) -> None:
        if not in_thread:
            self._async_kinds[kind] = self._async_kinds.get(kind, 0) + 1
        self._running += 1
        if self._timer is None:
            self._arm(asyncio.get_running_loop())

    def attempt_ended(self, kind: str, in_thread: bool) -> None:
        if self._running == 1 and self._timer is not None:
            # The last one: its timer goes, so look now. A handler that blocked
            # without ever awaiting ends before the loop could run the timer.
            self._timer.cancel()
            self._timer = None
            self._check(asyncio.get_running_loop(), rearm=False)
        if not in_thread:
            left = self._async_kinds[kind] - 1
            if left:
                self._async_kinds[kind] = left
            else:
                del self._async_kinds[kind]
        self._running -= 1
        if not self._running and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        self._expected = loop.time() + LOOP_CHECK_SECONDS
        self._timer = loop.call_at(self._expected, self._check, loop)

    def _check(self, loop: asyncio.AbstractEventLoop, rearm: bool = True) -> None:
        now = loop.time()
        late = now - self._expected
        if late >= self._blocked_seconds:
            self._report(now, late)
        if rearm:
            self._arm(loop)

    def _report(self, now: float, late: float) -> None:
        if now < self._next_warning:
            self._left_out += 1
            return
        self._next_warning = now + LOOP_WARN_EVERY_SECONDS
        log.warning(
            "runtime.loop_blocked",
            blocked_ms=round(late * 1000),
            kinds=sorted(self._async_kinds),
            warnings_left_out=self._left_out,
        )
        self._left_out = 0
