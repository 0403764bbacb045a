"""`serve --processes N` at N = 1 and 2, in the same round (DESIGN §20), group `processes`.

Each figure is measured against a fresh `serve --processes N` on a fresh SQLite file (N = 1 is a
plain `serve`), with the same client either way:

* `leasehold.processes.drain.nN`: jobs/s draining the held-back no-op queue of `serve_drain`
  (bench.figures.serve_drain, same rule: first claim to last completion), `serve` at its
  defaults, so N processes bring N x the default slots and share the file's one write lock.
* `leasehold.processes.enqueue.nN`: Enqueue RPC/s at 64 in flight from one client process over
  8 TCP connections (the kernel spreads connections, not calls, over the processes), against
  `--concurrency 1` serving `bench.hold` so that the runtime does no work (as figure (a)).
* `leasehold.processes.burst_lag.nN.p50/.p99`: the 300-job burst of bench.figures.burst_lag,
  the users' shape: one client process, one channel, so every call and stream reaches one
  process while the jobs run in both and their events cross over the sibling bus.

The N = 2 / N = 1 ratios are reported (bench.targets); the closing note and docs/performance.md
say what they mean on two cores and what to expect on more.
"""

from __future__ import annotations

from collections.abc import Iterator

from bench.context import RoundContext, RoundItem
from bench.figures import burst_lag, enqueue, serve_drain
from bench.procs import leasehold_server

COUNTS = (1, 2)
IN_FLIGHT = 64
CONNECTIONS = 8


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    count = ctx.sizes.serve_drain_jobs
    for n in COUNTS:
        database = serve_drain.sqlite_copy(ctx, count, f"processes-drain-n{n}.db")
        yield serve_drain.measure(
            ctx, database, 1, f"leasehold.processes.drain.n{n}", concurrency=None, processes=n
        )
    for n in COUNTS:
        with leasehold_server(
            ctx.directory, ctx.directory / f"processes-enqueue-n{n}.db", 1, name=f"enqueue-n{n}", processes=n
        ) as server:
            figure = enqueue.unary_rate(
                ctx, server, IN_FLIGHT, f"leasehold.processes.enqueue.n{n}", "leasehold", CONNECTIONS
            )
            figure.params.update(processes=n, server_concurrency=1, kind=enqueue.HELD_KIND)
            yield figure
    label, jobs, owners = ctx.sizes.burst_lag_cases[0]
    for n in COUNTS:
        yield from burst_lag.measure(
            ctx, label, jobs, owners, processes=n, figure=f"processes.burst_lag.n{n}"
        )
