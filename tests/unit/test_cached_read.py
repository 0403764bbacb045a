"""GetQueueStats' cache: many callers within the interval cost one read, and
callers that arrive during a read share it."""

from __future__ import annotations

import asyncio

from leasehold._server.api.cached_read import CachedRead
from leasehold._server.clock import ManualClock


async def test_callers_within_the_interval_share_one_read() -> None:
    clock = ManualClock()
    answers = iter(range(100))
    release = asyncio.Event()

    async def read() -> int:
        await release.wait()
        return next(answers)

    cache = CachedRead(read, clock, interval_seconds=1.0)
    waiting = [asyncio.create_task(cache.get()) for _ in range(50)]
    await asyncio.sleep(0)
    release.set()
    assert await asyncio.gather(*waiting) == [0] * 50
    clock.advance(0.9)
    assert await cache.get() == 0
    assert cache.reads == 1
    clock.advance(0.1)  # a second old: read again
    assert await cache.get() == 1
    clock.advance(-5)  # a clock stepped back never serves a stale answer for long
    assert await cache.get() == 2
    assert cache.reads == 3


async def test_a_failed_read_is_not_kept() -> None:
    clock = ManualClock()
    calls = 0

    async def read() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("database away")
        return calls

    cache = CachedRead(read, clock, interval_seconds=1.0)
    try:
        await cache.get()
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failure should reach the caller")
    assert await cache.get() == 2
