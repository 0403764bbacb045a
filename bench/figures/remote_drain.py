"""Remote drain: jobs/s of N pre-seeded no-op jobs run by 1 and by 2 `leasehold worker` processes,
against `serve`'s own in-process runtime draining the same count in the same round.

The question is whether moving handlers out of the server costs throughput: every job then takes
a Claim (batched, up to the worker's free slots), a Complete call and the server's fenced write,
where the in-process runtime calls the handler directly.

All three cases use SQLite, the kind `bench.remote-noop` (bench.handlers; a no-op) and a fresh
copy of one template, held back and released by the start gate (bench.gate) exactly as the
serve-drain figures do, so process start-up is outside the figure:

* in-process (the baseline): `serve --concurrency 64`, the kind local;
* w1, w2: `serve --remote-kinds bench.remote-noop` (its in-process runtime then never claims the
  kind) and 1 or 2 `leasehold worker --handlers bench.handlers --concurrency 64` processes, each
  waited on until it logs `worker.started`. Two workers have 128 slots between them; what they
  share is the one server that every Claim and Complete goes through.

Figure: N / (latest `completed_at` - earliest `started_at`), the server's own stamps, as in
bench.figures.serve_drain. Every job must have succeeded at its first attempt (a lease lost or a
job handed back would show as a second one), or the figure fails.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from bench import gate
from bench.common import BenchError, FigureSkipped, Measurement, wait_until
from bench.context import RoundContext, RoundItem, Skipped
from bench.jobtable import JobTable
from bench.procs import WorkerProcess, leasehold_server, leasehold_workers, stop_workers

KIND = "bench.remote-noop"
DRAIN_TIMEOUT = 600.0
REMOTE_SERVER_CONCURRENCY = 2  # the server's runtime has nothing to run here


def measure(ctx: RoundContext, database: Path, workers: int, figure: str) -> Measurement:
    """Drain `database` (holding `remote_drain_jobs` held-back jobs): in-process when `workers`
    is 0, else with that many worker processes."""
    count = ctx.sizes.remote_drain_jobs
    concurrency = ctx.sizes.drain_concurrency
    name = f"remote-drain-w{workers}"
    remote = (KIND,) if workers else ()
    with (
        JobTable(database) as table,
        leasehold_server(
            ctx.directory,
            database,
            REMOTE_SERVER_CONCURRENCY if workers else concurrency,
            remote_kinds=remote,
            name=name,
        ) as server,
    ):
        processes: list[WorkerProcess] = []
        try:
            if workers:
                label = f"{name}-worker"
                processes = leasehold_workers(ctx.directory, server, remote, concurrency, workers, name=label)
            due = gate.release(table.make_due, table.vacuum, count)
            wait_until(
                lambda: (
                    server.alive()
                    and all(p.alive() for p in processes)
                    and table.status_count("succeeded") >= count
                ),
                DRAIN_TIMEOUT,
                f"{figure}: every job to succeed",
                0.1,
            )
            done, first, last = table.succeeded_window()
            failed = table.status_count("failed")
            attempts = table.max_attempt()
        finally:
            stop_workers(processes)
    if done != count or failed or attempts != 1 or first is None or last is None:
        raise BenchError(
            f"{figure}: {done} of {count} jobs succeeded, {failed} failed, at most {attempts} attempts"
        )
    seconds = last - first
    params = {
        "jobs": count,
        "engine": "sqlite",
        "workers": workers,
        "runtime": "leasehold worker" if workers else "in-process",
        "concurrency_per_process": concurrency,
        "seconds": round(seconds, 3),
        "first_claim_after_due_ms": round((first - due) * 1000, 1),
    }
    return Measurement(figure, count / seconds, "jobs/s", "leasehold", params)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """In-process first (the baseline), then 1 and 2 workers, each on a fresh held-back copy.
    A build without `leasehold worker` still measures the baseline and skips the rest."""
    template = ctx.templates.jobs(KIND, ctx.sizes.remote_drain_jobs)
    for workers in (0, *ctx.sizes.remote_drain_workers):
        database = ctx.copy(template, f"remote-drain-w{workers}-jobs.db")
        with JobTable(database) as table:
            table.hold_back()
        try:
            yield measure(ctx, database, workers, _figure(workers))
        except FigureSkipped as skip:
            remote = [_figure(w) for w in ctx.sizes.remote_drain_workers if w >= workers]
            yield Skipped(tuple(remote), str(skip))
            return


def _figure(workers: int) -> str:
    return f"leasehold.remote_drain.{f'w{workers}' if workers else 'in_process'}"
