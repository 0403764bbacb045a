"""Kinds for the remote-worker process tests, loaded by `leasehold worker
--handlers tests.remote_worker.handlers` (and by `serve` for the end-to-end test):
an ordinary handler module, nothing remote about it."""

from __future__ import annotations

import asyncio

from leasehold.worker import HandlerRegistry, JobContext

SECRET_PAYLOAD_MARKER = "PAYLOAD-SECRET-4711"


async def double(ctx: JobContext) -> dict[str, object]:
    """`{"n": n}` -> the result `{"doubled": 2n}`."""
    await ctx.append_event("progress", {"half": True})
    return {"doubled": ctx.payload["n"] * 2}


async def hold(ctx: JobContext) -> None:
    """Runs until cancelled or the process stops."""
    while True:
        await ctx.raise_if_cancelled()
        await asyncio.sleep(0.02)


async def add_up(ctx: JobContext) -> dict[str, object]:
    """A step of a graph: the sum of its parents' `doubled`, and whose they were."""
    results = ctx.parent_results
    return {"sum": sum(result["doubled"] for result in results.values()), "from": list(results)}


def register(registry: HandlerRegistry) -> None:
    registry.register("remote.double", double)
    registry.register("remote.hold", hold)
    registry.register("remote.add-up", add_up)
