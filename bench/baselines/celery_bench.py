"""The Celery baseline: Celery 5 on Redis 7, set up to keep what it acknowledged, as Leasehold does.

Redis is Debian's `redis-server`, started by the bench for each round of the `celery` group
and again for the trickle, each time on a free loopback port with its own data directory and,
on the command line, `--appendonly yes --appendfsync always` (every write reaches the disk
before Redis answers it) and `--save ""` (no RDB snapshots: the append-only file is the durable
copy, and a snapshot's background fork must not land inside a measurement). The worker is
Celery's own command, `celery -A bench.baselines.celery_app worker --pool prefork --concurrency 2
--loglevel INFO`, with `task_acks_late` and results off (bench.baselines.celery_app); everything
else is Celery's default (prefetch multiplier 4, so at most 8 unacknowledged tasks per worker).
Every phase below starts a fresh worker: the drain's on its full queue, the others' on an empty
one once its `ready.` log line is out (an INFO line: the bench needs that log level).

* enqueue: one producer process sends N no-op tasks with `apply_async`, one at a time (Celery's
  client is synchronous: one call in flight), through one producer whose connection is opened
  before the clock starts, with no worker running. Figure: N / the time from just before the
  first send to just after the last.
* drain: those N tasks (Redis is asked that its `celery` list holds exactly N), then a worker
  starts. Figure: N / (latest exit - earliest entry), both `time.monotonic()` stamps the no-op
  task takes itself, as huey's drain uses the consumer's own stamps. The acknowledgement of the
  last task (after its exit) is outside the span.
* e2e: a worker is up; one producer sends N no-op tasks as fast as it can (as above) while it
  drains. Figure: N / (latest task exit - just before the first send).
* trickle: a worker is up; a producer sends one no-op outside the schedule (connection and code
  paths warm), then `count` stamp tasks on a fixed schedule `interval` apart, stamping
  `time.monotonic()` just before each send; each task stamps its entry. Latency is entry minus
  send; p50/p95/p99 over all tasks. The worker waits on Redis with BRPOP, so an idle worker hears
  of a task at once (no poll back-off to keep out of the figure). This one runs in the `trickle`
  group (run_trickle), just before Leasehold's trickle that is divided by it.

Without `redis-server` (found on PATH, or named by $BENCH_REDIS_SERVER) or without Celery and its
Redis client, each of these figures is reported as skipped, saying what to install.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import BenchError, Measurement, latency_summary, tail, wait_until
from bench.context import RoundContext, RoundItem, Skipped
from bench.procs import interrupt, run_child, spawn

WORKER_CONCURRENCY = 2
QUEUE = "celery"  # Celery's default queue: a Redis list of that name
REDIS_ENV = "BENCH_REDIS_SERVER"
START_TIMEOUT = 60.0
GROUP_FIGURES = ("baseline.celery.enqueue", "baseline.celery.drain", "baseline.celery.e2e")
TRICKLE_FIGURES = tuple(f"baseline.celery.trickle.{p}" for p in ("p50", "p95", "p99"))
FIGURES = GROUP_FIGURES + TRICKLE_FIGURES


def missing() -> str | None:
    """Why this machine cannot run the Celery baseline, or None."""
    binary = os.environ.get(REDIS_ENV, "redis-server")
    if shutil.which(binary) is None:
        return f"{binary} not found (install it: apt-get install redis-server)"
    for module in ("celery", "redis"):
        if importlib.util.find_spec(module) is None:
            return f"Python package {module} not installed (pip install -e '.[bench]')"
    return None


# ----- run inside child processes -----------------------------------------------------------------


def _producer(broker: str) -> tuple[Any, Any]:
    """The app's no-op and stamp tasks, and a producer whose connection is open."""
    from bench.baselines.celery_app import NOOP_TASK, STAMP_TASK, make_app, task

    app = make_app(broker)
    producer = app.producer_pool.acquire(block=True)
    producer.connection.ensure_connection(max_retries=3)
    return (task(app, NOOP_TASK), task(app, STAMP_TASK)), producer


def send_noops(broker: str, count: int) -> dict[str, Any]:
    """`count` no-op tasks, one `apply_async` at a time."""
    (noop, _), producer = _producer(broker)
    began = time.monotonic()
    for _ in range(count):
        noop.apply_async(producer=producer)
    ended = time.monotonic()
    producer.release()
    return {"tasks": count, "first_send": began, "seconds": ended - began}


