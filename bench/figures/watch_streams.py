"""Server memory with 2,000 idle WatchEvents streams (DESIGN §13's stream limits say what a
stream may cost; this says what it does cost).

`serve --concurrency 1` on a fresh copy of a template with W queued `bench.hold` jobs: one job is
claimed and held forever, the rest stay queued. After the server settles, VmRSS is read (the
server with no stream); then one client process opens one WatchEvents stream on each of the W
jobs (over W/100 HTTP/2 connections), every stream gets its replayed events and then waits.
Once every stream has its first message and `settle` seconds more have passed, VmRSS is read
again, from /proc/PID/status, in MB (2^20 bytes):

* `leasehold.watch_streams.rss`: the server's VmRSS with the W streams open (target: at most
  200 MB for W = 2,000, the ceiling (g) sets for 1,000 watchers and 100,000 queued jobs);
* `leasehold.watch_streams.kb_per_stream`: (with - without) / W, in KiB (reported).

The streams all belong to one owner, so the server runs with `--max-watch-streams-per-owner`
raised to W (the default of 1,000 would refuse half of them, as it should).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from bench.common import Measurement, read_only, wait_until
from bench.context import RoundContext, RoundItem
from bench.procs import Child, leasehold_server


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    streams = ctx.sizes.watch_streams
    settle = ctx.sizes.watch_streams_settle_seconds
    directory = ctx.directory
    template = ctx.templates.jobs("bench.hold", streams)
    conn = read_only(template)
    try:
        job_ids = [row[0] for row in conn.execute("SELECT id FROM jobs ORDER BY seq").fetchall()]
    finally:
        conn.close()
    ready, stop = directory / "ready", directory / "stop"
    env = {"LEASEHOLD_MAX_WATCH_STREAMS_PER_OWNER": str(streams)}
    with leasehold_server(directory, ctx.copy(template, "watch-streams.db"), 1, env=env) as server:
        time.sleep(settle)  # the measurement's own settle time, not a wait for a condition
        without_kb = server.status_kb("VmRSS")
        watchers = Child(
            directory,
            "idle-streams",
            "bench.watchers:watch_idle",
            {
                "target": server.target,
                "job_ids": job_ids,
                "ready_path": str(ready),
                "stop_path": str(stop),
                "timeout": 300.0,
            },
        )
        with watchers:
            wait_until(
                lambda: server.alive() and (ready.exists() or watchers.done()),
                120.0,
                "every idle stream to subscribe",
            )
            if watchers.done():
                watchers.result(0)  # raises with the child's log
            time.sleep(settle)  # likewise
            with_kb = server.status_kb("VmRSS")
            stop.touch()
            result = watchers.result(60.0)
    params = {
        "streams": streams,
        "server_concurrency": 1,
        "rss_without_streams_mb": round(without_kb / 1024, 1),
        "settle_s": settle,
        "watch_messages": result["messages"],
    }
    yield Measurement("leasehold.watch_streams.rss", with_kb / 1024, "MB", "leasehold", params)
    per_stream = (with_kb - without_kb) / streams
    yield Measurement("leasehold.watch_streams.kb_per_stream", per_stream, "KiB", "leasehold", params)
