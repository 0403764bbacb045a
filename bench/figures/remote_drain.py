"""Remote drain: jobs/s of N pre-seeded no-op jobs run by 1 and by 2 `leasehold worker` processes,
against `serve`'s own in-process runtime draining the same count in the same round, all at the
same total concurrency (64 execution slots).

The question is whether moving handlers out of the server costs throughput: every job then takes
a Claim (batched, up to the worker's free slots), a Complete call and the server's fenced write,
where the in-process runtime calls the handler directly.

All three cases use SQLite, the kind `bench.remote-noop` (bench.handlers; a no-op) and a fresh
copy of one template, held back and released by the start gate (bench.gate) exactly as the
serve-drain figures do, so process start-up is outside the figure:

* in-process (the baseline): `serve --concurrency 64`, the kind local;
* w1, w2: `serve --remote-kinds bench.remote-noop` (its in-process runtime then never claims the
  kind) and `leasehold worker --handlers bench.handlers` processes, each waited on until it logs
  `worker.started`: w1 is one worker with `--concurrency 64`, w2 two with `--concurrency 32`
  each. The total is 64 slots in every case, so w2 asks whether a second process (a second
  interpreter for the client side of every call) adds throughput at the same concurrency, not
  whether twice the slots do. What the two workers share is the one server that every Claim and
  Complete goes through.

Figure: N / (latest `completed_at` - earliest `started_at`), the server's own stamps, as in
bench.figures.serve_drain. Every job must have succeeded at its first attempt (a lease lost or a
job handed back would show as a second one), or the figure fails.

`drain()` is shared with bench.figures.node_drain, which measures the same drain with Node
workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench import gate
from bench.common import BenchError, FigureSkipped, Measurement, wait_until
from bench.context import RoundContext, RoundItem, Skipped
from bench.jobtable import JobTable
from bench.procs import ServerProcess, WorkerProcess, leasehold_server, leasehold_workers, stop_workers

KIND = "bench.remote-noop"
DRAIN_TIMEOUT = 600.0
STALL_SECONDS = 15.0  # no job succeeded for this long: the drain is stuck
REMOTE_SERVER_CONCURRENCY = 2  # the server's runtime has nothing to run here

# Starts the worker processes for a server (routing KIND to remote workers) and returns them
# once each is claiming.
StartWorkers = Callable[[ServerProcess], list[WorkerProcess]]


class Progress:
    """Whether every job has succeeded yet; raises BenchError once none has finished for
    STALL_SECONDS (after the gate a no-op job finishes in milliseconds: a drain that stops
    moving has lost jobs, and waiting out DRAIN_TIMEOUT would only hide it for ten minutes)."""

    def __init__(self, figure: str, table: JobTable, count: int) -> None:
        self.figure = figure
        self.table = table
        self.count = count
        self.succeeded = -1
        self.since = time.monotonic()

    def done(self) -> bool:
        succeeded = self.table.status_count("succeeded")
        if succeeded >= self.count:
            return True
        now = time.monotonic()
        if succeeded != self.succeeded:
            self.succeeded, self.since = succeeded, now
        elif now - self.since > STALL_SECONDS:
            raise BenchError(
                f"{self.figure}: stuck at {succeeded} of {self.count} jobs succeeded, none for "
                f"{STALL_SECONDS:g} s; jobs by status: {self.table.status_counts()}, "
                f"at most {self.table.max_attempt()} attempts"
            )
        return False


def held_back_copy(ctx: RoundContext, name: str) -> Path:
    """A fresh copy of the run's template of `remote_drain_jobs` jobs of KIND, every job held back
    for the start gate."""
    template = ctx.templates.jobs(KIND, ctx.sizes.remote_drain_jobs)
    database = ctx.copy(template, f"{name}-jobs.db")
    with JobTable(database) as table:
        table.hold_back()
    return database


def drain(
    ctx: RoundContext,
    database: Path,
    figure: str,
    name: str,
    start_workers: StartWorkers | None,
    params: dict[str, Any],
) -> Measurement:
    """Drain `database` (holding `remote_drain_jobs` held-back jobs of KIND): in-process by
    `serve --concurrency drain_concurrency` when `start_workers` is None, else by the workers it
    starts for a `serve --remote-kinds KIND`. `params` are added to the figure's."""
    count = ctx.sizes.remote_drain_jobs
    remote = start_workers is not None
    with (
        JobTable(database) as table,
        leasehold_server(
            ctx.directory,
            database,
            REMOTE_SERVER_CONCURRENCY if remote else ctx.sizes.drain_concurrency,
            remote_kinds=(KIND,) if remote else (),
            name=name,
        ) as server,
    ):
        processes: list[WorkerProcess] = []
        try:
            if start_workers is not None:
                processes = start_workers(server)
            due = gate.release(table.make_due, table.vacuum, count)
            progressing = Progress(figure, table, count)
            wait_until(
                lambda: server.alive() and all(p.alive() for p in processes) and progressing.done(),
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
    measured = {
        "jobs": count,
        "engine": "sqlite",
        **params,
        "seconds": round(seconds, 3),
        "first_claim_after_due_ms": round((first - due) * 1000, 1),
    }
    return Measurement(figure, count / seconds, "jobs/s", "leasehold", measured)


def measure_in_process(ctx: RoundContext, figure: str, name: str) -> Measurement:
    """The baseline: `serve`'s in-process runtime at `drain_concurrency`, the kind local."""
    database = held_back_copy(ctx, name)
    params = {
        "workers": 0,
        "runtime": "in-process",
        "concurrency_per_process": ctx.sizes.drain_concurrency,
        "total_concurrency": ctx.sizes.drain_concurrency,
    }
    return drain(ctx, database, figure, name, None, params)


def measure(ctx: RoundContext, workers: int, figure: str) -> Measurement:
    """`workers` `leasehold worker` processes sharing `drain_concurrency` slots between them."""
    name = f"remote-drain-w{workers}"
    database = held_back_copy(ctx, name)
    concurrency = ctx.sizes.drain_concurrency // workers

    def start(server: ServerProcess) -> list[WorkerProcess]:
        return leasehold_workers(ctx.directory, server, (KIND,), concurrency, workers, name=f"{name}-worker")

    params = {
        "workers": workers,
        "runtime": "leasehold worker",
        "concurrency_per_process": concurrency,
        "total_concurrency": concurrency * workers,
    }
    return drain(ctx, database, figure, name, start, params)


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """In-process first (the baseline), then 1 and 2 workers, each on a fresh held-back copy.
    A build without `leasehold worker` still measures the baseline and skips the rest."""
    yield measure_in_process(ctx, _figure(0), "remote-drain-w0")
    for workers in ctx.sizes.remote_drain_workers:
        try:
            yield measure(ctx, workers, _figure(workers))
        except FigureSkipped as skip:
            remote = [_figure(w) for w in ctx.sizes.remote_drain_workers if w >= workers]
            yield Skipped(tuple(remote), str(skip))
            return


def _figure(workers: int) -> str:
    return f"leasehold.remote_drain.{f'w{workers}' if workers else 'in_process'}"
