"""(g) Peak RSS of a `serve` process holding 100,000 queued jobs and 1,000 idle watchers.

`serve --concurrency 1` on a fresh copy of a template with N queued `bench.hold` jobs (the same
template as the claim-cost figure): one job is claimed and held forever, the rest stay queued.
One client process opens one WatchEvents stream on each of W queued jobs (the most recently
enqueued ones), each stream gets its replayed `job.queued` and then waits. Once every stream has
its first message and `settle` seconds more have passed, the figure is VmHWM (the peak resident
set size since the process started) from /proc/PID/status, in MB (2^20 bytes); VmRSS at that
moment is in params.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from bench.common import Measurement, read_only, wait_until
from bench.context import RoundContext, RoundItem
from bench.procs import Child, leasehold_server


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    sizes = ctx.sizes
    directory = ctx.directory
    template = ctx.templates.jobs("bench.hold", sizes.rss_queued)
    conn = read_only(template)
    try:
        rows = conn.execute("SELECT id FROM jobs ORDER BY seq DESC LIMIT ?", (sizes.rss_watchers,)).fetchall()
    finally:
        conn.close()
    job_ids = [row[0] for row in rows]
    ready, stop = directory / "ready", directory / "stop"
    with leasehold_server(directory, ctx.copy(template, "rss.db"), 1) as server:
        watchers = Child(
            directory,
            "idle-watchers",
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
                "every idle watcher to subscribe",
            )
            if watchers.done():
                watchers.result(0)  # raises with the child's log
            time.sleep(
                sizes.rss_settle_seconds
            )  # the measurement's own settle time, not a wait for a condition
            peak_kb = server.status_kb("VmHWM")
            rss_kb = server.status_kb("VmRSS")
            stop.touch()
            result = watchers.result(60.0)
    params = {
        "queued": sizes.rss_queued,
        "watchers": sizes.rss_watchers,
        "server_concurrency": 1,
        "vm_rss_mb": round(rss_kb / 1024, 1),
        "settle_s": sizes.rss_settle_seconds,
        "watch_messages": result["messages"],
    }
    yield Measurement("leasehold.peak_rss", peak_kb / 1024, "MB", "leasehold", params)
