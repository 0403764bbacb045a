"""The huey baseline's application: `SqliteHuey` with its defaults and two no-op tasks.

The consumer runs as huey's own command line, `python -m huey.bin.huey_consumer
bench.baselines.huey_app.huey -w 2 -k thread`, in its own process; that command needs a module-level
instance, so the database file comes from the BENCH_HUEY_DB environment variable. Producers build
the same instance with `make_app(path)`; the tasks have explicit names so both sides agree.

Instrumentation (the only additions to a plain huey app):
* every worker thread's start-up hook appends `start 0 <monotonic>` to $BENCH_STAMPS: the earliest
  is "consumer start";
* a SIGNAL_COMPLETE handler counts finished tasks and, when the count reaches $BENCH_HUEY_EXPECT,
  appends `done <count> <monotonic>`: "last task complete";
* the `stamp` task appends `<i> 0 <monotonic>` on entry (trickle latency).
Each is one write(2) on an O_APPEND descriptor, which costs about what Leasehold's bench handlers
pay for theirs.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

from huey import SqliteHuey
from huey.signals import SIGNAL_COMPLETE

from bench.common import append_line, open_append

NOOP_TASK = "bench.noop"
STAMP_TASK = "bench.stamp"


class _Stamps:
    def __init__(self) -> None:
        path = os.environ.get("BENCH_STAMPS")
        self.fd = open_append(path) if path else None
        self.expect = int(os.environ.get("BENCH_HUEY_EXPECT", "0"))
        self.completed = 0
        self.lock = threading.Lock()

    def write(self, text: str) -> None:
        if self.fd is not None:
            append_line(self.fd, text)


@dataclass(frozen=True)
class HueyApp:
    huey: SqliteHuey
    noop: Any  # huey TaskWrapper: calling it enqueues the task
    stamp: Any


def make_app(path: str) -> HueyApp:
    """A SqliteHuey on `path` with huey's defaults, and the bench tasks registered."""
    instance = SqliteHuey("bench", filename=path)
    stamps = _Stamps()

    @instance.task(name=NOOP_TASK)
    def noop() -> None:
        return None

    @instance.task(name=STAMP_TASK)
    def stamp(i: int) -> None:
        stamps.write(f"{i} 0 {time.monotonic():.6f}")

    @instance.on_startup()
    def started() -> None:
        stamps.write(f"start 0 {time.monotonic():.6f}")

    @instance.signal(SIGNAL_COMPLETE)
    def completed(signal: str, task: Any, *args: Any, **kwargs: Any) -> None:
        with stamps.lock:
            stamps.completed += 1
            if stamps.completed == stamps.expect:
                stamps.write(f"done {stamps.completed} {time.monotonic():.6f}")

    return HueyApp(instance, noop, stamp)


# The consumer command line imports this; producers call make_app() instead.
huey = make_app(os.environ["BENCH_HUEY_DB"]).huey if os.environ.get("BENCH_HUEY_DB") else None
