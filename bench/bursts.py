"""The client of the burst figures (bench.figures.burst_lag), run in a child process.

It does what a backend that starts a batch and shows its progress does: one process, one
channel, `jobs` Enqueues of `example.sleep {"seconds": s, "steps": n}` with at most
`in_flight` outstanding, and as soon as each Enqueue returns, a WatchEvents stream on that
job, read to its terminal event. Owners take the jobs round-robin (`x-owner-id`
burst-0, burst-1, ...). Nothing subscribes first or waits for the server to settle: the first
jobs run, and report, while later ones are still being enqueued and watched.

A delivery's lag is the receipt time (`time.time()`, taken before decoding) minus the event's
`created_at` (the server's wall-clock stamp, taken inside the write's transaction before its
commit, on the same machine's clock), counted only for events created after their stream's
first message arrived: what a stream replays when it opens is history, not lag.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc

from bench.common import BenchError
from bench.load import CALL_TIMEOUT, ENQUEUE_METHOD, WATCH_METHOD, connect, enqueue_request
from leasehold.v1 import jobs_pb2

OWNER_PREFIX = "burst-"


async def enqueue_and_watch(
    target: str, jobs: int, owners: int, in_flight: int, seconds: float, steps: int, timeout: float
) -> dict[str, Any]:
    """Returns the lags (seconds) of every live delivery, the events each stream got, and this
    process's CPU seconds."""
    channel = await connect(target)
    enqueue = channel.unary_unary(ENQUEUE_METHOD)
    watch = channel.unary_stream(WATCH_METHOD)
    request = enqueue_request("example.sleep", {"seconds": seconds, "steps": steps})
    gate = asyncio.Semaphore(in_flight)
    lags: list[float] = []
    events: list[int] = []
    started = time.process_time()

    async def one(index: int) -> None:
        metadata = (("x-owner-id", f"{OWNER_PREFIX}{index % owners}"),)
        async with gate:
            raw = await enqueue(request, metadata=metadata, timeout=CALL_TIMEOUT)
        job_id = jobs_pb2.EnqueueResponse.FromString(raw).job.id
        call = watch(
            jobs_pb2.WatchEventsRequest(job_id=job_id).SerializeToString(), metadata=metadata, timeout=timeout
        )
        first_at: float | None = None
        count = 0
        last_type = ""
        async for message in call:
            at = time.time()
            event = jobs_pb2.WatchEventsResponse.FromString(message).event
            created = event.created_at.seconds + event.created_at.nanos / 1e9
            if first_at is None:
                first_at = at
            elif created > first_at:
                lags.append(at - created)
            count += 1
            last_type = event.type
        if last_type != "job.succeeded":
            raise BenchError(f"job {job_id} ended its stream with {last_type!r}")
        events.append(count)

    try:
        await asyncio.gather(*(one(index) for index in range(jobs)))
    except grpc.aio.AioRpcError as exc:
        raise BenchError(f"burst client: {exc.code().name}: {exc.details()}") from None
    finally:
        await channel.close()
    return {"lags_s": lags, "events": events, "cpu_s": time.process_time() - started}
