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
file, and each handler appends a `bench.tick` event about every 500 ms (jittered) for S seconds.
Lag of a delivery = the watcher's receipt stamp minus the event's commit stamp (below), over every
(event, watcher) pair; p50/p99 (p95 and max in params). Deliveries missing at the end fail the
figure.

Remote live lag (group `remote_live_lag`) is the same case with the handlers moved out: `serve
--remote-kinds bench.ticker` and one `leasehold worker --concurrency J` running the tickers, so
the server's event loop only serves RPCs (the tickers' AppendEvent calls and the watchers'
streams).

Every watcher also reads each `bench.tick` event's `created_at` (the server's wall-clock stamp,
taken inside the write transaction just before its commit) onto the monotonic clock
(bench.watchers.watch_live). Every figure's lag starts from it (a LiveCase's `commit_stamp`,
"server"): the rest of the write batch and its commit count as lag, so a figure errs long. The
handler's stamp, taken when its `append_event` returned ("handler"), would hide lag: the storage
writer wakes a commit's watchers before it answers the caller, in-process or remote, so watchers
usually hear of an event before the handler does. Params give the same deliveries' p50/p99/max
from the other stamp (`other_stamp`), and the CPU share of the server, the worker and each
client process over the window from the go signal to the last stream's end.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.baselines.grpc_noop import JOB_ID
from bench.common import (
    BenchError,
    FigureSkipped,
    Measurement,
    cpu_seconds,
    latency_summary,
    read_stamps,
    wait_until,
)
from bench.context import RoundContext, RoundItem, Skipped
from bench.load import WATCH_METHOD
from bench.procs import (
    Child,
    ServerProcess,
    WorkerProcess,
    leasehold_server,
    leasehold_worker,
    noop_server,
    run_child,
)
from leasehold.v1 import jobs_pb2

REMOTE_SERVER_CONCURRENCY = 2  # with the tickers remote the server's runtime runs nothing


def enqueue_tickers(
    directory: Path,
    name: str,
    server: ServerProcess,
    count: int,
    go: Path,
    seconds: float,
    interval: float,
    beat: bool = False,
) -> list[str]:
    """Enqueue `count` `bench.ticker` jobs on `server` (from a child process): each
    waits for the file `go`, then appends a stamped event every `interval` for
    `seconds` (jittered; with `beat`, all together on the beat the go file names, see
    bench.handlers). Returns their ids."""
    payload: dict[str, Any] = {"go": str(go), "seconds": seconds, "interval": interval}
    if beat:
        payload["beat"] = True
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


@dataclass(frozen=True)
class LiveCase:
    """One live-lag measurement: `jobs` tickers, `per_job` watchers on each, split over
    `processes` client processes; every ticker appends about every `interval` for `seconds`."""

    prefix: str  # figures `{prefix}.p50` and `{prefix}.p99`
    jobs: int
    per_job: int
    processes: int
    seconds: float
    interval: float
    settle: float
    remote: bool = False
    # Where a delivery's lag starts: "handler", when the handler's append_event returned (the
    # commit, then the answer's trip back: in-process a wake-up, remote an RPC reply); or
    # "server", the event's `created_at`, stamped by the server inside the write transaction,
    # just before its commit (the rest of that batch and the commit count as lag).
    commit_stamp: str = "server"

    @property
    def figures(self) -> tuple[str, str]:
        return (f"{self.prefix}.p50", f"{self.prefix}.p99")


def _classic(ctx: RoundContext, prefix: str, remote: bool) -> LiveCase:
    """Case (e), live lag: the live_* sizes, many watchers on each of a few jobs."""
    sizes = ctx.sizes
    return LiveCase(
        prefix,
        sizes.live_jobs,
        sizes.live_watchers_per_job,
        sizes.live_watcher_processes,
        sizes.live_seconds,
        sizes.live_interval,
        sizes.live_settle_seconds,
        remote,
    )


def run_live_lag(ctx: RoundContext) -> Iterator[RoundItem]:
    yield from measure_live_lag(ctx, _classic(ctx, "leasehold.live_lag", remote=False))


def run_remote_live_lag(ctx: RoundContext) -> Iterator[RoundItem]:
    """Live lag with the tickers in a `leasehold worker` process: serve only serves RPCs."""
    yield from live_lag_or_skip(ctx, _classic(ctx, "leasehold.remote_live_lag", remote=True))


def live_lag_or_skip(ctx: RoundContext, case: LiveCase) -> Iterator[RoundItem]:
    """measure_live_lag, with a build that has no `leasehold worker` reported as skipped."""
    try:
        yield from measure_live_lag(ctx, case)
    except FigureSkipped as skip:
        yield Skipped(case.figures, str(skip))


@contextlib.contextmanager
def _live_server(
    directory: Path, stamps: Path, case: LiveCase
) -> Iterator[tuple[ServerProcess, list[ServerProcess | WorkerProcess]]]:
    """In-process: serve runs the tickers itself, one slot per job. Remote: serve routes
    `bench.ticker` to one `leasehold worker` with a slot per job, which writes the stamps.
    Yields the server and the processes that run handlers (for their CPU time)."""
    env = {"BENCH_STAMPS": str(stamps)}
    if not case.remote:
        with leasehold_server(directory, directory / "live.db", case.jobs, env=env) as server:
            yield server, [server]
        return
    kinds = ("bench.ticker",)
    database = directory / "remote-live.db"
    with (
        leasehold_server(
            directory, database, REMOTE_SERVER_CONCURRENCY, remote_kinds=kinds, name="remote-live"
        ) as server,
        leasehold_worker(directory, server, kinds, case.jobs, env=env, name="remote-live-worker") as worker,
    ):
        yield server, [server, worker]


