"""A job's event stream that survives the server: a broken stream (the server was
killed, a proxy dropped it) or a drain (the server ends open streams UNAVAILABLE)
is reopened from the last sequence handed to the caller, so the caller sees every
event exactly once, in order, whichever server answers next.

Reaching the service at all and getting it back are bounded differently. Before
the watch starts, a Get is retried like any read, within the client's retry
deadline: an address with nothing behind it, or a job that is not the caller's,
fails as any call would. Once the service has answered, a break is a restart or
a drain of a service that exists, and the watch reconnects for as long as the job
runs, unless the caller gave it a deadline of its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from leasehold.client._reconnect import RESUMABLE, Outage, logger
from leasehold.client._session import Session
from leasehold.v1 import jobs_pb2, jobs_pb2_grpc

TERMINAL_EVENT_TYPES = frozenset({"job.succeeded", "job.failed", "job.cancelled"})


async def watch_events(
    session: Session, job_id: str, after_sequence: int, deadline_seconds: float | None
) -> AsyncIterator[jobs_pb2.JobEvent]:
    stub = jobs_pb2_grpc.JobServiceStub(session.channel)
    # Bounded by the client's retry deadline; once it has answered, a break below
    # is a service restarting, waited out until the watch's own deadline.
    await session.read(stub.Get, jobs_pb2.GetRequest(job_id=job_id))
    last = after_sequence
    outage: Outage | None = None
    while True:
        call = stub.WatchEvents(
            jobs_pb2.WatchEventsRequest(job_id=job_id, after_sequence=last), metadata=session.metadata
        )
        try:
            async for response in call:
                event = response.event
                if outage is not None:
                    logger.info("reconnected to %s, resuming after event %d", session.target, last)
                    outage = None
                if event.sequence <= last:
                    continue  # never hand the caller an event twice
                last = event.sequence
                yield event
                if event.type in TERMINAL_EVENT_TYPES:
                    return
        except grpc.aio.AioRpcError as error:
            if error.code() not in RESUMABLE:
                raise
            outage = outage or Outage(session, deadline_seconds)
            if not await outage.wait_to_retry():
                raise
            continue
        finally:
            call.cancel()
        return  # the server ended the stream cleanly: the job had already finished
