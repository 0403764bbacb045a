"""The Celery baseline's application: Celery 5 on Redis, durable like Leasehold, and two tasks.

The worker runs as Celery's own command line, `python -m celery -A bench.baselines.celery_app
worker --pool prefork --concurrency 2`, in its own process; that command imports this module and
takes its module-level `app`, so the broker's URL comes from the BENCH_CELERY_BROKER environment
variable. Producers build the same app with `make_app(url)`; the tasks have explicit names so both
sides agree.

Settings (everything else is Celery's default):
* `task_acks_late`: a task is acknowledged after it has run, so a worker that dies mid-task
  leaves it in Redis to run again (Leasehold's lease gives the same promise);
* `task_ignore_result` and no result backend: nothing is stored per task but the message;
* `broker_connection_retry_on_startup`: only silences Celery 5's deprecation warning (the bench
  starts the worker once Redis answers PING, so there is nothing to retry).

Instrumentation (the only additions to a plain Celery app), each one write(2) on an O_APPEND
descriptor of $BENCH_STAMPS, opened lazily in the pool process that runs the task:
* `noop` appends `run <entry> <exit>` (two `time.monotonic()` readings) as it returns: the drain
  is timed from the earliest entry to the latest exit;
* `stamp(i)` appends `<i> 0 <monotonic>` on entry (trickle latency).
"""

from __future__ import annotations

import os
import time
from typing import Any

from celery import Celery

from bench.common import append_line, open_append

BROKER_ENV = "BENCH_CELERY_BROKER"
STAMPS_ENV = "BENCH_STAMPS"
NOOP_TASK = "bench.noop"
STAMP_TASK = "bench.stamp"

_fd: int | None = None


def _write(text: str) -> None:
    global _fd
    if _fd is None:
        path = os.environ.get(STAMPS_ENV)
        if not path:
            return
        _fd = open_append(path)
    append_line(_fd, text)


def make_app(broker: str) -> Celery:
    """A Celery app on the Redis at `broker` with the bench's settings and tasks."""
    instance = Celery("bench", broker=broker, set_as_current=False)
    instance.conf.update(
        task_acks_late=True,
        task_ignore_result=True,
        result_backend=None,
        broker_connection_retry_on_startup=True,
    )

    @instance.task(name=NOOP_TASK)
    def noop() -> None:
        entry = time.monotonic()
        _write(f"run {entry:.6f} {time.monotonic():.6f}")

    @instance.task(name=STAMP_TASK)
    def stamp(i: int) -> None:
        _write(f"{i} 0 {time.monotonic():.6f}")

    return instance


def task(instance: Celery, name: str) -> Any:
    """The registered task `name` of `instance` (for `apply_async`)."""
    return instance.tasks[name]


# `celery -A bench.baselines.celery_app worker` imports this; producers call make_app() instead.
app = make_app(os.environ[BROKER_ENV]) if os.environ.get(BROKER_ENV) else None
