"""The owner's feed (DESIGN §17, `JobService.Subscribe`), group `feed`, on SQLite, each figure
in the shape a backend following its jobs loads it: one Subscribe stream, from its own client
process, reading every event of the owner.

* Live lag (`leasehold.feed.lag.p50/.p99`): `serve` runs J = 300 `bench.ticker` jobs that report
  progress together, the shape DESIGN §20 fixes: every one appends a `bench.tick` event at T0,
  T0 + 0.2 s, ... for 10 s (5 a second, no jitter, no offset; T0 is written in the go file, see
  bench.handlers), so each beat is a burst of 300 appends. 300 long-running jobs need 300
  execution slots, and `--concurrency` is how a user gives them (the default, 64, would run 64
  tickers and queue the rest): the server gets `--concurrency 300` and otherwise its defaults
  (bench.procs.leasehold_server also passes `--lease-seconds 30 --poll-seconds 1 --log-level
  info`, which are the defaults). The subscriber (bench.watchers.follow_feed) opens its stream
  from the tail before the tickers are enqueued, sees all of them start, and a settle time later
  the bench writes the go file. Lag of a delivery = its receipt (taken before decoding) minus
  the event's `created_at`, the server's stamp inside the write transaction just before its
  commit, exactly as figure (e) measures WatchEvents (bench.figures.watch.deliveries): the rest
  of the write batch and the commit count as lag. Every tick the handlers appended must arrive,
  and the feed's positions must follow one another with no gap, or the figure fails.
* Catch-up replay (`leasehold.feed.replay`, against `baseline.grpc_feed_stream`): a template
  whose feed holds 1,000,000 events (200,000 succeeded jobs of 5 events each, seeded once a run,
  bench.seed.seed_feed) is copied each round; `serve` at its defaults starts on the copy and one
  client reads Subscribe from the start until it has the 1,000,000th message (the feed never
  ends, so the call is then cancelled); messages / seconds from the call to that message. The
  baseline is the no-op gRPC server streaming as many pre-built SubscribeResponse messages of
  the same shape to the same client (bench.load.read_stream). No untimed warm-up read: at a
  million messages a read lasts about a minute, the warm-up a first read pays is lost in it, and
  a second pass would double the group's time. `--quick` reads a small feed under the same name.
* Write-path cost (`leasehold.feed.write.subscribed` against `leasehold.feed.write.alone`): N =
  10,000 seeded `bench.append_one` jobs (each appends one event) drained by `serve` at its
  defaults, timed as bench.figures.serve_drain times every drain (first claim to last
  completion, the server's own stamps, behind the start gate), alone and then with a subscriber
  following the feed from the tail for the whole drain. The subscriber must receive every event
  the drain writes, in order and once: N `job.started`, N `bench.append` and N `job.succeeded`,
  positions without a gap, or the figure fails.

Each round measures all of them back to back, so the targets divide the two sides of a ratio
within a round.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from bench.common import BenchError, Measurement, cpu_seconds, latency_summary, wait_until
from bench.context import RoundContext, RoundItem
from bench.figures import serve_drain
from bench.figures.watch import deliveries, enqueue_tickers, other_stamp_params
from bench.handlers import STAMPS_ENV
from bench.jobtable import JobTable
from bench.load import SUBSCRIBE_METHOD
from bench.procs import Child, ServerProcess, leasehold_server, noop_server, run_child
from leasehold.v1 import jobs_pb2

TICKER_KIND = "bench.ticker"
APPEND_KIND = "bench.append_one"
APPEND_EVENT = "bench.append"
# From writing the go file to the first beat: every ticker looks for the file every 50 ms.
BEAT_MARGIN_SECONDS = 0.5
SUBSCRIBE_TIMEOUT = 60.0
LAG_FIGURES = ("leasehold.feed.lag.p50", "leasehold.feed.lag.p99")


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    yield from _live_lag(ctx)
    yield from _replay(ctx)
    yield from _write_cost(ctx)


def _until_touched(path: Path, server: ServerProcess, subscriber: Child) -> bool:
    """For wait_until: `path` exists; a server or subscriber that ended first fails at once."""
    if path.exists():
        return True
    if subscriber.done():
        subscriber.result(1.0)  # raises with its log when it failed
        raise BenchError(f"{subscriber.name} ended before {path.name}")
    server.alive()  # raises with its log once it has exited
    return False


def _write_go(go: Path, start: float) -> None:
    """The go file, holding the first beat's monotonic instant, appearing whole."""
    partial = go.with_suffix(".partial")
    partial.write_text(f"{start:.6f}")
    os.replace(partial, go)


