"""Live watch lag in a burst, the users' shape (DESIGN §20), group `burst_lag`.

`serve` at its defaults (no flag but the address, the database and the handler modules; its
default 64 execution slots, so the jobs run in waves that start together) on a fresh SQLite file
runs the built-in `example.sleep {"seconds": 2, "steps": 10}`. One client process
(bench.bursts.enqueue_and_watch) enqueues J jobs, at most 64 Enqueues in flight, over one
channel, and opens a WatchEvents stream on each job as soon as its Enqueue returns. Nobody
subscribes first or waits for anything to settle: the first jobs run, and every 200 ms a wave of
jobs that started together appends its progress events at nearly the same moment, while later
jobs are still being enqueued and watched.

* `leasehold.burst_lag.300.p50/.p99`: 300 jobs of one owner.
* `leasehold.burst_lag.1000x20.p50/.p99`: 1,000 jobs over 20 owners (50 each, round-robin).

A delivery's lag is its receipt time minus the event's `created_at` (the server's stamp inside the
write transaction, before its commit: the rest of the write batch and the commit count as lag), for
events created after their stream's first message (what a stream replays when it opens is
history); p50/p99 over every such delivery. Every stream must end with `job.succeeded`, or the
figure fails. Params give the deliveries counted, p95 and max, and the share of one core the
server and the client used over the run.

The jittered figures that subscribe first and settle (`load_lag`, `live_lag`) remain as
extra rows; this group holds the targets.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from bench.common import BenchError, Measurement, latency_summary, tree_cpu_seconds
from bench.context import RoundContext, RoundItem
from bench.procs import default_concurrency, leasehold_server, run_child

HANDLERS = ("bench.handlers", "leasehold.examples")
IN_FLIGHT = 64
SECONDS = 2.0
STEPS = 10


def measure(
    ctx: RoundContext, label: str, jobs: int, owners: int, processes: int = 1, figure: str | None = None
) -> list[Measurement]:
    """`processes` above 1: `serve --processes`; `figure` names the figures in place of
    `burst_lag.<label>`."""
    name = f"burst-{label}" if processes == 1 else f"burst-{label}-n{processes}"
    database = ctx.directory / f"{name}.db"
    # The default slots run the jobs in waves of SECONDS each; the rest is start-up and slack.
    slots = default_concurrency()
    timeout = (jobs / slots + 1) * SECONDS * 3 + 90
    with leasehold_server(
        ctx.directory, database, None, name=name, handlers=HANDLERS, processes=processes
    ) as server:
        server_cpu = tree_cpu_seconds(server.pid)
        began = time.monotonic()
        result = run_child(
            ctx.directory,
            f"{name}-client",
            "bench.bursts:enqueue_and_watch",
            {
                "target": server.target,
                "jobs": jobs,
                "owners": owners,
                "in_flight": IN_FLIGHT,
                "seconds": SECONDS,
                "steps": STEPS,
                "timeout": timeout,
            },
            timeout=timeout,
        )
        elapsed = time.monotonic() - began
        server_cpu = tree_cpu_seconds(server.pid) - server_cpu
    lags = result["lags_s"]
    if len(result["events"]) != jobs:
        raise BenchError(f"{name}: {len(result['events'])} of {jobs} streams ended")
    if not lags:
        raise BenchError(f"{name}: no live delivery")
    summary = latency_summary(lags)
    params = {
        "jobs": jobs,
        "owners": owners,
        "in_flight": IN_FLIGHT,
        "payload": {"seconds": SECONDS, "steps": STEPS},
        "server_concurrency": f"default ({slots})",
        "processes": processes,
        "live_deliveries": len(lags),
        "events": sum(result["events"]),
        "p95_ms": round(summary["p95"], 3),
        "max_ms": round(summary["max"], 3),
        "server_cpu_pct": round(100 * server_cpu / elapsed, 1),
        "client_cpu_pct": round(100 * result["cpu_s"] / elapsed, 1),
    }
    prefix = f"leasehold.{figure or f'burst_lag.{label}'}"
    return [Measurement(f"{prefix}.{p}", summary[p], "ms", "leasehold", params) for p in ("p50", "p99")]


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    for label, jobs, owners in ctx.sizes.burst_lag_cases:
        yield from measure(ctx, label, jobs, owners)
