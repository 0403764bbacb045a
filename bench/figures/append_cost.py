"""Appending jobs vs no-op jobs: what one handler event costs a drain, on SQLite (group
`append_cost`) and on PostgreSQL (group `pg_append_cost`).

Both figures of a pair drain N = 10,000 pre-seeded jobs through one `serve --concurrency 64`
in the same round, timed exactly as bench.figures.serve_drain times its drains (its code):
the jobs are seeded once per run through the repository (a SQLite template file, or a
PostgreSQL template database), each round drains a fresh copy whose jobs are held back (due in
a month), the server starts and settles, and the start gate (bench.gate) makes every job due at
one instant. Figure: N / (latest `completed_at` - earliest `started_at`), the server's own
stamps, in jobs/s.

* `leasehold.append_cost.{sqlite,pg}.noop`: `bench.noop` jobs, which return at once;
* `leasehold.append_cost.{sqlite,pg}.append`: `bench.append_one` jobs, which append exactly one
  small event (`bench.append`, payload `{"n": 1}`) through the job context, as `example.echo`
  does, then return. After the drain the bench counts the `bench.append` events: there must be
  exactly N, or the figure fails.

The no-op drain runs first, then the appending one. The targets divide append by noop round by
round (the goal: at least 0.7, i.e. an event costs a drain at most 30 %).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bench.common import BenchError, Measurement
from bench.context import RoundContext, RoundItem
from bench.figures import serve_drain
from bench.jobtable import JobTable
from bench.postgres import PgDatabase

CONCURRENCY = 64
CASES = (("noop", "bench.noop"), ("append", "bench.append_one"))
EVENT_TYPE = "bench.append"


def _measure(ctx: RoundContext, database: Path | PgDatabase, engine: str, case: str) -> Measurement:
    count = ctx.sizes.append_cost_jobs
    figure = f"leasehold.append_cost.{engine}.{case}"
    measurement = serve_drain.measure(ctx, database, 1, figure, count=count, concurrency=CONCURRENCY)
    with JobTable(database) as table:
        events = table.event_count(EVENT_TYPE)
    expected = count if case == "append" else 0
    if events != expected:
        raise BenchError(f"{figure}: {events} {EVENT_TYPE} events, expected {expected}")
    measurement.params["handler_events_per_job"] = 1 if case == "append" else 0
    return measurement


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """SQLite: a fresh held-back copy of each kind's template."""
    count = ctx.sizes.append_cost_jobs
    for case, kind in CASES:
        database = serve_drain.sqlite_copy(ctx, count, f"append-cost-{case}.db", kind)
        yield _measure(ctx, database, "sqlite", case)


def run_postgres(ctx: RoundContext) -> Iterator[RoundItem]:
    """PostgreSQL: a fresh database copied from each kind's template."""
    count = ctx.sizes.append_cost_jobs
    for case, kind in CASES:
        template = serve_drain.pg_template(ctx, count, kind)
        database = ctx.postgres.database(f"append_cost_{case}", template=template)
        yield _measure(ctx, database, "pg", case)
