"""Live lag under load: N running jobs, each followed by its own WatchEvents stream, each
reporting about 10 progress events over about 2 s (the shape of the built-in `example.sleep`
job: 2 s in 10 steps), for N = 10, 300 and 1,000 (group `load_lag`), and N = 300 with the
handlers in a `leasehold worker` (group `remote_load_lag`).

This is figure (e)'s live-lag measurement (bench.figures.watch.measure_live_lag, the same code)
with another shape: many jobs with one watcher each instead of a few jobs with many watchers.

* In-process (`leasehold.load_lag.N.p50/.p99`): one `serve --concurrency N` (one slot per job)
  runs N `bench.ticker` jobs with interval 0.2 s and seconds 2.0: each waits for the go file,
  then appends a `bench.tick` event every 0.2 s (jittered +-20 %, the first at a random offset
  under 0.2 s) for 2 s.
* Remote (`leasehold.remote_load_lag.300.p50/.p99`): `serve --remote-kinds bench.ticker` (its own
  runtime then runs nothing) and one `leasehold worker --concurrency 300` running the tickers.

In both, a delivery's lag starts at the event's `created_at`, the server's own wall-clock stamp
taken inside the write transaction just before it commits, which each watcher reads from the
event and moves onto the monotonic clock (bench.watchers.watch_live): the rest of that write
batch and its `synchronous=FULL` commit count as lag, so the figure errs long, never short. The
handler's stamp (when `append_event` returned) would hide lag: the storage writer wakes a
commit's watchers before it answers the writer's caller, so a watcher usually hears of an event
before the handler does (its p50/p99 are still given in params, `other_stamp`, below zero).

One watcher per job, the streams split round-robin over P client processes, P = N / 250
rounded up, at least 2 and at most 4 (10 and 300 jobs: 2 processes; 1,000: 4), at most 100
streams per HTTP/2 connection (bench.watchers). Every stream subscribes first; once all have
received their first message and a settle time (2 s) has passed, the bench creates the go file.
Lag of a delivery = the watcher's receipt stamp (taken before decoding) minus the commit stamp,
over every (event, watcher) pair: p50 and p99 (p95, max, counts in params). A delivery missing at
the end fails the figure.

Beside the latencies, params give `events_per_job` (under 10 when appends are slowed down: a
ticker's next append waits for its previous one) and the share of one core each process used
from the go signal until the last stream ended (`server_cpu_pct`, `worker_cpu_pct`;
`client_cpu_pct` per client process, counted from the moment its streams were all ready, so an
upper bound): a server near 100 % is CPU-bound, and clients well under it were not the
bottleneck.

With `--quick` the figures keep their names (`.10`, `.300`, `.1000`) but run toy job counts
(Sizes.load_lag_cases; the real count is `jobs` in params), like every `--quick` figure.
"""

from __future__ import annotations

from collections.abc import Iterator

from bench.context import RoundContext, RoundItem
from bench.figures.watch import LiveCase, live_lag_or_skip, measure_live_lag

STREAMS_PER_PROCESS = 250
MIN_PROCESSES = 2
MAX_PROCESSES = 4


def watcher_processes(streams: int) -> int:
    return max(MIN_PROCESSES, min(MAX_PROCESSES, -(-streams // STREAMS_PER_PROCESS)))


def _case(ctx: RoundContext, prefix: str, label: str, jobs: int, remote: bool) -> LiveCase:
    sizes = ctx.sizes
    return LiveCase(
        f"{prefix}.{label}",
        jobs,
        1,
        watcher_processes(jobs),
        sizes.load_lag_seconds,
        sizes.load_lag_interval,
        sizes.load_lag_settle_seconds,
        remote,
    )


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """N = 10, 300, 1,000 in that order, each with a fresh server and database."""
    for label, jobs in ctx.sizes.load_lag_cases:
        yield from measure_live_lag(ctx, _case(ctx, "leasehold.load_lag", label, jobs, remote=False))


def run_remote(ctx: RoundContext) -> Iterator[RoundItem]:
    """N = 300 with the tickers in one `leasehold worker` (skipped on a build without it)."""
    label, jobs = ctx.sizes.remote_load_lag_case
    yield from live_lag_or_skip(ctx, _case(ctx, "leasehold.remote_load_lag", label, jobs, remote=True))
