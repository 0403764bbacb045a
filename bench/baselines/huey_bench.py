"""The huey baseline: `SqliteHuey` with its defaults, consumer with 2 thread workers in its own
process (huey's own `huey_consumer` command, which also sets up its INFO logging, as in production).

* drain: a template holding N pre-enqueued no-op tasks is made once per bench run (one huey
  enqueue per task, huey's only way) and copied for each round. The figure is N divided by the
  time from the consumer's start (the earliest worker start-up hook) to the SIGNAL_COMPLETE of
  the N-th task, both `time.monotonic()` stamps taken inside the consumer.
* trickle: a consumer on an empty database; once it has started, a producer process enqueues
  `count` stamp tasks on a fixed schedule `interval` apart, stamping `time.monotonic()` just
  before each enqueue; each task stamps its entry. Latency is entry minus enqueue. The consumer
  polls its queue (first after 0.1 s, backing off x1.15 per empty poll up to 10 s, resetting after
  a task), so starting the producer promptly keeps that back-off out of the figure.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from bench.baselines.huey_app import make_app
from bench.common import BenchError, Measurement, checkpoint, latency_summary, read_stamps, wait_until
from bench.procs import interrupt, run_child, spawn

CONSUMER_WORKERS = 2


# ----- run inside child processes -----------------------------------------------------------------


def enqueue_noops(database: str, count: int) -> dict[str, Any]:
    """Fill a template: `count` no-op tasks, one huey enqueue each."""
    app = make_app(database)
    began = time.monotonic()
    for _ in range(count):
        app.noop()
    app.huey.storage.close()
    checkpoint(Path(database))
    return {"tasks": count, "seconds": time.monotonic() - began}


def trickle_producer(database: str, count: int, interval: float) -> list[tuple[int, float]]:
    """Enqueue `count` stamp tasks `interval` apart on a fixed schedule; (i, monotonic before)."""
    app = make_app(database)
    sent: list[tuple[int, float]] = []
    start = time.monotonic() + 0.05
    for i in range(count):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        at = time.monotonic()
        app.stamp(i)
        sent.append((i, at))
    app.huey.storage.close()
    return sent


# ----- orchestration (in the bench process) -------------------------------------------------------


def make_template(directory: Path, count: int) -> Path:
    template = directory / f"huey-{count}.db"
    run_child(
        directory,
        f"seed-huey-{count}",
        "bench.baselines.huey_bench:enqueue_noops",
        {"database": str(template), "count": count},
        timeout=600,
    )
    return template


def _consumer(directory: Path, database: Path, stamps: Path, expect: int, name: str) -> Any:
    args = [sys.executable, "-m", "huey.bin.huey_consumer", "bench.baselines.huey_app.huey"]
    args += ["-w", str(CONSUMER_WORKERS), "-k", "thread"]
    env = {"BENCH_HUEY_DB": str(database), "BENCH_STAMPS": str(stamps), "BENCH_HUEY_EXPECT": str(expect)}
    return spawn(args, directory / f"{name}.log", env)


def drain(directory: Path, database: Path, count: int, timeout: float) -> Measurement:
    """Drain `database` (a fresh copy of the template holding `count` tasks)."""
    stamps = directory / "huey-drain.stamps"
    consumer = _consumer(directory, database, stamps, count, "huey-drain")
    try:
        wait_until(
            lambda: any(key == "done" for key, _, _ in read_stamps(stamps)) or consumer.poll() is not None,
            timeout,
            "huey to drain its queue",
            interval=0.05,
        )
    finally:
        interrupt(consumer)
    marks = read_stamps(stamps)
    starts = [at for key, _, at in marks if key == "start"]
    done = [at for key, _, at in marks if key == "done"]
    if not starts or not done:
        raise BenchError(f"huey drain: consumer stopped early (see {directory / 'huey-drain.log'})")
    seconds = done[0] - min(starts)
    return Measurement(
        "baseline.huey.drain",
        count / seconds,
        "tasks/s",
        "baseline",
        {"tasks": count, "workers": CONSUMER_WORKERS, "worker_type": "thread", "seconds": round(seconds, 3)},
    )


def trickle(directory: Path, count: int, interval: float, timeout: float) -> list[Measurement]:
    database = directory / "huey-trickle.db"
    stamps = directory / "huey-trickle.stamps"
    consumer = _consumer(directory, database, stamps, count, "huey-trickle")
    try:
        wait_until(
            lambda: any(key == "start" for key, _, _ in read_stamps(stamps)) or consumer.poll() is not None,
            30.0,
            "the huey consumer to start",
        )
        sent = run_child(
            directory,
            "huey-trickle-producer",
            "bench.baselines.huey_bench:trickle_producer",
            {"database": str(database), "count": count, "interval": interval},
            timeout,
        )
        wait_until(
            lambda: (
                sum(1 for key, _, _ in read_stamps(stamps) if key.isdigit()) >= count
                or consumer.poll() is not None
            ),
            30.0,
            "huey to run every trickle task",
        )
    finally:
        interrupt(consumer)
    entries = {int(key): at for key, _, at in read_stamps(stamps) if key.isdigit()}
    latencies = [entries[i] - at for i, at in sent if i in entries]
    if len(latencies) != count:
        raise BenchError(f"huey trickle: {count - len(latencies)} of {count} tasks never started")
    summary = latency_summary(latencies)
    params = {
        "tasks": count,
        "interval_ms": interval * 1000,
        "workers": CONSUMER_WORKERS,
        "max_ms": round(summary["max"], 3),
    }
    return [
        Measurement(f"baseline.huey.trickle.{p}", summary[p], "ms", "baseline", params)
        for p in ("p50", "p95", "p99")
    ]
