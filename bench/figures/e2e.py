"""(c) End to end: jobs/s from the first Enqueue to the last `succeeded`, with clients enqueueing
at full rate while the runtime drains.

One `serve` process (concurrency 64) on an empty database; one client process enqueues N
`bench.noop` jobs with 64 calls in flight (bench.load.fixed_count). The start is the client's
wall clock just before its first call; the end is the largest `completed_at` in the database (the
server's wall clock, same machine), read from the SQLite file read-only once all N jobs are
`succeeded` (polled every 100 ms; the poll only decides when to look, not the figure). The target
divides the figure by huey's drain in the same round: huey drains a queue that is already full,
which is the easier job, so the comparison is conservative.

The same measurement at the server's defaults (group `e2e_defaults`, figure
`leasehold.e2e.defaults`): `serve` with no `--concurrency` flag, so its default of 2 execution
slots (the other flags the bench passes, `--lease-seconds 30 --poll-seconds 1 --log-level info`,
are the defaults too), against Celery's end to end on Redis in the same round
(bench.baselines.celery_bench), whose worker also runs 2 tasks at a time.
"""

from __future__ import annotations

from collections.abc import Iterator

from bench.common import BenchError, Measurement, succeeded_jobs, wait_until
from bench.context import RoundContext, RoundItem
from bench.load import ENQUEUE_METHOD, enqueue_request
from bench.procs import leasehold_server, run_child

DRAIN_TIMEOUT = 600.0


def measure(ctx: RoundContext, event_loop: str | None = None, *, defaults: bool = False) -> Measurement:
    """`defaults`: `serve` without `--concurrency` (its default), figure `leasehold.e2e.defaults`."""
    sizes = ctx.sizes
    total = sizes.e2e_jobs
    database = ctx.directory / "e2e.db"
    suffix = (".defaults" if defaults else "") + ("" if event_loop is None else f".{event_loop}")
    concurrency = None if defaults else sizes.e2e_server_concurrency
    with leasehold_server(ctx.directory, database, concurrency, event_loop=event_loop) as server:
        load = run_child(
            ctx.directory,
            f"e2e-client{suffix}",
            "bench.load:fixed_count",
            {
                "target": server.target,
                "method": ENQUEUE_METHOD,
                "request_hex": enqueue_request("bench.noop").hex(),
                "concurrency": sizes.e2e_client_concurrency,
                "total": total,
            },
            timeout=DRAIN_TIMEOUT,
        )
        wait_until(
            lambda: server.alive() and succeeded_jobs(database)[0] >= total,
            DRAIN_TIMEOUT,
            "every e2e job to succeed",
            0.1,
        )
    count, last = succeeded_jobs(database)
    if count != total or last is None:
        raise BenchError(f"e2e: {count} of {total} jobs succeeded")
    seconds = last / 1e6 - float(load["first_send_wall"])
    params = {
        "jobs": total,
        "server_concurrency": "default" if concurrency is None else concurrency,
        "client_concurrency": sizes.e2e_client_concurrency,
        "event_loop": event_loop or "default",
        "seconds": round(seconds, 3),
        "enqueue_rate": round(float(load["enqueue_rate"]), 1),
    }
    return Measurement(f"leasehold.e2e{suffix}", total / seconds, "jobs/s", "leasehold", params)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    yield measure(ctx)


def run_defaults(ctx: RoundContext) -> Iterator[RoundItem]:
    yield measure(ctx, defaults=True)
