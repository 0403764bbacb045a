"""WatchEvents subscribers for the live-lag (e) and peak-RSS (g) figures, and the owner's feed
subscriber of the feed figures, run in child processes.

Each child opens many streams over a few channels (at most STREAMS_PER_CHANNEL per HTTP/2
connection, like a fleet of clients sharing connections), signals readiness by creating a file
once every stream has received its first message (the replayed `job.queued`, which proves the
server has the subscription), and records what it must:

* `watch_live`: for every `bench.tick` event, (job id, sequence, `time.monotonic()` at receipt,
  taken before decoding); streams end by themselves after the job's terminal event. It also
  reports the CPU time it used from the moment every stream was ready (i.e. the settle time and
  the measured window), so a figure can show its clients were not the bottleneck.
* `watch_idle`: nothing; it only holds its streams open until a stop file appears.
* `follow_feed`: one Subscribe stream from the tail of the bench owner's feed, as a backend
  following its jobs opens it. A stream from the tail carries nothing until something commits,
  so readiness is proven otherwise: once the stream is asked for, a GetStats call on the same
  connection is answered, and the server took the Subscribe first (it came first on the
  connection, and a subscription is registered before the handler's first await). It counts
  every message by type and checks the positions follow one another with no gap, records
  `bench.tick` receipts like `watch_live`, and ends once `jobs` jobs of `kind` have ended.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import grpc

from bench.common import METADATA
from bench.load import GET_STATS_METHOD, SUBSCRIBE_METHOD, WATCH_METHOD
from leasehold.v1 import jobs_pb2

STREAMS_PER_CHANNEL = 100
TERMINAL_EVENTS = frozenset({"job.succeeded", "job.failed", "job.cancelled"})


def clock_offset(readings: int = 50) -> float:
    """`time.time() - time.monotonic()`, from the least disturbed of `readings`: each
    brackets the wall clock between two monotonic reads. A process descheduled
    between its two calls would be off by as long as it was away, and on a busy
    machine that is milliseconds, enough to turn every lag of a run negative."""
    best_width, best_offset = float("inf"), 0.0
    for _ in range(readings):
        before = time.monotonic()
        wall = time.time()
        after = time.monotonic()
        if after - before < best_width:
            best_width, best_offset = after - before, wall - (before + after) / 2
    return best_offset


def commit_monotonic(event: jobs_pb2.JobEvent, wall_minus_monotonic: float) -> float:
    """The event's `created_at` (the server's wall-clock stamp, taken inside the write's
    transaction) on this machine's monotonic clock."""
    created = event.created_at.seconds + event.created_at.nanos / 1e9
    return created - wall_minus_monotonic


def write_stamps(path: str, stamps: Iterable[tuple[str, int, float]]) -> None:
    with open(path, "w") as out:
        out.writelines(f"{key} {sequence} {at:.6f}\n" for key, sequence, at in stamps)


