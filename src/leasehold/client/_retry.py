"""Which failures a call may be repeated after, and how long to wait between tries.

A call is repeated only when repeating it cannot act twice: reads and Cancel are
naturally idempotent, and Enqueue, BatchEnqueue and Retry carry a request_id the
server deduplicates on. Everything else raises at once, so a caller never waits
out a deadline to learn that its request was wrong.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import grpc

T = TypeVar("T")

# DEADLINE_EXCEEDED may mean the server did the work and the answer was lost, so
# only a read, which changes nothing, is repeated after it.
WRITE_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE})
READ_RETRYABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


@dataclass(frozen=True)
class RetryOptions:
    """Capped exponential backoff with full jitter, within an overall deadline.

    `deadline_seconds` bounds the retrying of one call: no new try starts after it
    (for `watch`, it bounds reaching the service at the start; a watch that has
    reached it reconnects until its own deadline, `watch(deadline_seconds=...)`);
    `attempt_timeout_seconds` bounds each try of a unary call, so a server that
    hangs is tried again rather than waited on for the whole deadline.
    """

    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0
    multiplier: float = 2.0
    deadline_seconds: float = 30.0
    attempt_timeout_seconds: float = 10.0

    def __post_init__(self) -> None:
        for name in ("initial_backoff_seconds", "max_backoff_seconds", "deadline_seconds"):
            if getattr(self, name) < 0:
                raise ValueError(f"RetryOptions.{name} must not be negative")
        if self.multiplier < 1:
            raise ValueError("RetryOptions.multiplier must be at least 1")
        if self.attempt_timeout_seconds <= 0:
            raise ValueError("RetryOptions.attempt_timeout_seconds must be positive")

    def backoffs(self) -> Iterator[float]:
        """Sleep lengths: full jitter under a cap that grows geometrically."""
        cap = self.initial_backoff_seconds
        while True:
            yield random.uniform(0, cap)
            cap = min(self.max_backoff_seconds, cap * self.multiplier)


class Deadline:
    """The time left for one call and its retries (monotonic clock)."""

    def __init__(self, seconds: float) -> None:
        self._ends = time.monotonic() + seconds

    def remaining(self) -> float:
        return max(0.0, self._ends - time.monotonic())


def is_retryable(error: grpc.aio.AioRpcError, codes: frozenset[grpc.StatusCode]) -> bool:
    return error.code() in codes


async def sleep_or_give_up(backoff: float, deadline: Deadline) -> bool:
    """Sleep `backoff` (cut to the deadline); False when no time is left for another try."""
    remaining = deadline.remaining()
    if remaining <= 0:
        return False
    await asyncio.sleep(min(backoff, remaining))
    return deadline.remaining() > 0


async def call_with_retries(
    attempt: Callable[[float], Awaitable[T]],
    options: RetryOptions,
    codes: frozenset[grpc.StatusCode],
) -> T:
    """Run `attempt(timeout)` until it succeeds, fails with a status outside
    `codes`, or the deadline passes (then the last error is raised). The deadline
    bounds the retrying: no try starts after it, and a deadline of 0 means one
    try, which gets its whole attempt timeout."""
    deadline = Deadline(options.deadline_seconds)
    backoffs = options.backoffs()
    while True:
        try:
            return await attempt(options.attempt_timeout_seconds)
        except grpc.aio.AioRpcError as error:
            if not is_retryable(error, codes):
                raise
            if not await sleep_or_give_up(next(backoffs), deadline):
                raise
