"""A job kind for the dashboard's browser tests, loaded by `leasehold serve
--handlers leasehold.examples tests.dashboard.handlers`.

`test.steps` (`{"steps": n}`) is tests/support.py's Gate across a process
boundary: before each step it waits for the test to open that step's gate, a
file `$DASHBOARD_GATE_DIR/<job id>.<step>`, then reports `{step, steps}`
progress; it stops at a cancel request while it waits.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from leasehold.worker import HandlerRegistry, JobContext

GATE_DIR_ENV = "DASHBOARD_GATE_DIR"
# How often a waiting step looks for its gate file (and for a cancel request).
POLL_SECONDS = 0.05


def gate_file(directory: Path, job_id: str, step: int) -> Path:
    return directory / f"{job_id}.{step}"


async def steps(ctx: JobContext) -> None:
    directory = Path(os.environ[GATE_DIR_ENV])
    total = int(ctx.payload.get("steps", 3))
    for step in range(1, total + 1):
        while not gate_file(directory, ctx.job_id, step).exists():
            await ctx.raise_if_cancelled()
            await asyncio.sleep(POLL_SECONDS)
        await ctx.append_event("progress", {"step": step, "steps": total})


def register(registry: HandlerRegistry) -> None:
    registry.register("test.steps", steps)