async def _streams(
    target: str,
    job_ids: list[str],
    per_job: int,
    ready_path: str,
    timeout: float,
    on_message: Callable[[str, bytes, float], None],
    until: Callable[[], Awaitable[None]] | None = None,
    on_ready: Callable[[], None] | None = None,
) -> int:
    """Open `per_job` streams on each job; returns how many ended cleanly."""
    total = len(job_ids) * per_job
    channels = [grpc.aio.insecure_channel(target) for _ in range(max(1, -(-total // STREAMS_PER_CHANNEL)))]
    ready = 0
    ended = 0

    async def one(index: int, job_id: str) -> None:
        nonlocal ready, ended
        stream = channels[index % len(channels)].unary_stream(WATCH_METHOD)
        request = jobs_pb2.WatchEventsRequest(job_id=job_id).SerializeToString()
        call = stream(request, metadata=METADATA, timeout=timeout)
        first = True
        try:
            async for raw in call:
                at = time.monotonic()
                if first:
                    first = False
                    ready += 1
                    if ready == total:
                        if on_ready is not None:
                            on_ready()
                        Path(ready_path).touch()
                on_message(job_id, raw, at)
            ended += 1
        except asyncio.CancelledError:
            call.cancel()
            raise

    try:
        for channel in channels:
            await asyncio.wait_for(channel.channel_ready(), 30)
        tasks = [asyncio.create_task(one(i, job_id)) for i, job_id in enumerate(job_ids * per_job)]
        if until is None:
            await asyncio.gather(*tasks)
        else:
            try:
                await until()
            finally:
                for task in tasks:
                    task.cancel()
                results = await asyncio.gather(*tasks, return_exceptions=True)
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:
                raise errors[0]
    finally:
        for channel in channels:
            await channel.close()
    return ended


async def watch_live(
    target: str,
    job_ids: list[str],
    per_job: int,
    ready_path: str,
    receipts_path: str,
    timeout: float,
    server_stamps_path: str | None = None,
) -> dict[str, Any]:
    """Follow every job to its end; write `job_id sequence monotonic` per `bench.tick` received.
    With `server_stamps_path`, also write there, per `bench.tick`, the event's `created_at` (the
    server's wall-clock stamp, taken inside the write's transaction) moved onto the monotonic
    clock (minus `clock_offset()`, measured once at the start)."""
    receipts: list[tuple[str, int, float]] = []
    server_stamps: dict[tuple[str, int], float] = {}
    wall_minus_monotonic = clock_offset()
    messages = 0
    cpu_at_ready = time.process_time()

    def on_ready() -> None:
        nonlocal cpu_at_ready
        cpu_at_ready = time.process_time()

    def on_message(job_id: str, raw: bytes, at: float) -> None:
        nonlocal messages
        messages += 1
        event = jobs_pb2.WatchEventsResponse.FromString(raw).event
        if event.type == "bench.tick":
            receipts.append((job_id, event.sequence, at))
            if server_stamps_path is not None:
                server_stamps[(job_id, event.sequence)] = commit_monotonic(event, wall_minus_monotonic)

    ended = await _streams(target, job_ids, per_job, ready_path, timeout, on_message, on_ready=on_ready)
    write_stamps(receipts_path, receipts)
    if server_stamps_path is not None:
        write_stamps(server_stamps_path, ((job, seq, at) for (job, seq), at in server_stamps.items()))
    return {
        "streams": len(job_ids) * per_job,
        "ended": ended,
        "messages": messages,
        "ticks": len(receipts),
        "cpu_seconds": time.process_time() - cpu_at_ready,  # since every stream was ready
    }


async def watch_idle(
    target: str, job_ids: list[str], ready_path: str, stop_path: str, timeout: float
) -> dict[str, Any]:
    """Hold one stream per job open (each gets its replayed events, then nothing) until `stop_path`
    exists."""
    messages = 0

    def on_message(job_id: str, raw: bytes, at: float) -> None:
        nonlocal messages
        messages += 1

    async def until_stopped() -> None:
        async with asyncio.timeout(timeout):
            while not os.path.exists(stop_path):
                await asyncio.sleep(0.1)

    await _streams(target, job_ids, 1, ready_path, timeout + 30, on_message, until_stopped)
    return {"streams": len(job_ids), "messages": messages}


async def follow_feed(
    target: str,
    kind: str,
    jobs: int,
    ready_path: str,
    timeout: float,
    running_path: str | None = None,
    receipts_path: str | None = None,
    server_stamps_path: str | None = None,
) -> dict[str, Any]:
    """Follow the feed from its tail until `jobs` jobs of `kind` have ended. Touches
    `ready_path` once the subscription is known to exist and `running_path` (if given) once
    `jobs` jobs of `kind` have started; writes `bench.tick` receipts and commit stamps as
    `watch_live` does. Returns the messages counted by type, how many positions did not follow
    their predecessor, and the CPU time used from `running_path` on (or from ready)."""
    wall_minus_monotonic = clock_offset()
    receipts: list[tuple[str, int, float]] = []
    server_stamps: list[tuple[str, int, float]] = []
    types: dict[str, int] = {}
    started = ended = gaps = 0
    last_position: int | None = None
    channel = grpc.aio.insecure_channel(target)
    try:
        await asyncio.wait_for(channel.channel_ready(), 30)
        request = jobs_pb2.SubscribeRequest(tail=True).SerializeToString()
        call = channel.unary_stream(SUBSCRIBE_METHOD)(request, metadata=METADATA, timeout=timeout)
        stats = channel.unary_unary(GET_STATS_METHOD)
        await stats(jobs_pb2.GetStatsRequest().SerializeToString(), metadata=METADATA, timeout=30)
        Path(ready_path).touch()
        cpu_from = time.process_time()
        async for raw in call:
            at = time.monotonic()
            message = jobs_pb2.SubscribeResponse.FromString(raw)
            event = message.event
            types[event.type] = types.get(event.type, 0) + 1
            position = int(message.position, 16)
            if last_position is not None and position != last_position + 1:
                gaps += 1
            last_position = position
            if event.type == "bench.tick":
                receipts.append((event.job_id, event.sequence, at))
                server_stamps.append(
                    (event.job_id, event.sequence, commit_monotonic(event, wall_minus_monotonic))
                )
            if message.kind != kind:
                continue
            if event.type == "job.started":
                started += 1
                if started == jobs and running_path is not None:
                    Path(running_path).touch()
                    cpu_from = time.process_time()
            elif event.type in TERMINAL_EVENTS:
                ended += 1
                if ended == jobs:
                    call.cancel()
                    break
    finally:
        await channel.close()
    if receipts_path is not None:
        write_stamps(receipts_path, receipts)
    if server_stamps_path is not None:
        write_stamps(server_stamps_path, server_stamps)
    return {
        "messages": sum(types.values()),
        "types": types,
        "position_gaps": gaps,
        "ended": ended,
        "cpu_seconds": time.process_time() - cpu_from,
    }
