"""The no-op gRPC baseline: `python -m bench.baselines.grpc_noop [--event-loop asyncio|uvloop]`.

A `grpc.aio` server in its own process that does nothing but answer, through a generic handler
(the way Leasehold registers its service), on the very method names Leasehold serves:

* `/leasehold.v1.JobService/Enqueue` returns one pre-serialized EnqueueResponse shaped like
  Leasehold's (a queued job with an id, kind, limits and three timestamps), without reading the
  request;
* `/leasehold.v1.JobService/WatchEvents` yields `--stream-messages` pre-serialized
  WatchEventsResponse messages shaped like a replayed Leasehold log (job id, sequence, type
  `bench.tick`, payload `{"i": n}`, created_at), then ends.

Using the same method names lets the bench point the very same client (bench.load) at either
server. It logs a `server.started` JSON line with its port on stderr, like `leasehold serve`, so
the harness that starts and waits for one (leasehold.testing.ServerProcess) does for the other,
and it stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from collections.abc import AsyncIterator, Sequence

import grpc
from google.protobuf import struct_pb2, timestamp_pb2

from bench.child import loop_factory
from leasehold.v1 import jobs_pb2

SERVICE = "leasehold.v1.JobService"
JOB_ID = "job_" + "5f1c0e8a" * 4


def _now() -> timestamp_pb2.Timestamp:
    stamp = timestamp_pb2.Timestamp()
    stamp.GetCurrentTime()
    return stamp


def enqueue_response() -> bytes:
    """What Leasehold answers to an Enqueue of a fresh job, serialized once."""
    now = _now()
    job = jobs_pb2.Job(
        id=JOB_ID,
        kind="bench.hold",
        status=jobs_pb2.JOB_STATUS_QUEUED,
        attempt=0,
        max_attempts=3,
        timeout_seconds=900,
        available_at=now,
        created_at=now,
        updated_at=now,
    )
    return jobs_pb2.EnqueueResponse(job=job, created=True).SerializeToString()


def watch_responses(count: int) -> list[bytes]:
    """`count` replayed events as Leasehold sends them, serialized once."""
    now = _now()
    messages = []
    for i in range(1, count + 1):
        payload = struct_pb2.Struct()
        payload.update({"i": i})
        event = jobs_pb2.JobEvent(
            job_id=JOB_ID, sequence=i, type="bench.tick", payload=payload, created_at=now
        )
        messages.append(jobs_pb2.WatchEventsResponse(event=event).SerializeToString())
    return messages


async def serve(stream_messages: int) -> None:
    response = enqueue_response()
    stream = watch_responses(stream_messages)

    async def enqueue(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        return response

    async def watch_events(_request: bytes, _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for message in stream:
            yield message

    handlers = {
        "Enqueue": grpc.unary_unary_rpc_method_handler(enqueue),
        "WatchEvents": grpc.unary_stream_rpc_method_handler(watch_events),
    }
    server = grpc.aio.server()
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    record = {"event": "server.started", "port": port, "loop": type(loop).__module__, "at": time.time()}
    sys.stderr.write(json.dumps(record) + "\n")
    sys.stderr.flush()
    try:
        await stop.wait()
    finally:
        await server.stop(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.baselines.grpc_noop", description=__doc__)
    parser.add_argument("--event-loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--stream-messages", type=int, default=10_000)
    options = parser.parse_args(argv)
    with asyncio.Runner(loop_factory=loop_factory(options.event_loop)) as runner:
        runner.run(serve(options.stream_messages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
