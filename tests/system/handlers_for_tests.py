"""Job kinds for the process-level tests, loaded by `leasehold serve --handlers
leasehold.examples tests.system.handlers_for_tests`.

`test.record` sleeps `{"seconds": s}` (default 0.05) and appends one JSON line per
execution -- job id, attempt, pid, start and end on both the monotonic clock (one
system-wide clock on Linux, so intervals from different processes compare) and the
wall clock -- to `$SYSTEM_TEST_RECORD_DIR/<pid>.jsonl`. The line is written even when
the attempt is interrupted (`"outcome": "interrupted"`), so no execution goes unseen.

`test.echo_result` appends its payload as an `echo` event and returns it as the
job's result: what a caller sent comes back through both.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from leasehold.worker import HandlerRegistry, JobContext

RECORD_DIR_ENV = "SYSTEM_TEST_RECORD_DIR"


async def record(ctx: JobContext) -> None:
    start_monotonic, start_wall = time.monotonic(), time.time()
    outcome = "interrupted"
    try:
        await asyncio.sleep(float(ctx.payload.get("seconds", 0.05)))
        outcome = "returned"
    finally:
        line = json.dumps(
            {
                "job_id": ctx.job_id,
                "attempt": ctx.attempt,
                "pid": os.getpid(),
                "start_monotonic": start_monotonic,
                "end_monotonic": time.monotonic(),
                "start_wall": start_wall,
                "end_wall": time.time(),
                "outcome": outcome,
            }
        )
        _append(Path(os.environ[RECORD_DIR_ENV]) / f"{os.getpid()}.jsonl", line + "\n")


async def echo_result(ctx: JobContext) -> dict[str, Any]:
    await ctx.append_event("echo", dict(ctx.payload))
    return dict(ctx.payload)


def _append(path: Path, text: str) -> None:
    # One O_APPEND write per line: lines never interleave, even if files were shared.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def register(registry: HandlerRegistry) -> None:
    registry.register("test.record", record)
    registry.register("test.echo_result", echo_result)