def _live_lag(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    jobs = sizes.feed_lag_jobs
    directory = ctx.directory / "feed-lag"
    directory.mkdir()
    stamps, go = directory / "live.stamps", directory / "go"
    ready, running = directory / "ready", directory / "running"
    receipts, server_stamps = directory / "receipts", directory / "server-stamps"
    timeout = sizes.feed_lag_seconds + 180
    env = {STAMPS_ENV: str(stamps)}
    with leasehold_server(directory, directory / "feed-lag.db", jobs, env=env, name="feed-lag") as server:
        kwargs = {
            "target": server.target,
            "kind": TICKER_KIND,
            "jobs": jobs,
            "ready_path": str(ready),
            "timeout": timeout,
            "running_path": str(running),
            "receipts_path": str(receipts),
            "server_stamps_path": str(server_stamps),
        }
        with Child(directory, "feed-subscriber", "bench.watchers:follow_feed", kwargs) as subscriber:
            wait_until(lambda: _until_touched(ready, server, subscriber), SUBSCRIBE_TIMEOUT, "the subscriber")
            enqueue_tickers(
                directory,
                "feed-enqueue",
                server,
                jobs,
                go,
                sizes.feed_lag_seconds,
                sizes.feed_lag_interval,
                True,
            )
            wait_until(lambda: _until_touched(running, server, subscriber), 120.0, "every ticker to start")
            # Starting 300 jobs is a burst of its own; the figure is the steady beat after it.
            time.sleep(sizes.feed_lag_settle_seconds)
            cpu_before = cpu_seconds(server.pid)
            began = time.monotonic()
            _write_go(go, began + BEAT_MARGIN_SECONDS)
            result = subscriber.result(timeout)
            wall = time.monotonic() - began
            server_cpu = cpu_seconds(server.pid) - cpu_before
    lags, other, events = deliveries(stamps, [receipts], [server_stamps], "server")
    if not lags:
        raise BenchError("feed lag: no event was delivered")
    summary = latency_summary(lags)
    params: dict[str, Any] = {
        "jobs": jobs,
        "streams": 1,
        "serve": f"defaults, --concurrency {jobs}",
        "seconds": sizes.feed_lag_seconds,
        "interval_ms": sizes.feed_lag_interval * 1000,
        "beat": "all tickers together",
        "settle_s": sizes.feed_lag_settle_seconds,
        "events": events,
        "deliveries": len(lags),
        "missing_deliveries": events - len(lags),
        "feed_messages": result["messages"],
        "position_gaps": result["position_gaps"],
        "p95_ms": round(summary["p95"], 3),
        "max_ms": round(summary["max"], 3),
        "lag_from": "server",
        "other_stamp": other_stamp_params("server", latency_summary(other) if other else summary),
        "window_s": round(wall, 3),
        "server_cpu_pct": round(100 * server_cpu / wall, 1),
        "client_cpu_pct": round(100 * float(result["cpu_seconds"]) / wall, 1),
    }
    if len(lags) != events or result["position_gaps"]:
        raise BenchError(
            f"feed lag: {events - len(lags)} of {events} ticks missing, {result['position_gaps']} gaps"
        )
    for p, figure in zip(("p50", "p99"), LAG_FIGURES, strict=True):
        yield Measurement(figure, summary[p], "ms", "leasehold", params)


def _read_feed(ctx: RoundContext, server: ServerProcess, events: int, figure: str, side: str) -> Measurement:
    result = run_child(
        ctx.directory,
        f"stream-{figure}",
        "bench.load:read_stream",
        {
            "target": server.target,
            "method": SUBSCRIBE_METHOD,
            "request_hex": jobs_pb2.SubscribeRequest().SerializeToString().hex(),
            "warmups": 0,
            "limit": events,
        },
        timeout=events / 1_000 + 300,
    )
    params = {"messages": result["messages"], "seconds": round(result["seconds"], 3), "warmup_reads": 0}
    return Measurement(figure, result["rate"], "msgs/s", side, params)


def _replay(ctx: RoundContext) -> Iterator[RoundItem]:
    events = ctx.sizes.feed_replay_events
    per_job = ctx.sizes.feed_replay_events_per_job
    template = ctx.templates.feed(events, per_job)
    with noop_server(ctx.directory, events) as noop:
        yield _read_feed(ctx, noop, events, "baseline.grpc_feed_stream", "baseline")
    database = ctx.copy(template, "feed-replay.db")
    with leasehold_server(ctx.directory, database, None, name="feed-replay") as server:
        measurement = _read_feed(ctx, server, events, "leasehold.feed.replay", "leasehold")
    measurement.params.update({"jobs": events // per_job, "events_per_job": per_job, "serve": "defaults"})
    yield measurement


def _subscriber(
    directory: Path, jobs: int, results: list[dict[str, Any]]
) -> Callable[[ServerProcess], contextlib.AbstractContextManager[object]]:
    """serve_drain.measure's `alongside`: a feed subscriber from the tail, subscribed before the
    gate and read to the drain's last event; its result lands in `results`."""

    @contextlib.contextmanager
    def attach(server: ServerProcess) -> Iterator[None]:
        ready = directory / "write-ready"
        kwargs = {
            "target": server.target,
            "kind": APPEND_KIND,
            "jobs": jobs,
            "ready_path": str(ready),
            "timeout": serve_drain.DRAIN_TIMEOUT + 60,
        }
        with Child(directory, "feed-write-subscriber", "bench.watchers:follow_feed", kwargs) as child:
            wait_until(lambda: _until_touched(ready, server, child), SUBSCRIBE_TIMEOUT, "the subscriber")
            yield
            results.append(child.result(SUBSCRIBE_TIMEOUT))

    return attach


def _write_cost(ctx: RoundContext) -> Iterator[RoundItem]:
    count = ctx.sizes.feed_write_cost_jobs
    for case in ("alone", "subscribed"):
        figure = f"leasehold.feed.write.{case}"
        database = serve_drain.sqlite_copy(ctx, count, f"feed-write-{case}.db", APPEND_KIND)
        results: list[dict[str, Any]] = []
        alongside = _subscriber(ctx.directory, count, results) if case == "subscribed" else None
        measurement = serve_drain.measure(
            ctx, database, 1, figure, count=count, concurrency=None, alongside=alongside
        )
        with JobTable(database) as table:
            appended = table.event_count(APPEND_EVENT)
        if appended != count:
            raise BenchError(f"{figure}: {appended} {APPEND_EVENT} events, expected {count}")
        measurement.params["subscribers"] = len(results)
        if results:
            _check_received(figure, results[0], count)
            measurement.params["feed_messages"] = results[0]["messages"]
            measurement.params["subscriber_cpu_s"] = round(float(results[0]["cpu_seconds"]), 3)
        yield measurement


def _check_received(figure: str, result: dict[str, Any], count: int) -> None:
    """Every event the drain wrote, once each, in order: a start, an append and a success a job."""
    expected = {"job.started": count, APPEND_EVENT: count, "job.succeeded": count}
    if result["types"] != expected or result["position_gaps"]:
        raise BenchError(
            f"{figure}: the subscriber received {result['types']} with {result['position_gaps']} "
            f"position gaps, expected {expected} without a gap"
        )
