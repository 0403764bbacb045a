"""PostgreSQL, cross-replica event delay: an event committed by a handler on replica B, delivered to a
WatchEvents stream held open on replica A, both `serve` processes on one PostgreSQL database.

Order of start-up is what puts the handlers on B: B starts alone on a fresh, empty database (it
creates the schema), J `bench.ticker` jobs are enqueued through B (concurrency J, so B claims them
all at once), and only once the database shows all J running does A start (concurrency 2; it
finds nothing to claim, and a running job's lease stays with B, renewed by its heartbeats). Only
B has $BENCH_STAMPS, so every commit stamp the figure uses is B's.

One client process (bench.watchers.watch_live) opens W streams per job on A. Once every stream
has its first message and a settle time has passed, the bench creates the "go" file and each
ticker appends a `bench.tick` event about every `interval` seconds (jittered) for S seconds,
stamping `time.monotonic()` when `append_event` returned, i.e. once B had committed it. A hears
of the commit by PostgreSQL NOTIFY, reads the log and streams the event; the watcher stamps its
receipt before decoding. Delay = receipt - commit over every (event, stream) pair (CLOCK_MONOTONIC
is one clock for the machine); p50 and p99 (p95 and max in params). No target is set:
the figures are reported. A delivery missing at the end fails the figure.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from bench.common import BenchError, Measurement, latency_summary, read_stamps, wait_until
from bench.context import RoundContext, RoundItem
from bench.figures.watch import enqueue_tickers
from bench.jobtable import JobTable
from bench.procs import Child, leasehold_server

A_CONCURRENCY = 2


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    directory = ctx.directory
    stamps = directory / "replica-b.stamps"
    receipts = directory / "receipts-a"
    ready = directory / "ready-a"
    go = directory / "go"
    timeout = sizes.cross_seconds + 180
    database = ctx.postgres.database("cross_replica")
    b_env = {"BENCH_STAMPS": str(stamps)}
    with leasehold_server(directory, database.url, sizes.cross_jobs, env=b_env, name="replica-b") as b:
        job_ids = enqueue_tickers(
            directory, "cross-enqueue", b, sizes.cross_jobs, go, sizes.cross_seconds, sizes.cross_interval
        )
        with JobTable(database) as table:
            wait_until(
                lambda: b.alive() and table.status_count("running") == sizes.cross_jobs,
                60.0,
                "replica B to claim every ticker job",
            )
            owners = table.lease_owners("running")
        if owners != {b.record["worker_id"]: sizes.cross_jobs}:
            raise BenchError(f"cross-replica: the ticker jobs are not all leased by replica B: {owners}")
        with leasehold_server(directory, database.url, A_CONCURRENCY, name="replica-a") as a:
            watchers = Child(
                directory,
                "watchers-a",
                "bench.watchers:watch_live",
                {
                    "target": a.target,
                    "job_ids": job_ids,
                    "per_job": sizes.cross_watchers_per_job,
                    "ready_path": str(ready),
                    "receipts_path": str(receipts),
                    "timeout": timeout,
                },
            )
            with watchers:
                wait_until(
                    lambda: a.alive() and b.alive() and (ready.exists() or watchers.done()),
                    120.0,
                    "every watcher on replica A to subscribe",
                )
                time.sleep(sizes.cross_settle_seconds)
                go.touch()
                result = watchers.result(timeout)
    with JobTable(database) as table:
        # One attempt each: no ticker was ever claimed again (by A) after B's lease.
        if table.status_count("succeeded") != sizes.cross_jobs or table.max_attempt() != 1:
            raise BenchError("cross-replica: a ticker job did not run exactly once, on replica B")
    commits = {(job_id, sequence): at for job_id, sequence, at in read_stamps(stamps)}
    delays = [
        at - commits[(job_id, sequence)]
        for job_id, sequence, at in read_stamps(receipts)
        if (job_id, sequence) in commits
    ]
    expected = len(commits) * sizes.cross_watchers_per_job
    if not delays:
        raise BenchError("cross-replica: no event was delivered")
    if len(delays) != expected:
        raise BenchError(f"cross-replica: {expected - len(delays)} of {expected} deliveries missing")
    summary = latency_summary(delays)
    params = {
        "jobs": sizes.cross_jobs,
        "streams": sizes.cross_jobs * sizes.cross_watchers_per_job,
        "seconds": sizes.cross_seconds,
        "interval_ms": sizes.cross_interval * 1000,
        "settle_s": sizes.cross_settle_seconds,
        "events": len(commits),
        "deliveries": len(delays),
        "streams_ended": result["ended"],
        "p95_ms": round(summary["p95"], 3),
        "max_ms": round(summary["max"], 3),
    }
    for p in ("p50", "p99"):
        yield Measurement(f"leasehold.pg.cross_replica_lag.{p}", summary[p], "ms", "leasehold", params)
