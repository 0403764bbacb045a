"""Job kinds for the benchmark, loaded by `leasehold serve --handlers bench.handlers`.

* `bench.noop`: returns at once (drain, end to end).
* `bench.remote-noop`: the same no-op under another name, so the remote-drain figure can route
  it to `leasehold worker` processes (`serve --remote-kinds bench.remote-noop`) or leave it to the
  in-process runtime, with one handler module loaded by both commands.
* `bench.append_one`: appends exactly one small `bench.append` event (`{"n": 1}`) through the
  context, as `example.echo` does, then returns (the append-cost figures).
* `bench.hold`: never returns on its own (until the job's timeout or shutdown), so a server with
  `--concurrency 1` holds one job and its runtime stays idle while Enqueue is measured.
* `bench.stamp`: records `time.monotonic()` on entry (trickle latency).
* `bench.link`: records `time.monotonic()` on entry (sequence 0) and just before it returns
  (sequence 1), in one write once it is done: a chain of jobs (bench.figures.graphs) measures
  from one link's return to the next link's entry.
* `bench.ticker`: waits for the file named in its payload's `go`, then for `seconds` appends a
  `bench.tick` event about every `interval` seconds (jittered +-20 %, first one at a random offset
  so a hundred tickers do not fire in lockstep), recording when each `append_event` returned (the
  stamps are written once, when the job ends). Under `leasehold worker` the same handler
  runs in the worker process, where `append_event` returns once the server has answered the
  AppendEvent call (i.e. committed it). With `"beat": true` in its payload it ticks on the beat
  instead, the way jobs that report progress together do (DESIGN §20): the go file holds one
  `time.monotonic()` instant T0, and every ticker appends at T0, T0 + interval, ... with no
  jitter and no offset, so all of them append in the same moment.

`bench.remote` has no handler on purpose: `serve --remote-kinds bench.remote` accepts it and only
a WorkerService client (the claim-wakeup figure's) ever takes it.

Stamps go, one `job_id sequence monotonic` line per stamp, to the file named by the BENCH_STAMPS
environment variable (sequence 0 for an entry stamp). CLOCK_MONOTONIC is one clock for the whole
machine on Linux, so the bench compares these stamps with ones taken in its client processes.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from bench.common import append_line, open_append
from leasehold.worker import HandlerRegistry, JobContext

STAMPS_ENV = "BENCH_STAMPS"
GO_WAIT_SECONDS = 300.0
_stamp_fd: int | None = None


def stamp(key: str, sequence: int, at: float) -> None:
    """Append one stamp line to $BENCH_STAMPS (one write(2); no-op when the variable is unset)."""
    stamps(key, [(sequence, at)])


def stamps(key: str, taken: list[tuple[int, float]]) -> None:
    """Append a line per (sequence, monotonic) stamp, all in one write(2)."""
    global _stamp_fd
    if not taken:
        return
    if _stamp_fd is None:
        path = os.environ.get(STAMPS_ENV)
        if not path:
            return
        _stamp_fd = open_append(path)
    append_line(_stamp_fd, "\n".join(f"{key} {sequence} {at:.6f}" for sequence, at in taken))


async def noop(ctx: JobContext) -> None:
    return None


async def append_one(ctx: JobContext) -> None:
    await ctx.append_event("bench.append", {"n": 1})


async def hold(ctx: JobContext) -> None:
    await asyncio.Event().wait()


async def entry_stamp(ctx: JobContext) -> None:
    stamp(ctx.job_id, 0, time.monotonic())


async def link(ctx: JobContext) -> None:
    entered = time.monotonic()
    stamps(ctx.job_id, [(0, entered), (1, time.monotonic())])


async def ticker(ctx: JobContext) -> None:
    go = str(ctx.payload["go"])
    seconds = float(ctx.payload.get("seconds", 10.0))
    interval = float(ctx.payload.get("interval", 0.5))
    deadline = time.monotonic() + GO_WAIT_SECONDS
    while not os.path.exists(go):
        if time.monotonic() > deadline:
            raise TimeoutError("bench.ticker: no go signal")
        await asyncio.sleep(0.05)
    # Kept until the job ends: a write(2) per tick would load the very server (or worker) whose
    # lag is measured with the instrument's own cost.
    ticks: list[tuple[int, float]] = []
    try:
        if ctx.payload.get("beat"):
            await _on_the_beat(ctx, float(Path(go).read_text()), seconds, interval, ticks)
        else:
            await _jittered(ctx, seconds, interval, ticks)
    finally:
        stamps(ctx.job_id, ticks)


async def _jittered(ctx: JobContext, seconds: float, interval: float, ticks: list[tuple[int, float]]) -> None:
    end = time.monotonic() + seconds
    await asyncio.sleep(random.uniform(0.0, interval))
    while time.monotonic() < end:
        await _tick(ctx, ticks)
        await asyncio.sleep(interval * random.uniform(0.8, 1.2))


async def _on_the_beat(
    ctx: JobContext, start: float, seconds: float, interval: float, ticks: list[tuple[int, float]]
) -> None:
    """Beat k falls at `start + k * interval` whatever the previous append cost, so a slow
    append is not hidden by pushing every later beat back."""
    for beat in range(round(seconds / interval)):
        await asyncio.sleep(max(0.0, start + beat * interval - time.monotonic()))
        await _tick(ctx, ticks)


async def _tick(ctx: JobContext, ticks: list[tuple[int, float]]) -> None:
    event = await ctx.append_event("bench.tick", {"i": len(ticks) + 1})
    ticks.append((event.sequence, time.monotonic()))


def register(registry: HandlerRegistry) -> None:
    registry.register("bench.noop", noop)
    registry.register("bench.remote-noop", noop)
    registry.register("bench.hold", hold)
    registry.register("bench.stamp", entry_stamp)
    registry.register("bench.link", link)
    registry.register("bench.ticker", ticker)
    registry.register("bench.append_one", append_one)