def measure_live_lag(ctx: RoundContext, case: LiveCase) -> Iterator[RoundItem]:
    """Run `case` in its own subdirectory of the round's directory; yields its p50 and p99."""
    directory = ctx.directory / case.prefix.removeprefix("leasehold.")
    directory.mkdir()
    stamps = directory / "live.stamps"
    go = directory / "go"
    processes = case.processes
    timeout = case.seconds + 180
    with _live_server(directory, stamps, case) as (server, runners):
        job_ids = enqueue_tickers(
            directory, "live-enqueue", server, case.jobs, go, case.seconds, case.interval
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
                            "per_job": case.per_job,
                            "ready_path": str(directory / f"ready-{i}"),
                            "receipts_path": str(directory / f"receipts-{i}"),
                            "timeout": timeout,
                            "server_stamps_path": str(directory / f"server-stamps-{i}"),
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
            time.sleep(case.settle)
            cpu_before = [cpu_seconds(p.process.pid) for p in runners]
            began = time.monotonic()
            go.touch()
            results = [child.result(timeout) for child in children]
            wall = time.monotonic() - began
            cpu_used = [
                cpu_seconds(p.process.pid) - before for p, before in zip(runners, cpu_before, strict=True)
            ]
        finally:
            for child in children:
                child.kill()
    lags, other, events = deliveries(
        stamps,
        [directory / f"receipts-{i}" for i in range(processes)],
        [directory / f"server-stamps-{i}" for i in range(processes)],
        case.commit_stamp,
    )
    expected = events * case.per_job
    if not lags:
        raise BenchError(f"{case.prefix}: no event was delivered")
    summary = latency_summary(lags)
    other_summary = latency_summary(other)
    params: dict[str, Any] = {
        "jobs": case.jobs,
        "watchers": case.jobs * case.per_job,
        "watcher_processes": processes,
        "seconds": case.seconds,
        "interval_ms": case.interval * 1000,
        "settle_s": case.settle,
        "events": events,
        "deliveries": len(lags),
        "missing_deliveries": expected - len(lags),
        "streams_ended": sum(int(r["ended"]) for r in results),
        "events_per_job": round(events / case.jobs, 2),
        "p95_ms": round(summary["p95"], 3),
        "max_ms": round(summary["max"], 3),
        "lag_from": case.commit_stamp,
        "other_stamp": other_stamp_params(case.commit_stamp, other_summary),
        # Share of one core used from the go signal until the last stream ended: a figure whose
        # server sits near 100 % is bound by the server's CPU; the clients' share shows that
        # they were not the bottleneck.
        "window_s": round(wall, 3),
        "server_cpu_pct": round(100 * cpu_used[0] / wall, 1),
        "client_cpu_pct": [round(100 * float(r.get("cpu_seconds", 0.0)) / wall, 1) for r in results],
    }
    if case.remote:
        params["handlers"] = "leasehold worker"
        params["worker_cpu_pct"] = round(100 * cpu_used[1] / wall, 1)
    if expected != len(lags):
        raise BenchError(f"{case.prefix}: {expected - len(lags)} of {expected} deliveries missing")
    for p, figure in zip(("p50", "p99"), case.figures, strict=True):
        yield Measurement(figure, summary[p], "ms", "leasehold", params)


def deliveries(
    stamps: Path, receipt_files: list[Path], server_stamp_files: list[Path], commit_stamp: str
) -> tuple[list[float], list[float], int]:
    """(every delivery's lag from `commit_stamp`, the same deliveries' lags from the other
    stamp, how many events the handlers appended), from the handlers' stamps file and the
    subscribers' receipts and commit stamps (bench.watchers). Every event the handlers appended
    counts, whichever stamp the lag starts from; a receipt of an event no handler stamped is
    not a delivery."""
    handler_stamps = {(job_id, sequence): at for job_id, sequence, at in read_stamps(stamps)}
    server_stamps: dict[tuple[str, int], float] = {}
    receipts: list[tuple[str, int, float]] = []
    for path in receipt_files:
        receipts += read_stamps(path)
    for path in server_stamp_files:
        for job_id, sequence, at in read_stamps(path):
            server_stamps.setdefault((job_id, sequence), at)

    def lags_from(commits: dict[tuple[str, int], float]) -> list[float]:
        return [at - commits[(job, seq)] for job, seq, at in receipts if (job, seq) in commits]

    commits = {key: server_stamps.get(key, at) for key, at in handler_stamps.items()}
    lags = lags_from(commits if commit_stamp == "server" else handler_stamps)
    other = lags_from(handler_stamps if commit_stamp == "server" else commits)
    return lags, other, len(commits)


def other_stamp_params(commit_stamp: str, other_summary: dict[str, float]) -> dict[str, Any]:
    """The same deliveries measured from the other stamp, for comparison."""
    return {
        "from": "server" if commit_stamp == "handler" else "handler",
        **{f"{p}_ms": round(other_summary[p], 3) for p in ("p50", "p99", "max")},
    }
