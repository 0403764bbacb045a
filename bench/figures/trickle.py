"""(d) Trickle: enqueue -> start latency of jobs arriving one at a time, beside huey's.

Leasehold: one `serve` process at its default concurrency (no `--concurrency` flag: what a user
starts with; with 20 ms between no-op jobs a free slot is always there, as with huey's 2 workers)
and `bench.stamp`, whose handler stamps `time.monotonic()` on entry into $BENCH_STAMPS. One client
process sends `count` Enqueues on a fixed schedule `interval` apart (bench.load.paced_enqueue),
stamping just before each send. The latency of a job is its entry stamp minus its send stamp
(CLOCK_MONOTONIC is system-wide, so the two processes' stamps compare). p50/p95/p99 over all jobs;
the baselines are the same measurement on huey (bench.baselines.huey_bench.trickle) and on Celery
with Redis (bench.baselines.celery_bench, skipped without redis-server), taken just before in the
same round.

The same measurement also runs with the server on PostgreSQL (group `pg_trickle`): the
Enqueue commits through the writer to a durable cluster, and the idle runtime's waiting claim
rides in that same transaction (one commit from Enqueue to handler, as on SQLite), so the
figure shows what the statements and the commit cost as round trips to PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bench.baselines import celery_bench, huey_bench
from bench.common import BenchError, Measurement, latency_summary, read_stamps, wait_until
from bench.context import RoundContext, RoundItem
from bench.jobtable import JobTable
from bench.postgres import PgDatabase
from bench.procs import leasehold_server, run_child

SERVER_CONCURRENCY = None  # the server's default (see the module docstring)


def measure(
    ctx: RoundContext, database: Path | PgDatabase | None = None, prefix: str = "leasehold.trickle"
) -> list[Measurement]:
    """`database`: a SQLite file or a PostgreSQL database (default: a fresh SQLite file); the
    server creates the schema on an empty database at start-up, outside the measurement.
    Beside the figures, `.start.p50/.p99`: each job's `started_at` minus its `created_at`, the
    server's own stamps of the Enqueue's commit and of the claim that started it."""
    sizes = ctx.sizes
    name = prefix.replace("leasehold.", "").replace(".", "-")
    stamps = ctx.directory / f"{name}.stamps"
    env = {"BENCH_STAMPS": str(stamps)}
    database = database if database is not None else ctx.directory / "trickle.db"
    target = database.url if isinstance(database, PgDatabase) else database
    with leasehold_server(ctx.directory, target, SERVER_CONCURRENCY, env=env, name=name) as server:
        sent = run_child(
            ctx.directory,
            f"{name}-client",
            "bench.load:paced_enqueue",
            {
                "target": server.target,
                "kind": "bench.stamp",
                "count": sizes.trickle_count,
                "interval": sizes.trickle_interval,
            },
            timeout=sizes.trickle_count * sizes.trickle_interval + 90,
        )
        wanted = {job_id for job_id, _ in sent}
        wait_until(
            lambda: server.alive() and wanted <= {key for key, _, _ in read_stamps(stamps)},
            60.0,
            "every trickle job to start",
        )
        with JobTable(database) as table:
            delays = table.start_delays()
    entries = {key: at for key, _, at in read_stamps(stamps)}
    latencies = [entries[job_id] - at for job_id, at in sent]
    if len(latencies) != sizes.trickle_count:
        raise BenchError(f"trickle: {len(latencies)} of {sizes.trickle_count} jobs")
    summary = latency_summary(latencies)
    params = {
        "jobs": sizes.trickle_count,
        "interval_ms": sizes.trickle_interval * 1000,
        "server_concurrency": SERVER_CONCURRENCY or "default",
        "max_ms": round(summary["max"], 3),
    }
    starts = latency_summary([delays[job_id] for job_id, _ in sent])
    return [
        Measurement(f"{prefix}.{p}", summary[p], "ms", "leasehold", params) for p in ("p50", "p95", "p99")
    ] + [
        Measurement(f"{prefix}.start.{p}", starts[p], "ms", "leasehold", {**params, "max_ms": starts["max"]})
        for p in ("p50", "p99")
    ]


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    timeout = sizes.trickle_count * sizes.trickle_interval + 90
    yield from huey_bench.trickle(ctx.directory, sizes.trickle_count, sizes.trickle_interval, timeout)
    yield from celery_bench.run_trickle(ctx)
    yield from measure(ctx)


def run_postgres(ctx: RoundContext) -> Iterator[RoundItem]:
    """The same measurement with the server on a fresh, empty PostgreSQL database of the
    run's cluster (its target sits beside the SQLite figure above)."""
    database = ctx.postgres.database("trickle")
    yield from measure(ctx, database, "leasehold.pg.trickle")