def trickle_producer(broker: str, count: int, interval: float) -> list[tuple[int, float]]:
    """One warm-up no-op, then `count` stamp tasks `interval` apart on a fixed schedule;
    (i, monotonic just before the send)."""
    (noop, stamp), producer = _producer(broker)
    noop.apply_async(producer=producer)
    sent: list[tuple[int, float]] = []
    start = time.monotonic() + 0.1
    for i in range(count):
        delay = start + i * interval - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        at = time.monotonic()
        stamp.apply_async((i,), producer=producer)
        sent.append((i, at))
    producer.release()
    return sent


# ----- Redis and the worker (in the bench process) ------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _command(port: int, *words: str) -> bytes:
    """One inline Redis command; the raw first line of its answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(" ".join(words).encode() + b"\r\n")
        answer = b""
        while not answer.endswith(b"\r\n"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.strip()


class BenchRedis:
    """A redis-server of our own: loopback, free port, its own data directory, fsync per write."""

    def __init__(self, directory: Path) -> None:
        binary = shutil.which(os.environ.get(REDIS_ENV, "redis-server")) or "redis-server"
        data = directory / "redis"
        data.mkdir()
        self.log_path = directory / "redis.log"
        self.port = _free_port()
        args = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(data)]
        args += ["--appendonly", "yes", "--appendfsync", "always", "--save", ""]
        args += ["--daemonize", "no", "--protected-mode", "yes", "--logfile", str(self.log_path)]
        self.process = spawn(args, self.log_path)
        try:
            wait_until(lambda: self.alive() and self._pong(), START_TIMEOUT, "redis-server to answer PING")
        except BaseException:
            self.stop()
            raise

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _pong(self) -> bool:
        try:
            return _command(self.port, "PING") == b"+PONG"
        except OSError:
            return False

    def alive(self) -> bool:
        code = self.process.poll()
        if code is not None:
            raise BenchError(f"redis-server exited with status {code}:\n{tail(self.log_path)}")
        return True

    def queued(self) -> int:
        answer = _command(self.port, "LLEN", QUEUE)
        if not answer.startswith(b":"):
            raise BenchError(f"redis LLEN {QUEUE}: {answer!r}")
        return int(answer[1:])

    def stop(self) -> None:
        interrupt(self.process)  # SIGINT: Redis shuts down cleanly (and fsyncs)

    def __enter__(self) -> BenchRedis:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Worker:
    """`celery worker`, prefork, 2 processes; ready once it logs `celery@... ready.`."""

    def __init__(self, directory: Path, redis: BenchRedis, stamps: Path, name: str) -> None:
        args = [sys.executable, "-m", "celery", "-A", "bench.baselines.celery_app", "worker"]
        args += ["--pool", "prefork", "--concurrency", str(WORKER_CONCURRENCY), "--loglevel", "INFO"]
        args += ["--hostname", f"{name}@%h"]
        env = {"BENCH_CELERY_BROKER": redis.url, "BENCH_STAMPS": str(stamps)}
        self.log_path = directory / f"{name}.log"
        self.process: subprocess.Popen[bytes] = spawn(args, self.log_path, env)

    def alive(self) -> bool:
        code = self.process.poll()
        if code is not None:
            raise BenchError(f"celery worker exited with status {code}:\n{tail(self.log_path)}")
        return True

    def wait_ready(self) -> None:
        def ready() -> bool:
            return self.alive() and b" ready." in self.log_path.read_bytes()

        wait_until(ready, START_TIMEOUT, "the celery worker to be ready", interval=0.05)

    def stop(self) -> None:
        interrupt(self.process)  # SIGINT: Celery's warm shutdown

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _stamp_lines(stamps: Path) -> list[list[str]]:
    if not stamps.exists():
        return []
    return [parts for parts in (line.split() for line in stamps.read_text().splitlines()) if len(parts) == 3]


def _runs(stamps: Path) -> list[tuple[float, float]]:
    """The no-op task's `run <entry> <exit>` lines."""
    return [(float(entry), float(end)) for key, entry, end in _stamp_lines(stamps) if key == "run"]


def _entries(stamps: Path) -> dict[int, float]:
    """The stamp task's `<i> 0 <entry>` lines (the warm-up no-op's `run` line is not one)."""
    return {int(key): float(at) for key, _, at in _stamp_lines(stamps) if key.isdigit()}


def _lines(stamps: Path) -> int:
    try:
        return stamps.read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


# ----- the figures --------------------------------------------------------------------------------


