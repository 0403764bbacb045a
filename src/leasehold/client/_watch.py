"""A job's event stream that survives the server: a broken stream (the server was
killed, a proxy dropped it) or a drain (the server ends open streams UNAVAILABLE)
is reopened from the last sequence handed to the caller, so the caller sees every
event exactly once, in order, whichever server answers next."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from leasehold.client._retry import Deadline, sleep_or_give_up
from leasehold.client._session import Session
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL_EVENT_TYPES = frozenset({"job.succeeded", "job.failed", "job.cancelled"})

# A stream cut by a dying server surfaces as UNAVAILABLE; some proxies and a reset
# HTTP/2 stream report INTERNAL or UNKNOWN instead. Only these mean "try again":
# NOT_FOUND, PERMISSION_DENIED and the like end the watch at once.
RESUMABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN})


async def watch_events(
    session: Session, job_id: str, after_sequence: int
) -> AsyncIterator[jobs_pb2.JobEvent]:
    stub = jobs_pb2_grpc.JobServiceStub(session.channel)
    last = after_sequence
    outage: Deadline | None = None
    backoffs = session.retry.backoffs()
    while True:
        request = jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=last)
        call = stub.WatchEvents(request, metadata=session.metadata)
        try:
            async for response in call:
                event = response.event
                outage, backoffs = None, session.retry.backoffs()
                if event.sequence <= last:
                    continue  # never hand the caller an event twice
                last = event.sequence
                yield event
                if event.type in TERMINAL_EVENT_TYPES:
                    return
        except grpc.aio.AioRpcError as error:
            if error.code() not in RESUMABLE:
                raise
            outage = outage or Deadline(session.retry.deadline_seconds)
            if not await sleep_or_give_up(next(backoffs), outage):
                raise
            continue
        finally:
            call.cancel()
        return  # the server ended the stream cleanly: the job had already finished
