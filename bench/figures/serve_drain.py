"""Drain through `serve`: jobs/s of N pre-seeded no-op jobs through `leasehold serve` processes, one on
SQLite and one and three on PostgreSQL, against pgqueuer draining the same count on the same
cluster in the same round (bench.baselines.pgqueuer_bench, group `pgqueuer`).

Set-up, not timed: SQLite gets a fresh copy of the N-job template figure (b) uses; PostgreSQL a
copy (CREATE DATABASE ... TEMPLATE) of a database seeded once per run through the repository
(bench.seed.seed_jobs_url), then VACUUM (ANALYZE)d. The copy's jobs are held back (due in a
month). R `serve` processes start on it (each as figures (b) and (c) run: `--concurrency 64`,
lease 30 s, poll 1 s, `--handlers bench.handlers`, info logs to a file) and each is waited on
until it logs `server.started`; then the start gate (bench.gate) makes every job due at one
instant T0.

Figure: N / (latest `completed_at` - earliest `started_at`) over the N jobs, i.e. from the first
claim to the last completion as the servers stamped them inside their own transactions, the same
rule as pgqueuer's figure. The bench polls the count of succeeded jobs every 100 ms only to know
when to look. Process start-up is outside the figure by construction, and with three replicas
all three are idle and armed for T0 before the first job is due.

At their defaults (group `pg_drain_defaults`, figure `leasehold.serve_drain.pg.r2.defaults`): the
same PostgreSQL drain by two `serve` processes started with no tuning flag at all, only
`--listen`, `--database-url` and `--handlers bench.handlers` (which defines the bench's kinds), so
each runs at the default concurrency (`serve --concurrency`'s default, read from the CLI's code:
bench.procs.default_concurrency; 2 when this was written), the default lease (30 s), poll (1 s)
and log level (info). Its baseline is the same pgqueuer drain as above, which also runs at
pgqueuer's defaults: `pgq run`'s batch size 10, no concurrency limit, default dequeue timeout
(bench.baselines.pgqueuer_app sets nothing else), so it is defaults against defaults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

from bench import gate
from bench.baselines import pgqueuer_bench
from bench.common import BenchError, Measurement, wait_until
from bench.context import RoundContext, RoundItem
from bench.jobtable import JobTable
from bench.postgres import PgDatabase, vacuum_analyze
from bench.procs import ServerProcess, default_concurrency, leasehold_server, run_child
from leasehold.testing import stop_servers

DRAIN_TIMEOUT = 600.0


def pg_template(ctx: RoundContext, count: int, kind: str = "bench.noop") -> str:
    """The run's PostgreSQL template with `count` held-back jobs of `kind`."""
    key = f"pg-{kind.removeprefix('bench.')}-{count}"

    def make(database: PgDatabase) -> None:
        run_child(
            ctx.directory,
            f"seed-{key}",
            "bench.seed:seed_jobs_url",
            {"database_url": database.url, "kind": kind, "count": count},
            timeout=1800,
        )
        with JobTable(database) as table:
            table.hold_back()
        vacuum_analyze(database)

    return ctx.postgres.template(key, make)


def sqlite_copy(ctx: RoundContext, count: int, name: str, kind: str = "bench.noop") -> Path:
    """A fresh copy of the run's SQLite template with `count` jobs of `kind`, held back."""
    database = ctx.copy(ctx.templates.jobs(kind, count), name)
    with JobTable(database) as table:
        table.hold_back()
    return database


def measure(
    ctx: RoundContext,
    database: Path | PgDatabase,
    replicas: int,
    figure: str,
    count: int | None = None,
    concurrency: int | None | Literal["sizes"] = "sizes",
    alongside: Callable[[ServerProcess], contextlib.AbstractContextManager[object]] | None = None,
    processes: int = 1,
) -> Measurement:
    """Drain `database` (holding `count` held-back jobs, default `serve_drain_jobs`) with
    `replicas` servers, each with `concurrency` slots (default `drain_concurrency`; None: the
    server at its defaults, no tuning flag at all). `alongside(first server)` is entered once
    the servers are up, before the start gate, and left once the drain is over, before they
    stop: what a drain is measured with (a feed subscriber) is there for the whole of it.
    `processes`: each server is a `serve --processes` of that many."""
    count = ctx.sizes.serve_drain_jobs if count is None else count
    slots = ctx.sizes.drain_concurrency if concurrency == "sizes" else concurrency
    target = database.url if isinstance(database, PgDatabase) else database
    servers: list[ServerProcess] = []
    with JobTable(database) as table:
        try:
            for i in range(replicas):
                name = f"{table.engine}-r{replicas}-{i + 1}"
                servers.append(leasehold_server(ctx.directory, target, slots, name=name, processes=processes))
            with alongside(servers[0]) if alongside is not None else contextlib.nullcontext():
                due = gate.release(table.make_due, table.vacuum, count)
                wait_until(
                    lambda: all(s.alive() for s in servers) and table.status_count("succeeded") >= count,
                    DRAIN_TIMEOUT,
                    f"{figure}: every job to succeed",
                    0.1,
                )
                done, first, last = table.succeeded_window()
                failed = table.status_count("failed")
        finally:
            stop_servers(servers)
    if done != count or failed or first is None or last is None:
        raise BenchError(f"{figure}: {done} of {count} jobs succeeded, {failed} failed")
    seconds = last - first
    params = {
        "jobs": count,
        "engine": table.engine,
        "replicas": replicas,
        "processes_per_replica": processes,
        "concurrency_per_replica": slots if slots is not None else f"default ({default_concurrency()})",
        "seconds": round(seconds, 3),
        "first_claim_after_due_ms": round((first - due) * 1000, 1),
        "runtime": "serve",
    }
    return Measurement(figure, count / seconds, "jobs/s", "leasehold", params)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """SQLite with one replica, then PostgreSQL with each replica count (1 and 3)."""
    count = ctx.sizes.serve_drain_jobs
    yield measure(ctx, sqlite_copy(ctx, count, "serve-drain.db"), 1, "leasehold.serve_drain.sqlite.r1")
    template = pg_template(ctx, count)
    for replicas in ctx.sizes.pg_replicas:
        database = ctx.postgres.database(f"drain_r{replicas}", template=template)
        yield measure(ctx, database, replicas, f"leasehold.serve_drain.pg.r{replicas}")


def run_defaults(ctx: RoundContext) -> Iterator[RoundItem]:
    """PostgreSQL, two replicas, each `serve` at its defaults (no --concurrency)."""
    count = ctx.sizes.serve_drain_jobs
    database = ctx.postgres.database("drain_r2_defaults", template=pg_template(ctx, count))
    yield measure(ctx, database, 2, "leasehold.serve_drain.pg.r2.defaults", concurrency=None)


def run_pgqueuer(ctx: RoundContext) -> Iterator[RoundItem]:
    """The baseline: pgqueuer's drain of the same count on a fresh copy of its template."""
    count = ctx.sizes.serve_drain_jobs
    template = pgqueuer_bench.template(ctx.postgres, ctx.directory, count)
    database = ctx.postgres.database("pgqueuer", template=template)
    yield pgqueuer_bench.drain(ctx.directory, database, count, ctx.sizes.pgqueuer_batch_size, DRAIN_TIMEOUT)
