"""The starved owner's wait (DESIGN §11): how long one owner's job waits to start behind
another owner's backlog, against the same job on an idle queue.

A child process opens a fresh copy of a template holding `backlog` queued `bench.busy` jobs
of one owner, and runs the in-process `Runtime` at concurrency 64 (lease 30 s) with a
handler that sleeps `job_seconds` on average, spread evenly over 0 to twice that from a
fixed seed. (Jobs that all took the same time would start and end in lockstep, and a new
job would wait for the whole cohort: that measures the job length, not the claim order.)
Every slot is busy with that owner's work, and one comes free about every
`job_seconds` / 64. Once all 64 slots run, it enqueues, `samples` times, one `bench.noop`
job of another owner through the repository, and times from just before the enqueue to
the first line of its handler, waiting for that job to end before the next. The idle
figure is the same loop on a database with no other job. Without fair share the starved
job would wait behind the whole backlog (`backlog` × `job_seconds` / 64 seconds); with it,
the job takes the next slot that frees. The target divides its median wait by the idle one's.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import Measurement, percentile, sqlite_url
from bench.context import RoundContext, RoundItem
from bench.procs import run_child
from leasehold._server import migrate
from leasehold._server.clock import SystemClock
from leasehold._server.gc_tuning import settle_after_startup
from leasehold._server.jobs.records import NewJob
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.logs import configure_logging
from leasehold._server.runtime.claim_loop import Runtime, RuntimeSettings
from leasehold.worker import HandlerRegistry, JobContext

CONCURRENCY = 64
STARVED_OWNER = "bench-starved"
DEADLINE_SECONDS = 300.0


async def starved_waits(database: str, samples: int, job_seconds: float, busy: bool) -> dict[str, Any]:
    """Run in a child process: the enqueue-to-start waits of `samples` jobs of a new owner."""
    configure_logging("warning")
    url = sqlite_url(Path(database))
    await asyncio.to_thread(migrate.upgrade, url)
    repo = SqlJobRepository(create_engines(url), SystemClock())
    durations = random.Random(1234)
    busy_starts = 0
    last_busy_start = 0.0
    all_busy = asyncio.Event()
    started: dict[str, float] = {}

    async def busy_job(ctx: JobContext) -> None:
        nonlocal busy_starts, last_busy_start
        busy_starts += 1
        last_busy_start = time.perf_counter()
        if busy_starts >= CONCURRENCY:
            all_busy.set()
        await asyncio.sleep(durations.uniform(0, 2 * job_seconds))

    async def noop(ctx: JobContext) -> None:
        started[ctx.job_id] = time.perf_counter()

    registry = HandlerRegistry()
    registry.register("bench.busy", busy_job)
    registry.register("bench.noop", noop)
    runtime = Runtime(repo, registry, SystemClock(), RuntimeSettings(concurrency=CONCURRENCY))
    waits: list[float] = []
    try:
        await runtime.start()
        settle_after_startup()
        async with asyncio.timeout(DEADLINE_SECONDS):
            if busy:
                await all_busy.wait()
            for _ in range(samples):
                began = time.perf_counter()
                job, _ = await repo.enqueue(NewJob(STARVED_OWNER, "bench.noop", {}))
                while job.id not in started:
                    await asyncio.sleep(0.0005)
                waits.append((started[job.id] - began) * 1000)
                await asyncio.sleep(0.01)  # let it finish before the next
        # The backlog must still have been starting jobs when the last sample was taken.
        still_busy = last_busy_start >= began if busy else True
    finally:
        await runtime.stop(grace_seconds=0.1)
        await repo.close()
    return {"waits_ms": waits, "backlog_was_running": still_busy}


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    template = ctx.templates.jobs("bench.busy", sizes.starved_backlog)
    params = {
        "backlog": sizes.starved_backlog,
        "job_seconds": sizes.starved_job_seconds,
        "samples": sizes.starved_samples,
        "concurrency": CONCURRENCY,
    }
    for label, database, busy in (
        ("idle_wait", ctx.directory / "starved-idle.db", False),
        ("starved_wait", ctx.copy(template, "starved.db"), True),
    ):
        result = run_child(
            ctx.directory,
            f"starved-{label}",
            "bench.figures.starved:starved_waits",
            {
                "database": str(database),
                "samples": sizes.starved_samples,
                "job_seconds": sizes.starved_job_seconds,
                "busy": busy,
            },
            DEADLINE_SECONDS + 60,
        )
        if not result["backlog_was_running"]:
            raise RuntimeError("the backlog ran out before the starved owner's samples were taken")
        waits = result["waits_ms"]
        yield Measurement(f"leasehold.{label}.p50", percentile(waits, 50), "ms", "leasehold", dict(params))
