"""The gRPC client side of the bench: one load generator and one streaming reader, used against
Leasehold and against the no-op baseline alike, so a ratio compares servers, not clients.

Both speak raw bytes (no request serializer, no response deserializer): the request is serialized
once by the caller and the response is counted, not decoded. The client's own cost per call is
thus as small as grpc.aio allows and identical for both servers; on a two-core machine the client
still takes most of a core, which is why a "no-op limit" is the limit of this client and a no-op
server together on this machine, and why Leasehold is measured against it rather than against a
number from elsewhere.

Each function runs in a child process (`bench.child`) and returns a JSON-able dict.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
from google.protobuf import struct_pb2

from bench.common import METADATA, BenchError
from leasehold.v1 import jobs_pb2

ENQUEUE_METHOD = "/leasehold.v1.JobService/Enqueue"
WATCH_METHOD = "/leasehold.v1.JobService/WatchEvents"
SUBSCRIBE_METHOD = "/leasehold.v1.JobService/Subscribe"
GET_STATS_METHOD = "/leasehold.v1.JobService/GetStats"
CONNECT_TIMEOUT = 30.0
CALL_TIMEOUT = 60.0


def enqueue_request(kind: str, payload: dict[str, Any] | None = None) -> bytes:
    """A serialized EnqueueRequest (no resource id: every call creates a job)."""
    struct = struct_pb2.Struct()
    struct.update(payload or {"n": 1})
    return jobs_pb2.EnqueueRequest(kind=kind, payload=struct).SerializeToString()


async def connect(target: str, own_connection: bool = False) -> grpc.aio.Channel:
    """A ready channel; with `own_connection`, on a TCP connection of its own (gRPC
    otherwise shares one among a process's channels to one target), so that a
    server of several processes on one port gets a choice of process for it."""
    options = [("grpc.use_local_subchannel_pool", 1)] if own_connection else []
    channel = grpc.aio.insecure_channel(target, options=options)
    try:
        await asyncio.wait_for(channel.channel_ready(), CONNECT_TIMEOUT)
    except BaseException:
        await channel.close()
        raise
    return channel


async def closed_loop(
    target: str,
    method: str,
    request_hex: str,
    concurrency: int,
    warmup_seconds: float,
    window_seconds: float,
    connections: int = 1,
) -> dict[str, Any]:
    """Closed loop: `concurrency` callers, each with one call in flight, issue the same unary call
    back to back. The first `warmup_seconds` are not counted (connection set-up, allocator and
    SQLite caches warming); the rate is the calls completed inside the timed window that follows,
    divided by its length. Any failed call fails the measurement. The callers take turns over
    `connections` channels, each on its own TCP connection when there are several."""
    request = bytes.fromhex(request_hex)
    channels = [await connect(target, own_connection=connections > 1) for _ in range(connections)]
    try:
        calls = [channel.unary_unary(method) for channel in channels]
        began = time.monotonic()
        window_start = began + warmup_seconds
        window_end = window_start + window_seconds
        counted = 0
        total = 0

        async def caller(call: grpc.aio.UnaryUnaryMultiCallable) -> None:
            nonlocal counted, total
            while True:
                await call(request, metadata=METADATA, timeout=CALL_TIMEOUT)
                total += 1
                now = time.monotonic()
                if now >= window_end:
                    return
                if now >= window_start:
                    counted += 1

        await asyncio.gather(*(caller(calls[index % connections]) for index in range(concurrency)))
    finally:
        for channel in channels:
            await channel.close()
    return {
        "calls": counted,
        "calls_total": total,
        "seconds": window_seconds,
        "rate": counted / window_seconds,
    }


async def fixed_count(
    target: str, method: str, request_hex: str, concurrency: int, total: int
) -> dict[str, Any]:
    """Closed loop until exactly `total` calls have succeeded. Reports the wall-clock time just
    before the first call was sent (to line up with the server's wall-clock `completed_at`) and
    when the last response arrived."""
    request = bytes.fromhex(request_hex)
    channel = await connect(target)
    try:
        call = channel.unary_unary(method)
        issued = 0
        first_send_wall = time.time()
        began = time.monotonic()

        async def caller() -> None:
            nonlocal issued
            while issued < total:
                issued += 1
                await call(request, metadata=METADATA, timeout=CALL_TIMEOUT)

        await asyncio.gather(*(caller() for _ in range(concurrency)))
        seconds = time.monotonic() - began
        last_ack_wall = time.time()
    finally:
        await channel.close()
    return {
        "calls": issued,
        "first_send_wall": first_send_wall,
        "last_ack_wall": last_ack_wall,
        "enqueue_seconds": seconds,
        "enqueue_rate": issued / seconds,
    }


async def paced_enqueue(target: str, kind: str, count: int, interval: float) -> list[tuple[str, float]]:
    """`count` Enqueues on a fixed schedule (`interval` apart, not `interval` after the previous
    answer), each sent in its own task so a slow answer never delays the next send. Returns
    (job id, time.monotonic() just before the send) per call."""
    request = enqueue_request(kind)
    channel = await connect(target)
    sent: list[tuple[str, float]] = []
    try:
        call = channel.unary_unary(method=ENQUEUE_METHOD)

        async def one(at: float) -> None:
            raw = await call(request, metadata=METADATA, timeout=CALL_TIMEOUT)
            sent.append((jobs_pb2.EnqueueResponse.FromString(raw).job.id, at))

        # one call first, outside the schedule: connection and server code paths warm
        await one(time.monotonic())
        sent.clear()
        start = time.monotonic() + 0.1
        tasks = []
        for i in range(count):
            delay = start + i * interval - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(time.monotonic())))
        await asyncio.gather(*tasks)
    finally:
        await channel.close()
    return sent


async def read_stream(
    target: str, method: str, request_hex: str, warmups: int = 1, limit: int | None = None
) -> dict[str, Any]:
    """Read one server stream to its end, `warmups` times untimed and then once timed; the rate
    is messages over the time from the call to the end of the stream. With `limit`, a read ends
    at its `limit`th message instead (the call is then cancelled): the owner's feed never ends,
    so "to the end" is to the last event it holds."""
    request = bytes.fromhex(request_hex)
    channel = await connect(target)
    try:
        stream = channel.unary_stream(method)

        async def read() -> tuple[int, float]:
            began = time.monotonic()
            count = 0
            call = stream(request, metadata=METADATA, timeout=timeout)
            async for _ in call:
                count += 1
                if count == limit:
                    call.cancel()
                    break
            return count, time.monotonic() - began

        # A long read (a million messages) must not die at the unary calls' deadline.
        timeout = CALL_TIMEOUT if limit is None else max(CALL_TIMEOUT, limit / 1_000)
        for _ in range(warmups):
            await read()
        messages, seconds = await read()
    finally:
        await channel.close()
    if messages == 0:
        raise BenchError("the stream carried no message")
    if limit is not None and messages != limit:
        raise BenchError(f"the stream ended after {messages} of {limit} messages")
    return {"messages": messages, "seconds": seconds, "rate": messages / seconds}


async def enqueue_jobs(target: str, kind: str, payload: dict[str, Any], count: int) -> list[str]:
    """Set-up, not a measurement: enqueue `count` jobs concurrently and return their ids."""
    request = enqueue_request(kind, payload)
    channel = await connect(target)
    try:
        call = channel.unary_unary(ENQUEUE_METHOD)
        answers = await asyncio.gather(
            *(call(request, metadata=METADATA, timeout=CALL_TIMEOUT) for _ in range(count))
        )
    finally:
        await channel.close()
    return [jobs_pb2.EnqueueResponse.FromString(raw).job.id for raw in answers]
