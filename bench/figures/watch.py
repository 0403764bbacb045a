"""(e) WatchEvents: replay throughput against baseline 1's streaming server, and live lag.

Replay: a template holds one succeeded job whose log has N `bench.tick` events (seeded in-process
before any server starts, bench.seed.seed_event_log). Per round the no-op server streams N
pre-built messages of the same shape, then `serve` (on a fresh copy of the template) replays the
log; both are read by the same client (bench.load.read_stream: one untimed read to warm caches,
then one timed read, messages / seconds from the call to the end of the stream). Leasehold's log
has 3 lifecycle events more than N; the rate is per message either way.

Live lag: `serve` with one slot per job runs J `bench.ticker` jobs; W watchers per job, split over
P client processes (bench.watchers.watch_live), subscribe first. Once every stream has received
its first message, and a settle time later (when a stream's first message arrives, the server
is still finishing the replay reads of the last subscriptions), the bench creates the "go"
file, and each handler appends a `bench.tick` event about every 500 ms (jittered) for S seconds,
stamping `time.monotonic()` when `append_event` returned (= committed). Lag of a delivery = the
watcher's receipt stamp minus that commit stamp, over every (event, watcher) pair; p50/p99 (p95
and max in params). Deliveries missing at the end fail the figure.

Remote live lag (group `remote_live_lag`) is the same case with the handlers moved out: `serve
--remote-kinds bench.ticker` and one `leasehold worker --concurrency J` running the tickers, so
the server's event loop only serves RPCs (the tickers' AppendEvent calls and the watchers'
streams). The commit stamp is then taken in the worker when its AppendEvent call has returned,
i.e. after the commit and the answer's trip back; a watcher may thus see an event a little before
its stamp exists, which only makes that delivery's lag smaller, never hides one.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.baselines.grpc_noop import JOB_ID
from bench.common import BenchError, FigureSkipped, Measurement, latency_summary, read_stamps, wait_until
from bench.context import RoundContext, RoundItem, Skipped
from bench.load import WATCH_METHOD
from bench.procs import Child, ServerProcess, leasehold_server, leasehold_worker, noop_server, run_child
from leasehold.v1 import jobs_pb2

REMOTE_SERVER_CONCURRENCY = 2  # the server's default; with the tickers remote it runs nothing


def enqueue_tickers(
    directory: Path, name: str, server: ServerProcess, count: int, go: Path, seconds: float, interval: float
) -> list[str]:
    """Enqueue `count` `bench.ticker` jobs on `server` (from a child process): each
    waits for the file `go`, then appends a stamped event every `interval` for
    `seconds`. Returns their ids."""
    payload = {"go": str(go), "seconds": seconds, "interval": interval}
    job_ids: list[str] = run_child(
        directory,
        name,
        "bench.load:enqueue_jobs",
        {"target": server.target, "kind": "bench.ticker", "payload": payload, "count": count},
        timeout=60,
    )
    return job_ids


def _read(ctx: RoundContext, server: ServerProcess, job_id: str, figure: str, side: str) -> Measurement:
    result = run_child(
        ctx.directory,
        f"stream-{figure}",
        "bench.load:read_stream",
        {
            "target": server.target,
            "method": WATCH_METHOD,
            "request_hex": jobs_pb2.WatchEventsRequest(job_id=job_id).SerializeToString().hex(),
        },
        timeout=300,
    )
    params = {"messages": result["messages"], "seconds": round(result["seconds"], 3), "warmup_reads": 1}
    return Measurement(figure, result["rate"], "msgs/s", side, params)


def run_replay(ctx: RoundContext) -> Iterator[RoundItem]:
    events = ctx.sizes.replay_events
    template, job_id = ctx.templates.event_log(events)
    with noop_server(ctx.directory, events) as noop:
        yield _read(ctx, noop, JOB_ID, "baseline.grpc_stream", "baseline")
    with leasehold_server(ctx.directory, ctx.copy(template, "replay.db"), 2) as server:
        yield _read(ctx, server, job_id, "leasehold.replay", "leasehold")


def run_live_lag(ctx: RoundContext) -> Iterator[RoundItem]:
    yield from _live_lag(ctx, "leasehold.live_lag", remote=False)


def run_remote_live_lag(ctx: RoundContext) -> Iterator[RoundItem]:
    """Live lag with the tickers in a `leasehold worker` process: serve only serves RPCs."""
    prefix = "leasehold.remote_live_lag"
    try:
        yield from _live_lag(ctx, prefix, remote=True)
    except FigureSkipped as skip:  # a build without `leasehold worker`
        yield Skipped((f"{prefix}.p50", f"{prefix}.p99"), str(skip))


@contextlib.contextmanager
def _live_server(ctx: RoundContext, stamps: Path, remote: bool) -> Iterator[ServerProcess]:
    """In-process: serve runs the tickers itself, one slot per job. Remote: serve routes
    `bench.ticker` to one `leasehold worker` with a slot per job, which writes the stamps."""
    sizes = ctx.sizes
    env = {"BENCH_STAMPS": str(stamps)}
    if not remote:
        with leasehold_server(ctx.directory, ctx.directory / "live.db", sizes.live_jobs, env=env) as server:
            yield server
        return
    kinds = ("bench.ticker",)
    database = ctx.directory / "remote-live.db"
    with (
        leasehold_server(
            ctx.directory, database, REMOTE_SERVER_CONCURRENCY, remote_kinds=kinds, name="remote-live"
        ) as server,
        leasehold_worker(ctx.directory, server, kinds, sizes.live_jobs, env=env, name="remote-live-worker"),
    ):
        yield server


def _live_lag(ctx: RoundContext, prefix: str, remote: bool) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    directory = ctx.directory
    stamps = directory / "live.stamps"
    go = directory / "go"
    processes = sizes.live_watcher_processes
    timeout = sizes.live_seconds + 180
    with _live_server(ctx, stamps, remote) as server:
        job_ids = enqueue_tickers(
            directory, "live-enqueue", server, sizes.live_jobs, go, sizes.live_seconds, sizes.live_interval
        )
        children = []
        try:
            for i in range(processes):
                children.append(
                    Child(
                        directory,
                        f"watchers-{i}",
                        "bench.watchers:watch_live",
                        {
                            "target": server.target,
                            "job_ids": job_ids[i::processes],
                            "per_job": sizes.live_watchers_per_job,
                            "ready_path": str(directory / f"ready-{i}"),
                            "receipts_path": str(directory / f"receipts-{i}"),
                            "timeout": timeout,
                        },
                    )
                )
            wait_until(
                lambda: (
                    server.alive()
                    and all(
                        (directory / f"ready-{i}").exists() or children[i].done() for i in range(processes)
                    )
                ),
                120.0,
                "every watcher to subscribe",
            )
            # The first message only proves the subscription exists; the server is still finishing
            # the replay reads of the last streams. Let that settle so the figure is the steady state.
            time.sleep(sizes.live_settle_seconds)
            go.touch()
            results = [child.result(timeout) for child in children]
        finally:
            for child in children:
                child.kill()
    commits = {(job_id, sequence): at for job_id, sequence, at in read_stamps(stamps)}
    lags = []
    for i in range(processes):
        for job_id, sequence, at in read_stamps(directory / f"receipts-{i}"):
            committed = commits.get((job_id, sequence))
            if committed is not None:
                lags.append(at - committed)
    expected = len(commits) * sizes.live_watchers_per_job
    if not lags:
        raise BenchError("live lag: no event was delivered")
    summary = latency_summary(lags)
    params: dict[str, Any] = {
        "jobs": sizes.live_jobs,
        "watchers": sizes.live_jobs * sizes.live_watchers_per_job,
        "watcher_processes": processes,
        "seconds": sizes.live_seconds,
        "interval_ms": sizes.live_interval * 1000,
        "settle_s": sizes.live_settle_seconds,
        "events": len(commits),
        "deliveries": len(lags),
        "missing_deliveries": expected - len(lags),
        "streams_ended": sum(int(r["ended"]) for r in results),
        "p95_ms": round(summary["p95"], 3),
        "max_ms": round(summary["max"], 3),
    }
    if remote:
        params["handlers"] = "leasehold worker"
    if expected != len(lags):
        raise BenchError(f"live lag: {expected - len(lags)} of {expected} deliveries missing")
    for p in ("p50", "p99"):
        yield Measurement(f"{prefix}.{p}", summary[p], "ms", "leasehold", params)
