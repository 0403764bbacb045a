"""Kinds for the remote-worker experiments, loaded by `leasehold serve` and by
`leasehold worker --handlers tests.remote.handlers` alike.

`remote.record` is `test.record` under a remote kind (one JSON line per
execution, with monotonic start and end, in `$SYSTEM_TEST_RECORD_DIR`);
`remote.block` appends a `progress` event, then waits, checking for a cancel
at every step, until the file named by its payload exists; `remote.stubborn`
waits the same way but never checks for a cancel; `remote.resume` says where
it resumes from (a `resumed` event), saves a checkpoint naming its attempt
(then a `checkpointed` event: the checkpoint is stored by then), and waits like
`remote.block`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from leasehold.worker import HandlerRegistry, JobContext
from tests.system.handlers_for_tests import record

STEP_SECONDS = 0.05


async def block(ctx: JobContext) -> dict[str, object]:
    await ctx.append_event("progress", {"attempt": ctx.attempt})
    gate = Path(str(ctx.payload["gate"]))
    while not gate.exists():
        await ctx.raise_if_cancelled()
        await asyncio.sleep(STEP_SECONDS)
    return {"attempt": ctx.attempt}


async def stubborn(ctx: JobContext) -> None:
    gate = Path(str(ctx.payload["gate"]))
    while not gate.exists():
        await asyncio.sleep(STEP_SECONDS)


async def resume(ctx: JobContext) -> dict[str, object]:
    await ctx.append_event("resumed", {"attempt": ctx.attempt, "from": ctx.last_checkpoint})
    await ctx.checkpoint({"saved_by_attempt": ctx.attempt})
    await ctx.append_event("checkpointed", {"attempt": ctx.attempt})
    gate = Path(str(ctx.payload["gate"]))
    while not gate.exists():
        await asyncio.sleep(STEP_SECONDS)
    return {"resumed_from": ctx.last_checkpoint}


def register(registry: HandlerRegistry) -> None:
    registry.register("remote.record", record)
    registry.register("remote.block", block)
    registry.register("remote.stubborn", stubborn)
    registry.register("remote.resume", resume)
