"""The no-op gRPC baseline: `python -m bench.baselines.grpc_noop [--event-loop asyncio|uvloop]`.

A `grpc.aio` server in its own process that does nothing but answer, through a generic handler
(the way Leasehold registers its service), on the very method names Leasehold serves:

* `/leasehold.v1.JobService/Enqueue` returns one pre-serialized EnqueueResponse shaped like
  Leasehold's (a queued job with an id, kind, limits and three timestamps), without reading the
  request;
* `/leasehold.v1.JobService/WatchEvents` yields `--stream-messages` pre-serialized
  WatchEventsResponse messages shaped like a replayed Leasehold log (job id, sequence, type
  `bench.tick`, payload `{"i": n}`, created_at), then ends;
* `/leasehold.v1.JobService/Subscribe` yields as many pre-serialized SubscribeResponse messages
  shaped like the owner's feed the bench seeds (bench.seed.seed_feed: jobs of FEED_EVENTS_PER_JOB
  events each, `job.queued`, `job.started`, `bench.tick`s and `job.succeeded`, with the job's kind
  and resource and a 16-digit position), then ends.

Each stream pre-builds at most CYCLE distinct messages and sends them round and round: a million
would take the server longer to build than its start-up deadline, and sending a list's items
again costs what sending new ones does.

Using the same method names lets the bench point the very same client (bench.load) at either
server. It logs a `server.started` JSON line with its port on stderr, like `leasehold serve`, so
the harness that starts and waits for one (leasehold.testing.ServerProcess) does for the other,
and it stops on SIGINT or SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
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
# The seeded feed's shape (bench.seed.seed_feed), which both sides of the feed replay stream.
FEED_KIND = "bench.noop"
FEED_RESOURCE_TYPE = "bench.record"
FEED_EVENTS_PER_JOB = 5
CYCLE = 10_000


def feed_job_id(n: int) -> str:
    return f"job_{n:032x}"


def feed_resource_id(n: int) -> str:
    return f"record-{n:07d}"


def feed_event(sequence: int, events_per_job: int) -> tuple[str, dict[str, int]]:
    """The type and payload of a seeded job's `sequence`th event: the lifecycle a run leaves,
    with the handler's `bench.tick`s between its start and its end."""
    if sequence == 1:
        return "job.queued", {}
    if sequence == 2:
        return "job.started", {"attempt": 1}
    if sequence == events_per_job:
        return "job.succeeded", {}
    return "bench.tick", {"i": sequence - 2}


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


def feed_responses(count: int) -> list[bytes]:
    """The first `count` messages of the seeded feed (jobs of FEED_EVENTS_PER_JOB events, one
    after the other), serialized once."""
    now = _now()
    messages = []
    for index in range(count):
        n, sequence = divmod(index, FEED_EVENTS_PER_JOB)
        event_type, values = feed_event(sequence + 1, FEED_EVENTS_PER_JOB)
        payload = struct_pb2.Struct()
        payload.update(values)
        event = jobs_pb2.JobEvent(
            job_id=feed_job_id(n), sequence=sequence + 1, type=event_type, payload=payload, created_at=now
        )
        response = jobs_pb2.SubscribeResponse(
            event=event,
            position=f"{index + 1:016x}",
            kind=FEED_KIND,
            resource_type=FEED_RESOURCE_TYPE,
            resource_id=feed_resource_id(n),
        )
        messages.append(response.SerializeToString())
    return messages


async def serve(stream_messages: int) -> None:
    response = enqueue_response()
    stream = watch_responses(min(stream_messages, CYCLE))
    feed = feed_responses(min(stream_messages, CYCLE))

    async def enqueue(_request: bytes, _context: grpc.aio.ServicerContext) -> bytes:
        return response

    async def watch_events(_request: bytes, _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for message in itertools.islice(itertools.cycle(stream), stream_messages):
            yield message

    async def subscribe(_request: bytes, _context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for message in itertools.islice(itertools.cycle(feed), stream_messages):
            yield message

    handlers = {
        "Enqueue": grpc.unary_unary_rpc_method_handler(enqueue),
        "WatchEvents": grpc.unary_stream_rpc_method_handler(watch_events),
        "Subscribe": grpc.unary_stream_rpc_method_handler(subscribe),
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
