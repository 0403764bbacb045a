"""(b) Drain: jobs/s of N pre-enqueued no-op jobs through the in-process runtime.

A child process opens a fresh copy of a template holding N queued `bench.noop` jobs with
`SqlJobRepository`, builds `Runtime` (lease 30 s, poll 1 s, the given concurrency) with a no-op
handler that counts its calls, logs at info exactly as `serve` does (JSON lines on its stderr,
which goes to a file) and, as `serve` does once it is up, freezes its startup heap
(leasehold._server.gc_tuning). It takes wall-clock time just before `runtime.start()`; once the
handler has run N times it polls the database (every 20 ms) until all N jobs are
`succeeded`, and the end is the largest `completed_at` (the server's own wall-clock stamp of
the last completion). Rate = N / (end - start). The figure's target divides it by huey's
drain measured in the same round.

`leasehold.drain.owners` is the same drain with the N jobs dealt in turn to many owners, so
that fair share (DESIGN §11) deals every claim's slots among them; its target divides it by
the one-owner drain of the same round.

Concurrency 64 is the figure; concurrency 2 (the server's default before it became 64) is reported
beside it as information. `event_loop` selects asyncio or uvloop for figure (h).

Group `drain_default` (figure `leasehold.drain.default`) is the same drain of the same N jobs at
the default concurrency, i.e. what `serve` runs with no `--concurrency` flag, read from the CLI's
own settings code when the figure runs (bench.procs.default_concurrency: 64 when this was
written, 2 before), so it follows the default if that changes. Its target divides it by huey's drain too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.baselines import huey_bench
from bench.common import Measurement, sqlite_url, succeeded_jobs
from bench.context import RoundContext, RoundItem
from bench.procs import default_concurrency, run_child
from leasehold._server.clock import SystemClock
from leasehold._server.gc_tuning import settle_after_startup
from leasehold._server.jobs.sql.engines import create_engines
from leasehold._server.jobs.sql.repository import SqlJobRepository
from leasehold._server.logs import configure_logging
from leasehold._server.runtime.claim_loop import Runtime, RuntimeSettings
from leasehold.worker import HandlerRegistry, JobContext

DEADLINE_SECONDS = 600.0


async def drain_in_process(database: str, count: int, concurrency: int) -> dict[str, Any]:
    """Run in a child process: drain `database` with an in-process Runtime."""
    configure_logging("info")
    path = Path(database)
    repo = SqlJobRepository(create_engines(sqlite_url(path)), SystemClock())
    handled = 0
    all_handled = asyncio.Event()

    async def noop(ctx: JobContext) -> None:
        nonlocal handled
        handled += 1
        if handled >= count:
            all_handled.set()

    registry = HandlerRegistry()
    registry.register("bench.noop", noop)
    runtime = Runtime(repo, registry, SystemClock(), RuntimeSettings(concurrency=concurrency))
    try:
        start_wall = time.time()
        await runtime.start()
        settle_after_startup()  # as `serve` does once it is up
        async with asyncio.timeout(DEADLINE_SECONDS):
            await all_handled.wait()
            while True:
                succeeded, last = await asyncio.to_thread(succeeded_jobs, path)
                if succeeded >= count and last is not None:
                    break
                await asyncio.sleep(0.02)
    finally:
        await runtime.stop()
        await repo.close()
    seconds = last / 1e6 - start_wall
    return {
        "jobs": succeeded,
        "seconds": seconds,
        "rate": count / seconds,
        "loop": type(asyncio.get_running_loop()).__module__,
    }


def measure(
    directory: Path, database: Path, count: int, concurrency: int, event_loop: str = "asyncio", name: str = ""
) -> Measurement:
    """Drain a fresh copy (`database`) of the template in a child process."""
    label = name or f"leasehold.drain.c{concurrency}" + ("" if event_loop == "asyncio" else f".{event_loop}")
    result = run_child(
        directory,
        f"drain-c{concurrency}-{event_loop}",
        "bench.figures.drain:drain_in_process",
        {"database": str(database), "count": count, "concurrency": concurrency},
        DEADLINE_SECONDS + 60,
        event_loop=event_loop,
    )
    params = {
        "jobs": count,
        "concurrency": concurrency,
        "event_loop": event_loop,
        "seconds": round(result["seconds"], 3),
        "runtime": "in-process",
    }
    return Measurement(label, result["rate"], "jobs/s", "leasehold", params)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    template = ctx.templates.jobs("bench.noop", sizes.drain_jobs)
    yield measure(ctx.directory, ctx.copy(template, "drain.db"), sizes.drain_jobs, sizes.drain_concurrency)
    # DESIGN §11: the same drain with its jobs dealt to many owners, so every claim shares the
    # slots out among them (steering.choose), against the one-owner drain just before it.
    spread = ctx.templates.jobs("bench.noop", sizes.drain_jobs, owners=sizes.drain_owners)
    figure = measure(
        ctx.directory,
        ctx.copy(spread, "drain-owners.db"),
        sizes.drain_jobs,
        sizes.drain_concurrency,
        name="leasehold.drain.owners",
    )
    figure.params["owners"] = sizes.drain_owners
    yield figure
    info = ctx.templates.jobs("bench.noop", sizes.drain_info_jobs)
    figure = measure(
        ctx.directory, ctx.copy(info, "drain-info.db"), sizes.drain_info_jobs, sizes.drain_info_concurrency
    )
    figure.params["informational"] = True
    yield figure


def run_default(ctx: RoundContext) -> Iterator[RoundItem]:
    """The drain figure at `serve`'s default concurrency."""
    sizes = ctx.sizes
    template = ctx.templates.jobs("bench.noop", sizes.drain_jobs)
    database = ctx.copy(template, "drain-default.db")
    concurrency = default_concurrency()
    figure = measure(ctx.directory, database, sizes.drain_jobs, concurrency, name="leasehold.drain.default")
    figure.params["concurrency_source"] = "serve's default"
    yield figure


def run_huey(ctx: RoundContext) -> Iterator[RoundItem]:
    """Baseline 3, drain: huey's drain of its pre-enqueued no-op tasks (see bench.baselines.huey_bench)."""
    count = ctx.sizes.huey_drain_tasks
    database = ctx.copy(ctx.templates.huey_tasks(count), "huey-drain.db")
    yield huey_bench.drain(ctx.directory, database, count, DEADLINE_SECONDS)