def enqueue_and_drain(ctx: RoundContext, redis: BenchRedis, count: int, timeout: float) -> list[Measurement]:
    sent = run_child(
        ctx.directory,
        "celery-enqueue",
        "bench.baselines.celery_bench:send_noops",
        {"broker": redis.url, "count": count},
        timeout,
    )
    queued = redis.queued()
    if queued != count:
        raise BenchError(f"celery enqueue: Redis holds {queued} of {count} tasks")
    enqueue = Measurement(
        "baseline.celery.enqueue",
        count / float(sent["seconds"]),
        "tasks/s",
        "baseline",
        {"tasks": count, "in_flight": 1, "seconds": round(float(sent["seconds"]), 3)},
    )
    stamps = ctx.directory / "celery-drain.stamps"
    with Worker(ctx.directory, redis, stamps, "celery-drain") as worker:
        wait_until(
            lambda: worker.alive() and _lines(stamps) >= count, timeout, "celery to drain its queue", 0.1
        )
    runs = _runs(stamps)
    if len(runs) != count:
        raise BenchError(f"celery drain: {len(runs)} of {count} tasks ran")
    seconds = max(end for _, end in runs) - min(entry for entry, _ in runs)
    drain = Measurement(
        "baseline.celery.drain",
        count / seconds,
        "tasks/s",
        "baseline",
        {"tasks": count, "workers": WORKER_CONCURRENCY, "pool": "prefork", "seconds": round(seconds, 3)},
    )
    return [enqueue, drain]


def e2e(ctx: RoundContext, redis: BenchRedis, count: int, timeout: float) -> Measurement:
    stamps = ctx.directory / "celery-e2e.stamps"
    with Worker(ctx.directory, redis, stamps, "celery-e2e") as worker:
        worker.wait_ready()
        sent = run_child(
            ctx.directory,
            "celery-e2e-producer",
            "bench.baselines.celery_bench:send_noops",
            {"broker": redis.url, "count": count},
            timeout,
        )
        wait_until(
            lambda: worker.alive() and _lines(stamps) >= count, timeout, "celery to run every e2e task", 0.1
        )
    runs = _runs(stamps)
    if len(runs) != count:
        raise BenchError(f"celery e2e: {len(runs)} of {count} tasks ran")
    seconds = max(end for _, end in runs) - float(sent["first_send"])
    params = {
        "tasks": count,
        "workers": WORKER_CONCURRENCY,
        "seconds": round(seconds, 3),
        "enqueue_rate": round(count / float(sent["seconds"]), 1),
    }
    return Measurement("baseline.celery.e2e", count / seconds, "tasks/s", "baseline", params)


def trickle(ctx: RoundContext, redis: BenchRedis, count: int, interval: float) -> list[Measurement]:
    stamps = ctx.directory / "celery-trickle.stamps"
    timeout = count * interval + 90
    with Worker(ctx.directory, redis, stamps, "celery-trickle") as worker:
        worker.wait_ready()
        sent = run_child(
            ctx.directory,
            "celery-trickle-producer",
            "bench.baselines.celery_bench:trickle_producer",
            {"broker": redis.url, "count": count, "interval": interval},
            timeout,
        )
        wait_until(
            lambda: worker.alive() and len(_entries(stamps)) >= count,
            30.0,
            "celery to run every trickle task",
        )
    entries = _entries(stamps)
    latencies = [entries[i] - at for i, at in sent if i in entries]
    if len(latencies) != count:
        raise BenchError(f"celery trickle: {count - len(latencies)} of {count} tasks never started")
    summary = latency_summary(latencies)
    params = {
        "tasks": count,
        "interval_ms": interval * 1000,
        "workers": WORKER_CONCURRENCY,
        "max_ms": round(summary["max"], 3),
    }
    return [
        Measurement(f"baseline.celery.trickle.{p}", summary[p], "ms", "baseline", params)
        for p in ("p50", "p95", "p99")
    ]


def run(ctx: RoundContext) -> Iterator[RoundItem]:
    """The `celery` group: enqueue, drain and end to end, on one Redis of this round's own."""
    reason = missing()
    if reason is not None:
        yield Skipped(GROUP_FIGURES, reason)
        return
    sizes = ctx.sizes
    timeout = 600.0
    with BenchRedis(ctx.directory) as redis:
        yield from enqueue_and_drain(ctx, redis, sizes.celery_tasks, timeout)
        yield e2e(ctx, redis, sizes.e2e_jobs, timeout)


def run_trickle(ctx: RoundContext) -> Iterator[RoundItem]:
    """The trickle, on a Redis of its own: the `trickle` group runs it right beside Leasehold's,
    which is divided by it, as it runs huey's."""
    reason = missing()
    if reason is not None:
        yield Skipped(TRICKLE_FIGURES, reason)
        return
    with BenchRedis(ctx.directory) as redis:
        yield from trickle(ctx, redis, ctx.sizes.trickle_count, ctx.sizes.trickle_interval)
